"""Calibration numerics: margins, the noise sweep, exact survival, the logistic fit, target -> sigma."""
