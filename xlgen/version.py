"""The xlgen version (its own module so that modules inside xlgen read it without importing the package)."""

__version__ = "0.1.0"
