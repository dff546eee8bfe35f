"""Sampler-level fast-forward on plain torch.utils.data, against itertools.islice as the reference."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from lightning_midepoch import FastForwardable, _sampling, fast_forward

KINDS = [
    "sequential",
    "random",
    "random_generator",
    "random_replacement",
    "random_num_samples",
    "subset",
    "weighted",
    "distributed",
    "distributed_no_shuffle",
    "custom_eager",
    "custom_lazy",
]


class EagerSampler:
    """A custom sampler that draws from numpy when iter() is called."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(np.random.permutation(self.n).tolist())


class LazySampler:
    """A custom sampler that draws from python's random at the first next()."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        order = list(range(self.n))
        random.shuffle(order)
        yield from order


def make(kind: str, n: int, seed: int):
    """A sampler of ``kind`` over ``n`` items whose own generator (if any) is seeded with ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    data = range(n)
    if kind == "sequential":
        return SequentialSampler(data)
    if kind == "random":
        return RandomSampler(data)
    if kind == "random_generator":
        return RandomSampler(data, generator=generator)
    if kind == "random_replacement":
        return RandomSampler(data, replacement=True, num_samples=3 * n + 5, generator=generator)
    if kind == "random_num_samples":
        return RandomSampler(data, num_samples=2 * n + 1)
    if kind == "subset":
        return SubsetRandomSampler(list(range(0, 2 * n, 2)), generator=generator)
    if kind == "weighted":
        return WeightedRandomSampler([float(i % 3 + 1) for i in range(n)], n + 3, generator=generator)
    if kind == "distributed":
        sampler = DistributedSampler(data, num_replicas=3, rank=2, seed=seed)
        sampler.set_epoch(4)
        return sampler
    if kind == "distributed_no_shuffle":
        return DistributedSampler(data, num_replicas=2, rank=1, shuffle=False, drop_last=True)
    if kind == "custom_eager":
        return EagerSampler(n)
    return LazySampler(n)


def _global_states():
    return torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()


