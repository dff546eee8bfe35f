"""Package metadata."""

__version__ = "0.1.0"
__author__ = "lightning-midepoch developers"
__license__ = "Apache-2.0"
__docs__ = "Exact mid-epoch resume for PyTorch Lightning with plain map-style DataLoaders."
