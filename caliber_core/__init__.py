"""Caliber: margin-normalized calibration of logit noise against model extraction."""

__version__ = "0.1.0"