def _set_global(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def _assert_same_as_islice(build, start: int) -> None:
    """``fast_forward(build(), start)`` yields and draws exactly what islice over ``iter(build())`` does."""
    _set_global(123)
    reference_sampler = build()
    expected = list(itertools.islice(iter(reference_sampler), start, None))
    expected_states = _global_states()
    _set_global(123)
    sampler = build()
    actual = list(fast_forward(sampler, start))
    actual_states = _global_states()
    assert actual == expected
    assert torch.equal(actual_states[0], expected_states[0])
    assert (actual_states[1] == expected_states[1]).all()
    assert actual_states[2] == expected_states[2]
    for attribute in ("generator",):
        ours, theirs = getattr(sampler, attribute, None), getattr(reference_sampler, attribute, None)
        if ours is not None:
            assert torch.equal(ours.get_state(), theirs.get_state())


@given(kind=st.sampled_from(KINDS), n=st.integers(1, 40), start=st.integers(0, 130), seed=st.integers(0, 2**16))
def test_sampler_fast_forward(kind, n, start, seed):
    _assert_same_as_islice(lambda: make(kind, n, seed), start)


@given(
    kind=st.sampled_from(KINDS),
    n=st.integers(1, 40),
    batch_size=st.integers(1, 7),
    drop_last=st.booleans(),
    start=st.integers(0, 45),
    seed=st.integers(0, 2**16),
)
def test_batch_sampler_fast_forward(kind, n, batch_size, drop_last, start, seed):
    _assert_same_as_islice(lambda: BatchSampler(make(kind, n, seed), batch_size, drop_last), start)


@given(shuffle=st.booleans(), n=st.integers(1, 30), batch_size=st.integers(1, 5), start=st.integers(0, 35))
def test_dataloader_batch_sampler(shuffle, n, batch_size, start):
    """The index sampler of a plain DataLoader, as the loop fast-forwards it."""
    _assert_same_as_islice(lambda: DataLoader(range(n), batch_size=batch_size, shuffle=shuffle).batch_sampler, start)


def test_large_skip_converts_only_the_remaining_indices(monkeypatch):
    """Skipping 90% of a 10**6-sample RandomSampler slices the permutation: only the rest becomes Python ints."""
    assert all(_sampling._verified(cls) for cls, _ in _sampling._FAST_PATHS)  # done once per process, before
    converted = []
    tolist = torch.Tensor.tolist

    def counting_tolist(tensor):
        converted.append(tensor.numel())
        return tolist(tensor)

    monkeypatch.setattr(torch.Tensor, "tolist", counting_tolist)
    sampler = BatchSampler(RandomSampler(range(10**6)), batch_size=32, drop_last=False)
    remaining = list(fast_forward(sampler, 28_125))  # 28_125 of 31_250 batches consumed
    assert len(remaining) == 31_250 - 28_125
    assert sum(converted) == 10**6 - 28_125 * 32
    converted.clear()
    list(itertools.islice(iter(sampler), 28_125, None))  # the index-by-index skip converts the whole permutation
    assert sum(converted) >= 10**6


class Halves:
    """A FastForwardable sampler: yields 0..n-1 and knows how to start part-way."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.started_at: list[int] = []

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(range(self.n))

    def iter_from(self, start: int):
        self.started_at.append(start)
        return iter(range(start, self.n))


def test_protocol():
    sampler = Halves(10)
    assert isinstance(sampler, FastForwardable)
    assert list(fast_forward(sampler, 4)) == [4, 5, 6, 7, 8, 9]
    assert list(fast_forward(BatchSampler(sampler, 3, False), 2)) == [[6, 7, 8], [9]]
    assert sampler.started_at == [4, 6]


def test_subclass_overriding_iter_is_skipped_index_by_index():
    class Reversed(SequentialSampler):
        def __iter__(self):
            return iter(reversed(range(len(self.data_source))))

    assert list(fast_forward(Reversed(range(6)), 2)) == [3, 2, 1, 0]


def test_unverified_fast_path_falls_back_to_islice(monkeypatch):
    monkeypatch.setitem(_sampling._VERIFIED, RandomSampler, False)
    assert _sampling._fast_path(RandomSampler(range(3))) is None
    _assert_same_as_islice(lambda: RandomSampler(range(9)), 4)


def test_fast_paths_are_verified_against_this_torch(monkeypatch):
    monkeypatch.setattr(_sampling, "_VERIFIED", {})  # checked now, whatever this process already checked
    assert all(_sampling._verified(cls) for cls, _ in _sampling._FAST_PATHS)


@pytest.mark.parametrize("start", [-1, 1.5, "2"])
def test_bad_start(start):
    with pytest.raises(ValueError, match="non-negative integer"):
        fast_forward(range(3), start)


def _one_item_late(sampler, start):
    return itertools.islice(iter(sampler), start + 1, None)


def _one_draw_more(sampler, start):
    rest = list(itertools.islice(iter(sampler), start, None))
    torch.rand(1, generator=sampler.generator)  # the right items, but the generator ends elsewhere
    return iter(rest)


@pytest.mark.parametrize("wrong_path", [_one_item_late, _one_draw_more])
def test_a_fast_path_that_differs_from_torch_is_not_used(wrong_path, monkeypatch):
    """The check against the installed torch rejects a path that yields other items or leaves another state."""
    paths = tuple((cls, wrong_path if cls is RandomSampler else path) for cls, path in _sampling._FAST_PATHS)
    monkeypatch.setattr(_sampling, "_FAST_PATHS", paths)
    monkeypatch.setattr(_sampling, "_VERIFIED", {})
    assert _sampling._fast_path(RandomSampler(range(3))) is None
    assert _sampling._fast_path(SequentialSampler(range(3))) is _sampling._sequential_from
    _assert_same_as_islice(lambda: RandomSampler(range(9), generator=torch.Generator().manual_seed(2)), 4)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("rank", [0, 1, 2])
@pytest.mark.parametrize("n", [22, 23, 24], ids=["padding-2", "padding-1", "no-padding"])
def test_distributed_sampler_padding_on_every_rank(n, rank, shuffle):
    """The repeated samples that make the epoch divisible by the number of ranks land on the same ranks."""
    _assert_same_as_islice(lambda: DistributedSampler(range(n), num_replicas=3, rank=rank, shuffle=shuffle, seed=1), 3)
