"""The ``_DataFetcher`` and ``CombinedLoader`` overrides: hold back a resumed epoch's first iterator, see each fetch.

Stock Lightning creates the train iterator of the first epoch after a resume in ``_FitLoop.setup_data``: before the
sampler epoch is set (so workers prefetch the wrong epoch's order, Lightning issue #21938) and before anything knows
where in the epoch to continue. The fetcher below, while a resume is pending, gives the ``CombinedLoader`` a mode
iterator whose loaders have not started; the epoch loop starts them in ``on_run_start``
(:mod:`lightning_midepoch._loops`).

Every fetch of a training batch is a ``next()`` of the train ``CombinedLoader`` (the fetcher's iterator is the
``CombinedLoader`` itself, in every fetcher and for ``training_step(dataloader_iter)`` too): its override tells the
session where a batch starts, and the session keeps a reference to the batch (the batch check fingerprints the last
one when a checkpoint is written). A resumed iterator, once created, first loads the last batch trained before the
checkpoint again, for the batch check (:mod:`lightning_midepoch._batch_check`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_midepoch import _compat
from lightning_midepoch._mixin import stock_reduce

if TYPE_CHECKING:
    from lightning.pytorch.loops.fetchers import _DataFetcher as _DataFetcherBase
    from lightning.pytorch.utilities.combined_loader import CombinedLoader
    from lightning.pytorch.utilities.combined_loader import CombinedLoader as _CombinedLoaderBase

    from lightning_midepoch._recording import Recording
else:
    # Lightning's fetchers are Iterators and its CombinedLoader an Iterable: a mixin with the same base keeps the
    # instance layout, so that the object's class can be switched
    _DataFetcherBase, _CombinedLoaderBase = Iterator, Iterable


class _FetchingCombinedLoader(_CombinedLoaderBase):
    """Mixed into the trainer's train ``CombinedLoader`` by :class:`_ResumableDataFetcher`: every fetch is seen."""

    _midepoch: Recording
    __reduce_ex__ = stock_reduce

    @override
    def __iter__(self) -> Any:
        iterator = super().__iter__()
        batch_check = self._midepoch.batch_check
        if batch_check.pending is not None:
            # a resumed iterator, started one batch early: that batch is loaded again, compared and dropped here,
            # before any fetcher fetches from it
            batch_check.refetch(lambda: self.__next__()[0])
        return iterator

    @override
    def __next__(self) -> Any:
        recording = self._midepoch
        ctx = recording.ctx
        recording.before_fetch()
        ctx.fetching = True
        try:
            result = super().__next__()
        finally:
            ctx.fetching = False
            recording.after_fetch()
        # (references: fingerprinted only if a checkpoint is written after the batch; the one before is the last
        # trained where Lightning holds a batch ahead)
        ctx.previous_batch, ctx.last_batch = ctx.last_batch, result[0]
        return result


class _ResumableDataFetcher(_DataFetcherBase):
    """Mixed into (a copy of) the trainer's train data fetcher, any ``_DataFetcher`` subclass, by the fit loop's."""

    _midepoch: Recording
    __reduce_ex__ = stock_reduce

    @override
    def setup(self, combined_loader: CombinedLoader) -> None:
        super().setup(combined_loader)
        _compat.check_fetcher(self)
        recording = self._midepoch
        recording.ctx.mix(combined_loader, _FetchingCombinedLoader, recording)
        recording.attach(combined_loader)

    @override
    def __iter__(self) -> Any:
        recording = self._midepoch
        ctx = recording.ctx
        if ctx.iterator_started:
            # the stock epoch loop's iter() right after the resumed epoch's iterator was started: keep that one
            return self
        if ctx.hold_next_iter:
            # the first iterator after a resume: started by the epoch loop once it knows where the epoch continues
            ctx.hold_next_iter = False
            ctx.iterator_held = True
            _compat.hold_combined_iterator(self.combined_loader)
            self.iterator = None
            self.reset()
            return self
        recording.start_epoch()
        ctx.starting_iterator = True
        try:
            return super().__iter__()
        finally:
            ctx.starting_iterator = False
