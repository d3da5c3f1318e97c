"""The package version (a leaf: importing it imports nothing else)."""

__version__ = "0.1.0"
