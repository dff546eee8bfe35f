"""Exact mid-epoch resume for PyTorch Lightning with plain map-style DataLoaders.

Attach :class:`MidEpochResume` to a trainer; a checkpoint taken after any batch then resumes at the next batch of
the same order, with the same random states, as if training had never stopped.
"""

from typing import TYPE_CHECKING, Any

from lightning_midepoch.__about__ import __version__
from lightning_midepoch._sampling import FastForwardable, fast_forward
from lightning_midepoch._state import MidEpochResumeError

if TYPE_CHECKING:
    from lightning_midepoch.callback import MidEpochResume

__all__ = ["FastForwardable", "MidEpochResume", "MidEpochResumeError", "__version__", "fast_forward"]


def __getattr__(name: str) -> Any:
    # Lightning is imported when the callback is first used, not with the package (the CLI needs none of it)
    if name == "MidEpochResume":
        from lightning_midepoch.callback import MidEpochResume

        return MidEpochResume
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
