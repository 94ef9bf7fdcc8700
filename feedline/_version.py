"""The package version, in a module of its own so any layer can read it without cycles."""

__version__ = "0.1.0"
