"""Record what determines a train loader's order as it is drawn, and replay it part-way through.

A DataLoader draws its order from its index sampler (the batch sampler, or the sampler when ``batch_size=None``).
:class:`_IndexSamplerRecorder` stands in for that object on one DataLoader. Each time the loader starts a pass it
captures the random states the sampler is about to draw from, at the two moments a sampler can draw: at ``iter()``
(samplers whose ``__iter__`` draws eagerly) and at the first ``next()`` (generator-based samplers, such as
torch's ``RandomSampler`` and ``BatchSampler``). Capturing reads states only; nothing is drawn, so a run that is
never resumed is unchanged.

On resume the recorder is armed with the recorded pass and the number of consumed items; the next pass then
re-creates the same order with those states applied (the process-wide ones in isolation), skips the consumed items
at the index level (:func:`~lightning_midepoch._sampling.fast_forward`) and continues from there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import Any

from lightning_midepoch import _rng
from lightning_midepoch._sampling import fast_forward

_SENTINEL = object()
_second = itemgetter(1)


@dataclass
class _PassRecord:
    """The random states one pass of a loader's index sampler drew its order from."""

    epoch: int
    index: int  # how many times the loader was restarted inside this epoch before this pass (a cycling loader)
    at_iter: dict[str, Any]
    at_first_next: dict[str, Any] | None = None
    # how far the loader has taken this pass: items yielded, and whether it asked past the end (a sampler may draw
    # there, as RandomSampler does); None in a record saved by a version that did not count
    pulled: int | None = 0
    exhausted: bool | None = False
    # a loader with workers: the states at the iter() call that started its DataLoader iterator, before that drew
    # the workers' base seed (only what differs from at_iter); a resumed iterator draws the same base seed from them
    at_start: dict[str, Any] | None = None
    # while the pass is taken: counts the items (`pulled` is read from it, see `count`)
    _counter: enumerate[Any] | None = field(default=None, repr=False, compare=False)

    def count(self, iterator: Iterator[Any]) -> enumerate[Any]:
        """Count the pass from its start: ``iterator``'s items numbered from 1 (:attr:`pulled` is read from them)."""
        self.pulled, self.exhausted = 0, False
        self._counter = enumerate(iterator, 1)
        return self._counter

    def count_from(self, pulled: int) -> None:
        """Count the pass in :attr:`pulled` itself, from item ``pulled`` on (any earlier count is dropped)."""
        self.pulled, self.exhausted, self._counter = pulled, False, None

    def _taken(self) -> int | None:
        """Items the loader has taken from this pass so far (``pulled``, read from the count while there is one)."""
        if self._counter is None:
            return self.pulled
        # (the count's next number, kept by enumerate and read through its pickling support, minus its start)
        return int(self._counter.__reduce__()[1][1]) - 1

    def capture_first_next(self, rng_objects: dict[str, Any]) -> None:
        """Record the states at the pass's first next(), storing only what changed since iter()."""
        now = _capture(rng_objects)
        self.at_first_next = {part: _rng.changed(now[part], self.at_iter[part]) for part in now}

    def first_next_states(self) -> dict[str, Any]:
        """The full states at the pass's first next()."""
        assert self.at_first_next is not None
        return {part: {**self.at_iter[part], **self.at_first_next[part]} for part in self.at_iter}

    def start_states(self) -> dict[str, Any]:
        """The full states before the DataLoader iterator drew its workers' base seed."""
        assert self.at_start is not None
        return {part: {**self.at_iter[part], **self.at_start[part]} for part in self.at_iter}

    def state_dict(self) -> dict[str, Any]:
        state = {
            "epoch": self.epoch,
            "index": self.index,
            "at_iter": self.at_iter,
            "at_first_next": self.at_first_next,
            "pulled": self._taken(),
            "exhausted": self.exhausted,
        }
        if self.at_start is not None:
            state["at_start"] = self.at_start
        return state

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> _PassRecord:
        return cls(
            state["epoch"],
            state["index"],
            state["at_iter"],
            state.get("at_first_next"),
            state.get("pulled"),
            state.get("exhausted"),
            state.get("at_start"),
        )


