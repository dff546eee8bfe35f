"""The ``_DataFetcher`` override: install the order recorders and hold back a resumed epoch's first iterator.

Stock Lightning creates the train iterator of the first epoch after a resume in ``_FitLoop.setup_data``: before the
sampler epoch is set (so workers prefetch the wrong epoch's order, Lightning issue #21938) and before anything knows
where in the epoch to continue. The fetcher below, while a resume is pending, gives the ``CombinedLoader`` a mode
iterator whose loaders have not started; the epoch loop starts them in ``on_run_start``
(:mod:`lightning_midepoch._loops`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_midepoch import _compat
from lightning_midepoch._mixin import stock_reduce

if TYPE_CHECKING:
    from lightning.pytorch.loops.fetchers import _DataFetcher as _DataFetcherBase
    from lightning.pytorch.utilities.combined_loader import CombinedLoader

    from lightning_midepoch._session import _Session
else:
    # Lightning's fetchers are Iterators: a mixin with the same base keeps the instance layout, so that the
    # fetcher's class can be switched
    _DataFetcherBase = Iterator


def _nothing() -> None:
    pass


class _ResumableDataFetcher(_DataFetcherBase):
    """Mixed into the trainer's train data fetcher (any ``_DataFetcher`` subclass) by :class:`_Session`."""

    _midepoch: _Session
    __reduce_ex__ = stock_reduce

    # Lightning calls `_start_profiler` right before every fetch from the loaders (prefetches included): the moment
    # an iterable dataset's own position must be read, so that a checkpoint saves the position of the first batch
    # the loop has not consumed yet, and the states the batch starts from, for a checkpoint written in its middle
    # (the resumed run fetches the batch again); and `_stop_profiler` right after it. Lightning's own callables are
    # kept in attributes of ours, set as plain attributes (not through __dict__, which would take the fetcher's
    # attributes out of line: see _mixin.mixed_copy); what Lightning calls is the session's hook with Lightning's
    # callable bound to it. Both run at every batch: the property reads it with a C getter, and a partial calls it,
    # so that no Python frame of ours runs but the session's. After the fetch the session has work only in a resumed
    # epoch's first fetch: otherwise `_stop_profiler` is Lightning's own callable.
    _midepoch_start_profiler: Callable[[], None] = staticmethod(_nothing)
    _midepoch_stop_profiler: Callable[[], None] = staticmethod(_nothing)
    _midepoch_before_fetch: Callable[[], None] = staticmethod(_nothing)
    _midepoch_after_fetch: Callable[[], None] = staticmethod(_nothing)

    def _midepoch_bind(self) -> None:
        """Bind Lightning's callables to the session's hooks (the session is set first: see ``adopt_fetcher``)."""
        session = self._midepoch
        self._midepoch_before_fetch = partial(session.before_fetch, self._midepoch_start_profiler)
        # after the fetch, only a resumed epoch's first fetch has work: otherwise Lightning's own callable is called
        if session.resumed_pass.lazy_starts:
            self._midepoch_after_fetch = partial(session.after_fetch, self._midepoch_stop_profiler)
        else:
            self._midepoch_after_fetch = self._midepoch_stop_profiler

    def _midepoch_set_start(self, start: Callable[[], None]) -> None:
        self._midepoch_start_profiler = start
        self._midepoch_bind()

    def _midepoch_set_stop(self, stop: Callable[[], None]) -> None:
        self._midepoch_stop_profiler = stop
        self._midepoch_bind()

    _start_profiler = property(attrgetter("_midepoch_before_fetch"), _midepoch_set_start)
    _stop_profiler = property(attrgetter("_midepoch_after_fetch"), _midepoch_set_stop)

    def _midepoch_stock_state(self) -> dict[str, Any]:
        state = {name: value for name, value in vars(self).items() if not name.startswith("_midepoch")}
        for name in ("_start_profiler", "_stop_profiler"):
            if f"_midepoch{name}" in vars(self):
                state[name] = vars(self)[f"_midepoch{name}"]
        return state

    @override
    def setup(self, combined_loader: CombinedLoader) -> None:
        super().setup(combined_loader)
        _compat.check_fetcher(self)
        self._midepoch.attach(combined_loader)

    @override
    def __iter__(self) -> Any:
        session = self._midepoch
        if session.iterator_started:
            # the stock epoch loop's iter() right after the resumed epoch's iterator was started: keep that one
            return self
        if session.hold_next_iter:
            # the first iterator after a resume: started by the epoch loop once it knows where the epoch continues
            session.hold_next_iter = False
            session.iterator_held = True
            _compat.hold_combined_iterator(self.combined_loader)
            self.iterator = None
            self.reset()
            return self
        session.start_epoch()
        session.starting_iterator = True
        try:
            return super().__iter__()
        finally:
            session.starting_iterator = False
