"""Fast-forward samplers and batch samplers past consumed items, touching indices only.

:func:`fast_forward` returns what ``itertools.islice(iter(sampler), start, None)`` would yield, drawing exactly the
same randomness from the same generators at the same moments (``iter()`` for samplers that draw eagerly, the first
``next()`` for generator-based ones). For the torch samplers whose order can be sliced it does so without stepping
through the skipped items one by one; any other sampler is skipped index by index, never loading data; a sampler
can provide its own fast path by implementing :class:`FastForwardable`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, TypeVar, cast, runtime_checkable

import torch
from torch.utils.data import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

_T = TypeVar("_T")
_T_co = TypeVar("_T_co", covariant=True)

# the number of indices RandomSampler draws at a time when sampling with replacement
_REPLACEMENT_CHUNK = 32


@runtime_checkable
class FastForwardable(Protocol[_T_co]):
    """A sampler or batch sampler that can start its iteration part-way through.

    ``iter_from(start)`` must return an iterator over ``list(iter(self))[start:]`` that draws the same random
    numbers from the same generators as ``iter(self)`` followed by ``start`` calls to ``next()``, so that the
    generators end in the same state. Return a generator (draw lazily) if your ``__iter__`` is a generator.

    Example:
        >>> class EveryOther:
        ...     def __init__(self, n: int) -> None:
        ...         self.n = n
        ...     def __len__(self) -> int:
        ...         return self.n // 2
        ...     def __iter__(self):
        ...         return iter(range(0, self.n, 2))
        ...     def iter_from(self, start: int):
        ...         return iter(range(2 * start, self.n, 2))
        >>> list(fast_forward(EveryOther(10), 3))
        [6, 8]

    """

    def iter_from(self, start: int) -> Iterator[_T_co]: ...


def _has_stock_iter(obj: Any, cls: type) -> bool:
    """Whether ``obj`` iterates exactly like ``cls`` (it may be a subclass that does not override ``__iter__``)."""
    return isinstance(obj, cls) and getattr(type(obj), "__iter__", None) is getattr(cls, "__iter__", None)


def _sequential_from(sampler: SequentialSampler, start: int) -> Iterator[int]:
    return iter(range(start, len(sampler.data_source)))


def _random_generator(sampler: RandomSampler) -> torch.Generator:
    # the same draws as RandomSampler.__iter__: one int64 from the global generator when it has none of its own
    if sampler.generator is not None:
        return cast(torch.Generator, sampler.generator)
    seed = int(torch.empty((), dtype=torch.int64).random_().item())
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


def _random_from(sampler: RandomSampler, start: int) -> Iterator[int]:
    n = len(sampler.data_source)
    num_samples = sampler.num_samples
    generator = _random_generator(sampler)
    if sampler.replacement:
        # whole chunks are drawn in one call: the CPU generator fills them element by element, in order
        skipped_chunks = min(start, num_samples) // _REPLACEMENT_CHUNK
        if skipped_chunks:
            torch.randint(high=n, size=(skipped_chunks * _REPLACEMENT_CHUNK,), dtype=torch.int64, generator=generator)
        offset = start - skipped_chunks * _REPLACEMENT_CHUNK
        remaining = num_samples - skipped_chunks * _REPLACEMENT_CHUNK
        full, last = divmod(remaining, _REPLACEMENT_CHUNK)
        for size in [_REPLACEMENT_CHUNK] * full + [last]:
            chunk = torch.randint(high=n, size=(size,), dtype=torch.int64, generator=generator)
            if offset >= size:
                offset -= size
                continue
            yield from chunk[offset:].tolist()
            offset = 0
        return
    offset = start
    sizes = [n] * (num_samples // n) + [num_samples % n]
    for size in sizes:
        permutation = torch.randperm(n, generator=generator)
        if offset >= size:
            offset -= size
            continue
        yield from permutation[offset:size].tolist()
        offset = 0


def _subset_random_from(sampler: SubsetRandomSampler, start: int) -> Iterator[int]:
    permutation = torch.randperm(len(sampler.indices), generator=sampler.generator)
    indices = sampler.indices
    for i in permutation[start:].tolist():
        yield indices[i]


def _weighted_random_from(sampler: WeightedRandomSampler, start: int) -> Iterator[int]:
    drawn = torch.multinomial(sampler.weights, sampler.num_samples, sampler.replacement, generator=sampler.generator)
    yield from drawn[start:].tolist()


def _distributed_from(sampler: DistributedSampler[Any], start: int) -> Iterator[int]:
    # eager, like DistributedSampler.__iter__: the order depends only on seed, epoch, rank and world size
    n = len(sampler.dataset)  # type: ignore[arg-type]
    if sampler.shuffle:
        generator = torch.Generator()
        generator.manual_seed(sampler.seed + sampler.epoch)
        indices = torch.randperm(n, generator=generator)
    else:
        indices = torch.arange(n)
    if sampler.drop_last:
        indices = indices[: sampler.total_size]
    else:
        padding = sampler.total_size - n
        if padding > 0:
            indices = torch.cat([indices, indices.repeat(math.ceil(padding / n))[:padding]])
    indices = indices[sampler.rank : sampler.total_size : sampler.num_replicas]
    return iter(indices[start:].tolist())


def _batch_from(batch_sampler: BatchSampler, start: int) -> Iterator[list[int]]:
    # a generator, like BatchSampler.__iter__: the wrapped sampler is started at the first next()
    indices = fast_forward(batch_sampler.sampler, start * batch_sampler.batch_size)
    size = batch_sampler.batch_size
    if batch_sampler.drop_last:
        for full in zip(*[indices] * size, strict=False):  # (groups of `size`; a short rest dropped)
            yield [*full]
        return
    batch = [*itertools.islice(indices, size)]
    while batch:
        yield batch
        batch = [*itertools.islice(indices, size)]


_FastPath = Callable[[Any, int], Iterator[Any]]

#: The torch samplers with an exact fast path, checked in order (subclasses that override ``__iter__`` are excluded).
_FAST_PATHS: tuple[tuple[type, _FastPath], ...] = (
    (BatchSampler, _batch_from),
    (RandomSampler, _random_from),
    (SequentialSampler, _sequential_from),
    (DistributedSampler, _distributed_from),
    (SubsetRandomSampler, _subset_random_from),
    (WeightedRandomSampler, _weighted_random_from),
)


def _fast_path(sampler: object) -> _FastPath | None:
    for cls, path in _FAST_PATHS:
        if _has_stock_iter(sampler, cls):
            return path if _verified(cls) else None
    return None


_VERIFIED: dict[type, bool] = {}


def _reference_samplers(cls: type, generator: torch.Generator) -> list[Iterable[Any]]:
    """Small instances of ``cls`` covering its branches, drawing from ``generator``."""
    data = range(23)
    if cls is BatchSampler:
        return [
            BatchSampler(RandomSampler(data, generator=generator), batch_size=4, drop_last=False),
            BatchSampler(SequentialSampler(data), batch_size=4, drop_last=True),
        ]
    if cls is RandomSampler:
        return [
            RandomSampler(data, generator=generator),
            RandomSampler(data, num_samples=50, generator=generator),
            RandomSampler(data, replacement=True, num_samples=150, generator=generator),
        ]
    if cls is SequentialSampler:
        return [SequentialSampler(data)]
    if cls is DistributedSampler:
        samplers: list[DistributedSampler[Any]] = [
            DistributedSampler(data, num_replicas=3, rank=1, shuffle=shuffle, drop_last=drop_last, seed=7)  # type: ignore[arg-type]
            for shuffle in (True, False)
            for drop_last in (True, False)
        ]
        samplers.append(DistributedSampler(range(2), num_replicas=5, rank=4, seed=7))  # type: ignore[arg-type]
        for sampler in samplers:
            sampler.set_epoch(2)
        return list(samplers)
    if cls is SubsetRandomSampler:
        return [SubsetRandomSampler(list(range(5, 17)), generator=generator)]
    return [WeightedRandomSampler([1.0, 2.0, 3.0, 4.0], 9, generator=generator)]


def _verified(cls: type) -> bool:
    """Check once per process that a fast path reproduces the installed torch's own iteration exactly.

    A future torch release that changes how one of its samplers draws makes the check fail; that sampler then takes
    the index-by-index path, which is exact by construction.
    """
    if cls not in _VERIFIED:
        path = dict(_FAST_PATHS)[cls]
        ok = True
        for case in range(len(_reference_samplers(cls, torch.Generator()))):
            for start in (0, 1, 5, 7, 40, 100, 200):
                reference_generator = torch.Generator().manual_seed(1234)
                fast_generator = torch.Generator().manual_seed(1234)
                reference = _reference_samplers(cls, reference_generator)[case]
                fast = _reference_samplers(cls, fast_generator)[case]
                expected = list(itertools.islice(iter(reference), start, None))
                ok = ok and expected == list(path(fast, start))
                ok = ok and torch.equal(reference_generator.get_state(), fast_generator.get_state())
        _VERIFIED[cls] = ok
    return _VERIFIED[cls]


def fast_forward(sampler: Iterable[_T], start: int) -> Iterator[_T]:
    """Iterate over a sampler or batch sampler from position ``start``, without loading any data.

    The result equals ``itertools.islice(iter(sampler), start, None)`` and leaves every generator in the same state,
    but the torch samplers (``SequentialSampler``, ``RandomSampler``, ``SubsetRandomSampler``,
    ``WeightedRandomSampler``, ``DistributedSampler`` and a ``BatchSampler`` over any of them) slice their order
    instead of stepping through it, and a sampler implementing :class:`FastForwardable` is asked for its own
    iterator. Only indices are produced: a dataset's ``__getitem__`` is never called.

    Args:
        sampler: Any iterable of indices or of batches of indices.
        start: How many items (indices, or batches for a batch sampler) to skip. May exceed the length, which gives
            an empty iterator.

    Raises:
        ValueError: If ``start`` is negative.

    Example:
        >>> from torch.utils.data import BatchSampler, RandomSampler
        >>> g = torch.Generator().manual_seed(0)
        >>> batches = BatchSampler(RandomSampler(range(10), generator=g), batch_size=3, drop_last=False)
        >>> full = list(batches)
        >>> _ = g.manual_seed(0)
        >>> list(fast_forward(batches, 2)) == full[2:]
        True

    """
    if not isinstance(start, int) or start < 0:
        raise ValueError(f"`start` must be a non-negative integer, got {start!r}.")
    if start == 0:
        return iter(sampler)
    if isinstance(sampler, FastForwardable):
        return sampler.iter_from(start)
    path = _fast_path(sampler)
    if path is not None:
        return path(sampler, start)
    return itertools.islice(iter(sampler), start, None)
