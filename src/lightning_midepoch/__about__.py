"""The package's version: the one place it is set (``pyproject.toml`` reads it when the package is built)."""

__version__ = "0.2.0"
