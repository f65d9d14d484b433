"""Simulation: the averaging attack and synthetic logits for large-K checks."""
