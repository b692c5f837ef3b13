"""The package version, kept in this one place (setup.py reads it)."""

__version__ = "0.1.0.dev0"
