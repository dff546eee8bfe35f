"""What a resume gives loaders that keep their own position for one pass only: the resumed pass's quirks.

A stateful loader or an iterable dataset given a saved position must continue from it in the resumed pass and
start the passes after it as the uninterrupted run did; and a loader whose iterator starts lazily, at its first
``next()``, draws its base seed there, which after a resume is inside the epoch. :class:`ResumedPass` holds both.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import torch

from lightning_midepoch import _compat, _datalibs, _rng
from lightning_midepoch import _state as S

if TYPE_CHECKING:
    from lightning_midepoch._shared import Shared


class ResumedPass:
    """The loaders given a position for the resumed pass, and those that start their iterator at its first batch."""

    def __init__(self, ctx: Shared) -> None:
        self.ctx = ctx
        # datasets and loaders given a saved position for the resumed pass only (forgotten when the next one starts)
        self.one_pass_positions: list[Any] = []
        # the first fetch after a mid-epoch resume, where a loader that starts its iterator lazily draws a base seed
        self.lazy_starts: list[int] = []
        self._before_first_fetch: torch.Tensor | None = None

    def positions_given(self) -> None:
        """The resumed pass started: whatever may have been given a saved position keeps it for this pass only.

        That is every loader and dataset but the map-style ones.
        """
        self.one_pass_positions = [
            obj
            for loader in self.ctx.loaders
            for obj in (loader, getattr(loader, "dataset", None))
            if S.loader_kind(loader) != S.KIND_MAP and obj is not None
        ]

    def starts_mid_epoch(self) -> None:
        """The resumed pass's first fetch is inside the epoch: watch the loaders whose iterator starts there."""
        self.lazy_starts = [
            index
            for index, loader in enumerate(self.ctx.loaders)
            if S.loader_kind(loader) == S.KIND_STATEFUL and inspect.isgeneratorfunction(type(loader).__iter__)
        ]

    def epoch_started(self) -> None:
        """A new train iterator: its passes start afresh, and its start draws as in the uninterrupted run."""
        for restored in self.one_pass_positions:
            _datalibs.forget_restored_position(restored)
        self.one_pass_positions = []
        self.lazy_starts = []

    def before_fetch(self) -> None:
        if self.lazy_starts:
            self._before_first_fetch = torch.get_rng_state()

    def after_fetch(self) -> None:
        if self.lazy_starts:
            self._undo_lazy_seed_draw()

    def _undo_lazy_seed_draw(self) -> None:
        """After the first fetch of a resumed epoch from a loader whose iterator starts at its first ``next()``.

        Such a loader (litdata's ``StreamingDataLoader``: its ``__iter__`` is a generator) creates its DataLoader
        iterator, which draws a base seed from torch's global generator, at its first batch: at the epoch's start in
        the uninterrupted run, here at the batch the epoch continues with, where that run drew nothing. The draw is
        taken back when it is all that the fetch drew; otherwise the draws cannot be told apart, which is said.
        """
        loaders, before = self.lazy_starts, self._before_first_fetch
        self.lazy_starts, self._before_first_fetch = [], None
        if before is None:  # pragma: no cover - a fetch always starts before it ends
            return
        after = torch.get_rng_state()
        if torch.equal(after, _rng.after_seed_draw(before)):
            torch.set_rng_state(before)
        elif not torch.equal(after, before):  # (a loader with its own `generator` draws nothing from the global one)
            ctx = self.ctx
            _compat.warn(
                f"Train dataloader {loaders[0]} ({type(ctx.loaders[loaders[0]]).__name__}) starts its iterator at"
                " its first batch, which after this resume is inside the epoch, and that first fetch drew from"
                " torch's global random generator beyond the iterator's base seed (the dataset, in the main process):"
                " the random draws that follow differ from the uninterrupted run's. Load with num_workers > 0 or"
                " draw from generators of the dataset's own to resume exactly.",
                ctx.trainer,
                ctx.warned,
            )