@dataclass
class _Replay:
    """What the next pass of a loader does after a resume (kept until the epoch loop has built its iterator)."""

    record: _PassRecord | None  # the pass to replay; None: nothing recorded, the order is drawn afresh
    skip: int  # items of this pass consumed before the checkpoint
    index: int  # the pass's index within the epoch
    live: bool = False  # draw from the live states (a new epoch), only keeping them still across iter() calls
    at_iter: dict[str, Any] | None = None  # with no record: the states at the first iter() call
    batches: list[Any] | None = None  # the pass's items, given (an epoch finished on another number of devices)
    # the states of the loader's own generators at the checkpoint, set when the replayed pass reaches the position
    # the loader had taken it to then (see _IndexSamplerRecorder._resume); `restored` says the pass took them
    generators: dict[str, Any] | None = None
    restored: bool = False
    new_workers: bool = False  # the pass starts a new DataLoader iterator with workers (two iter() calls)
    calls: int = 0  # iter() calls so far


def _capture(rng_objects: dict[str, Any]) -> dict[str, Any]:
    return {"global": _rng.capture_global(), "objects": _rng.capture_objects(rng_objects)}


def _apply(rng_objects: dict[str, Any], state: dict[str, Any]) -> None:
    _rng.restore_global(state["global"])
    _rng.restore_objects(rng_objects, state["objects"])


