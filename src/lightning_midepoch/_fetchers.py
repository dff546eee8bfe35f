"""The ``_DataFetcher`` and ``CombinedLoader`` overrides: hold back a resumed epoch's first iterator, see each fetch.

Stock Lightning creates the train iterator of the first epoch after a resume in ``_FitLoop.setup_data``: before the
sampler epoch is set (so workers prefetch the wrong epoch's order, Lightning issue #21938) and before anything knows
where in the epoch to continue. The fetcher below, while a resume is pending, gives the ``CombinedLoader`` a mode
iterator whose loaders have not started; the epoch loop starts them in ``on_run_start``
(:mod:`lightning_midepoch._loops`).

Every fetch of a training batch is a ``next()`` of the train ``CombinedLoader`` (the fetcher's iterator is the
``CombinedLoader`` itself, in every fetcher and for ``training_step(dataloader_iter)`` too): its override tells the
session where a batch starts.

A checkpoint may also take the next batch early, to fingerprint it (:meth:`_FetchingCombinedLoader.fetch_ahead`): the
training loop's next fetch then returns that batch instead of fetching another.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_midepoch import _compat, _rng
from lightning_midepoch._mixin import stock_reduce

if TYPE_CHECKING:
    from lightning.pytorch.loops.fetchers import _DataFetcher as _DataFetcherBase
    from lightning.pytorch.utilities.combined_loader import CombinedLoader
    from lightning.pytorch.utilities.combined_loader import CombinedLoader as _CombinedLoaderBase

    from lightning_midepoch._session import _Session
else:
    # Lightning's fetchers are Iterators and its CombinedLoader an Iterable: a mixin with the same base keeps the
    # instance layout, so that the object's class can be switched
    _DataFetcherBase, _CombinedLoaderBase = Iterator, Iterable


#: What a fetch ahead found when the iterator was exhausted: the training loop's next fetch ends the epoch.
EXHAUSTED = object()


@dataclass
class States:
    """Reads and sets the random states a fetch in the main process may draw from (see ``_Session.fetch_states``)."""

    read: Callable[[], Any]
    write: Callable[[Any], None]


@dataclass
class Ahead:
    """A batch fetched ahead of the training loop, for its next fetch (see :meth:`_FetchingCombinedLoader.fetch_ahead`).

    Where the fetch drew from the random states the main process loads with (its dataset's augmentation, a sampler
    that draws there), they were set back to ``before``; the training loop's fetch moves them on to ``after``, as its
    own fetch would have, provided nothing else drew from them in between.
    """

    result: Any  # what the CombinedLoader returned: (batch, batch_idx, dataloader_idx), or EXHAUSTED
    states: States
    before: Any = None
    after: Any = None

    def take(self, warn: Callable[[str], None]) -> Any:
        """The training loop's fetch: the batch, with the random states as that fetch would leave them."""
        if self.after is not None:
            if _rng.states_equal(self.states.read(), self.before):
                self.states.write(self.after)
            else:
                warn(
                    "MidEpochResume loaded the next training batch at a checkpoint, to fingerprint it, and loading it"
                    " drew from random generators of the main process. Something else drew from them before the"
                    " training loop fetched that batch, so from here on this run's random draws differ from a run"
                    ' without the callback. Pass `MidEpochResume(verify_batch="off")` to leave every fetch where'
                    " Lightning makes it."
                )
        if self.result is EXHAUSTED:
            raise StopIteration
        return self.result


class _FetchingCombinedLoader(_CombinedLoaderBase):
    """Mixed into the trainer's train ``CombinedLoader`` by :class:`_Session`: the session sees every fetch."""

    _midepoch: _Session
    __reduce_ex__ = stock_reduce

    @override
    def __next__(self) -> Any:
        session = self._midepoch
        session.before_fetch()
        try:
            ahead, session.ahead = session.ahead, None
            if ahead is not None:
                result = ahead.take(session.warn)
            else:
                session.fetching = True
                try:
                    result = super().__next__()
                finally:
                    session.fetching = False
        finally:
            session.after_fetch()
        if session.batch_check.armed:  # the first batch after a resume: compared before the loop trains on it
            session.batch_check.fetched(result[0])
        return result

    def fetch_ahead(self, states: States) -> Ahead:
        """Fetch the next batch now, for the training loop's next fetch to return (see ``_Session.upcoming_batch``).

        The random states a fetch may draw from in the main process (``states``) are read around it and set back if
        it drew from them; the training loop's fetch sets them where this fetch left them.
        """
        session = self._midepoch
        before = states.read()
        session.fetching = True
        result: Any
        try:
            result = super().__next__()
        except StopIteration:
            result = EXHAUSTED
        finally:
            session.fetching = False
        after = states.read()
        if _rng.states_equal(after, before):
            return Ahead(result, states)
        states.write(before)
        return Ahead(result, states, before, after)


class _ResumableDataFetcher(_DataFetcherBase):
    """Mixed into the trainer's train data fetcher (any ``_DataFetcher`` subclass) by :class:`_Session`."""

    _midepoch: _Session
    __reduce_ex__ = stock_reduce

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
