"""Serving: adding calibrated noise to the logits returned to a flagged account (numpy, torch on demand)."""