class _IndexSamplerRecorder:
    """A transparent stand-in for a DataLoader's index sampler that records and replays its order.

    Attribute access, ``len()`` and ``isinstance`` are forwarded to the wrapped sampler.
    """

    __slots__ = (
        "_midepoch_drawn",
        "_midepoch_epoch_fn",
        "_midepoch_inner",
        "_midepoch_observing",
        "_midepoch_rng_objects",
        "_replay",
        "on_outside",
        "on_pass",
        "passes",
        "record",
    )
    _midepoch_inner: Any
    _midepoch_rng_objects: dict[str, Any]
    _midepoch_epoch_fn: Callable[[], int]
    _midepoch_observing: Callable[[], bool]
    _midepoch_drawn: Callable[[], None] | None
    record: _PassRecord | None
    passes: int
    _replay: _Replay | None
    on_pass: Callable[[int, Any], list[Any]] | None
    on_outside: Callable[[], None] | None

    def __init__(
        self,
        inner: Any,
        rng_objects: dict[str, Any],
        epoch_fn: Callable[[], int],
        observing: Callable[[], bool] = lambda: True,
        drawn: Callable[[], None] | None = None,
    ) -> None:
        object.__setattr__(self, "_midepoch_inner", inner)
        object.__setattr__(self, "_midepoch_rng_objects", rng_objects)
        object.__setattr__(self, "_midepoch_epoch_fn", epoch_fn)
        object.__setattr__(self, "_midepoch_observing", observing)  # only the training loop's passes are recorded
        object.__setattr__(self, "_midepoch_drawn", drawn)  # called as a recorded pass yields its first item
        object.__setattr__(self, "record", None)  # the current pass
        object.__setattr__(self, "passes", 0)  # passes started since the epoch's loader iterator was created
        object.__setattr__(self, "_replay", None)
        # called at the first next() of each pass with the items it skips and its first item; returns the items to
        # yield before it (the worker recording of _workers numbers the passes there and shifts a resumed pass's
        # rotation with items whose results are dropped)
        object.__setattr__(self, "on_pass", None)
        object.__setattr__(self, "on_outside", None)  # called when a pass starts outside the training loop

    @property
    def inner(self) -> Any:
        """The wrapped sampler."""
        return self._midepoch_inner

    @property
    def rng_objects(self) -> dict[str, Any]:
        """The generators owned by the loader and its samplers, by path."""
        return self._midepoch_rng_objects

    @property  # type: ignore[misc]
    def __class__(self) -> type[Any]:  # isinstance() sees the wrapped sampler's class
        return type(self._midepoch_inner)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_midepoch") or name in _IndexSamplerRecorder.__slots__:
            raise AttributeError(name)
        return getattr(self._midepoch_inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _IndexSamplerRecorder.__slots__:
            object.__setattr__(self, name, value)
        else:
            setattr(self._midepoch_inner, name, value)

    def __len__(self) -> int:
        return len(self._midepoch_inner)

    def __repr__(self) -> str:
        return repr(self._midepoch_inner)  # what users print is their own sampler

    def __reduce_ex__(self, protocol: Any) -> Any:
        # a loader pickled or copied during fit carries the user's own sampler, not the recorder (nor the trainer)
        return self._midepoch_inner.__reduce_ex__(protocol)

    def start_epoch(self) -> None:
        """Called when the epoch's loader iterator is (re)created: the next pass is the epoch's first."""
        self.passes = 0

    def arm(self, replay: _Replay) -> None:
        """Make the passes started until :meth:`disarm` replay ``replay`` (see :class:`_Replay`)."""
        self._replay = replay

    def disarm(self) -> None:
        self._replay = None

    def __iter__(self) -> Iterator[Any]:
        replay = self._replay
        if replay is None and not self._midepoch_observing():
            if self.on_outside is not None:
                self.on_outside()
            return iter(self._midepoch_inner)  # iterated outside the training loop: not the epoch's order
        if replay is None:
            previous = self.record
            record = _PassRecord(self._midepoch_epoch_fn(), self.passes, _capture(self._midepoch_rng_objects))
            if self.on_pass is not None and previous is not None and previous.at_first_next is None:
                # the call before, never advanced, was the first of a new iterator's two (see the armed path below)
                record.at_start = {
                    part: _rng.changed(previous.at_iter[part], record.at_iter[part]) for part in record.at_iter
                }
            self.record = record
            return self._numbered(self._observe(iter(self._midepoch_inner), record), 0)
        if replay.batches is not None:
            # (its position is not counted: the loader's generators are restored once the iterator is built)
            self.record = _PassRecord(
                self._midepoch_epoch_fn(), replay.index, _capture(self._midepoch_rng_objects), None, None, None
            )
            return self._numbered(iter(list(replay.batches)), 0)
        # Armed after a resume. A DataLoader iterator with workers calls iter() twice (the first result is dropped)
        # and draws its worker base seed in between: every call starts from the same states, so the pass that is
        # used draws from exactly the states the original pass drew from.
        if replay.record is not None:
            record = replay.record  # a later checkpoint in this epoch must save the same record
        else:
            if replay.at_iter is None:
                replay.at_iter = _capture(self._midepoch_rng_objects)
            record = _PassRecord(self._midepoch_epoch_fn(), replay.index, replay.at_iter)
        self.record, self.passes = record, replay.index
        # eager samplers draw inside fast_forward(). The process-wide states are left applied on purpose: the
        # DataLoader iterator draws its worker base seed next, as the original did; the epoch loop restores the
        # live states once every iterator is built.
        first_of_new_iterator = replay.new_workers and replay.calls == 0 and record.at_start is not None
        replay.calls += 1
        _apply(self._midepoch_rng_objects, record.start_states() if first_of_new_iterator else record.at_iter)
        iterator = fast_forward(self._midepoch_inner, replay.skip)
        if replay.live or (record.at_first_next is None and replay.record is not None):
            # a new epoch, or a recorded pass that had not drawn yet when the checkpoint was written: draw now
            return self._numbered(self._observe(iterator, record), replay.skip)
        target = None
        pulled, exhausted = record.pulled or 0, bool(record.exhausted)
        # (a record that did not count, or a loader that had taken no more than the skipped items, is left to the
        # session, which sets them once the pass is built: without workers, before anything else is taken)
        counted = record.pulled is not None and record.exhausted is not None
        if replay.generators is not None and counted and (pulled > replay.skip or exhausted):
            target = (pulled, exhausted, replay.generators)
            replay.restored = True
        return self._numbered(self._resume(iterator, record, replay.skip, target), replay.skip)

    def _numbered(self, iterator: Iterator[Any], skip: int) -> Iterator[Any]:
        on_pass = self.on_pass
        if on_pass is None:
            return iterator
        return chain.from_iterable(self._announced(iterator, skip, on_pass))

    @staticmethod
    def _announced(
        iterator: Iterator[Any], skip: int, on_pass: Callable[[int, Any], list[Any]]
    ) -> Iterator[Iterable[Any]]:
        # a generator: this body runs at the first next(), once the DataLoader iterator has started its workers
        first = next(iterator, _SENTINEL)
        if first is _SENTINEL:
            on_pass(skip, None)
            return
        yield on_pass(skip, first)
        yield (first,)
        yield iterator

    def _observe(self, iterator: Iterator[Any], record: _PassRecord) -> Iterator[Any]:
        # Lightning takes an item at every batch: past the pass's first item, nothing of ours runs per item. The
        # items after the first pass through C iterators (chain, map, enumerate), which count them.
        return chain.from_iterable(self._observed_parts(iterator, record))

    def _observed_parts(self, iterator: Iterator[Any], record: _PassRecord) -> Iterator[Iterable[Any]]:
        # a generator: this body runs at the first next(), when generator-based samplers draw
        record.capture_first_next(self._midepoch_rng_objects)
        record.index, self.passes = self.passes, self.passes + 1
        counted = record.count(iterator)
        first: tuple[int, Any] | None = next(counted, None)
        if first is not None:
            if self._midepoch_drawn is not None:  # the order is drawn; nothing of the pass is loaded yet
                self._midepoch_drawn()
            yield (first[1],)
            yield map(_second, counted)
        record.exhausted = True

    def _resume(
        self, iterator: Iterator[Any], record: _PassRecord, skip: int, target: tuple[int, bool, dict[str, Any]] | None
    ) -> Iterator[Any]:
        # a generator: this body runs at the first next(). The order was drawn long before the checkpoint: draw it
        # again (and consume the skipped items) in isolation, so that resuming never draws from the live states.
        #
        # The loader's own generators are set to their checkpoint states when this pass reaches the position the
        # loader had taken the original pass to at the checkpoint (`target`): workers and Lightning fetch ahead, and
        # a sampler can draw while it is taken further (RandomSampler draws again when asked past its end), so
        # setting them at any other position would count such a draw twice, or not at all.
        record.index, self.passes = self.passes, self.passes + 1
        pulled, exhausted, states = target if target is not None else (-1, False, {})
        with _rng.isolated_global():
            if record.at_first_next is None:
                record.capture_first_next(self._midepoch_rng_objects)
            else:
                _apply(self._midepoch_rng_objects, record.first_next_states())
            first = next(iterator, _SENTINEL)
        record.count_from(skip)
        if first is _SENTINEL:
            record.exhausted = True
            if exhausted:
                _rng.restore_objects(self._midepoch_rng_objects, states)
            return
        record.pulled = skip + 1
        yield first
        yield from _positions(iterator, record, pulled, exhausted, states, self._midepoch_rng_objects)


def _positions(
    iterator: Iterator[Any],
    record: _PassRecord,
    pulled: int,
    exhausted: bool,
    states: dict[str, Any],
    rng_objects: dict[str, Any],
) -> Iterator[Any]:
    """The rest of a resumed pass, counting its position and setting ``states`` once it reaches the target."""
    while True:
        if record.pulled == pulled and not exhausted:
            _rng.restore_objects(rng_objects, states)
        item = next(iterator, _SENTINEL)
        if item is _SENTINEL:
            break
        assert record.pulled is not None
        record.pulled += 1
        yield item
    record.exhausted = True
    if exhausted:
        _rng.restore_objects(rng_objects, states)
