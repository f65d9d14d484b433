"""The package's version: one constant that importing pulls nothing else in with."""

__version__ = "0.1.0"
