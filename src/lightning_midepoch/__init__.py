"""Exact mid-epoch resume for PyTorch Lightning with plain map-style DataLoaders.

Attach :class:`MidEpochResume` to a trainer; a checkpoint taken after any batch then resumes at the next batch of
the same order, with the same random states, as if training had never stopped.
"""

from lightning_midepoch.__about__ import __version__
from lightning_midepoch._sampling import FastForwardable, fast_forward
from lightning_midepoch._state import MidEpochResumeError
from lightning_midepoch.callback import MidEpochResume

__all__ = ["FastForwardable", "MidEpochResume", "MidEpochResumeError", "__version__", "fast_forward"]
