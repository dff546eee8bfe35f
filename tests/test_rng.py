"""Capturing, restoring and isolating random states, and finding the generators data-loading objects own."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from lightning_midepoch import _rng


def _draw() -> tuple:
    return torch.rand(3), np.random.rand(3), random.random()


def _same(first: tuple, second: tuple) -> bool:
    return torch.equal(first[0], second[0]) and np.array_equal(first[1], second[1]) and first[2] == second[2]


def test_capture_and_restore_global():
    state = _rng.capture_global()
    first = _draw()
    _draw()
    _rng.restore_global(state)
    assert _same(first, _draw())


def test_isolated_global_leaves_the_streams_alone():
    state = _rng.capture_global()
    with _rng.isolated_global():
        _draw()
    after = _draw()
    _rng.restore_global(state)
    assert _same(after, _draw())


def test_restore_ignores_missing_components():
    torch_state = torch.get_rng_state()
    _rng.restore_global({"python": _rng.capture_global()["python"]})
    assert torch.equal(torch_state, torch.get_rng_state())


def test_states_load_with_weights_only():
    objects = {
        "torch": torch.Generator().manual_seed(1),
        "python": random.Random(2),
        "numpy": np.random.default_rng(3),
        "legacy": np.random.RandomState(4),
    }
    state = {"global": _rng.capture_global(include_cuda=True), "objects": _rng.capture_objects(objects)}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert _rng.states_equal(loaded["global"], state["global"])
    expected = [
        torch.rand(1, generator=objects["torch"]).item(),
        objects["python"].random(),
        objects["numpy"].random(),
        objects["legacy"].rand(),
    ]
    assert _rng.restore_objects(objects, loaded["objects"]) == []
    assert [
        torch.rand(1, generator=objects["torch"]).item(),
        objects["python"].random(),
        objects["numpy"].random(),
        objects["legacy"].rand(),
    ] == expected


def test_find_rng_objects():
    generator = torch.Generator()
    sampler = RandomSampler(range(10), generator=generator)
    loader = DataLoader(range(10), sampler=sampler, batch_size=2, generator=generator)
    sampler.rng = np.random.default_rng(0)  # a user's sampler keeping its own numpy generator
    found = _rng.find_rng_objects({"loader": loader, "index_sampler": loader.batch_sampler})
    # the shared generator is reported once, under the first path that reaches it
    assert found == {"loader.generator": generator, "loader.sampler.rng": sampler.rng}


def test_find_rng_objects_follows_batch_samplers():
    generator = torch.Generator()
    batch_sampler = BatchSampler(RandomSampler(range(4), generator=generator), 2, False)
    assert _rng.find_rng_objects({"index_sampler": batch_sampler}) == {"index_sampler.sampler.generator": generator}


def test_restore_objects_reports_missing_paths():
    assert _rng.restore_objects({}, {"loader.generator": _rng.capture_objects({"x": torch.Generator()})["x"]}) == [
        "loader.generator"
    ]


@pytest.mark.parametrize(
    ("first", "second", "equal"),
    [
        ({"a": torch.zeros(2)}, {"a": torch.zeros(2)}, True),
        ({"a": torch.zeros(2)}, {"a": torch.ones(2)}, False),
        ({"a": torch.zeros(2)}, {"a": torch.zeros(3)}, False),
        ({"a": [1, 2]}, {"a": [1, 2]}, True),
        ({"a": [1, 2]}, {"a": [1]}, False),
        ({"a": 1}, {"b": 1}, False),
        (torch.zeros(1), 0, False),
    ],
)
def test_states_equal(first, second, equal):
    assert _rng.states_equal(first, second) is equal


def _wrapped(sampler):
    """``sampler`` as Lightning lays it out under DDP: inside a DistributedSamplerWrapper, inside a batch sampler."""
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper

    return BatchSampler(DistributedSamplerWrapper(sampler, num_replicas=2, rank=0), 2, False)


@pytest.mark.parametrize(
    "make",
    [
        lambda g: WeightedRandomSampler([1.0, 2.0, 3.0, 4.0], 4, generator=g),
        lambda g: SubsetRandomSampler(range(4), generator=g),
    ],
    ids=["weighted", "subset"],
)
def test_find_rng_objects_behind_lightnings_distributed_wrapper(make):
    generator = torch.Generator()
    index_sampler = _wrapped(make(generator))
    found = _rng.find_rng_objects({"index_sampler": index_sampler})
    assert found == {"index_sampler.sampler.dataset._sampler.generator": generator}
    # a second build of the same chain (a resumed run) gives the same path
    assert list(_rng.find_rng_objects({"index_sampler": _wrapped(make(torch.Generator()))})) == list(found)


def test_find_rng_objects_in_short_containers_and_under_any_name():
    class Alternating(Sampler[int]):
        def __init__(self) -> None:
            self.parts = [RandomSampler(range(3), generator=torch.Generator()), SequentialSampler(range(3))]
            self.coin = random.Random(1)
            self.streams = {"noise": np.random.default_rng(2)}

    sampler = Alternating()
    found = _rng.find_rng_objects({"index_sampler": sampler})
    assert found == {
        "index_sampler.coin": sampler.coin,
        "index_sampler.streams.noise": sampler.streams["noise"],
        "index_sampler.parts.0.generator": sampler.parts[0].generator,
    }


def test_find_rng_objects_skips_live_iterators_and_data():
    generator = torch.Generator()
    loader = DataLoader(list(range(40)), batch_size=2, shuffle=True, generator=generator)
    iter(loader)  # a live iterator keeps the index sampler too: not part of the chain
    assert _rng.find_rng_objects({"loader": loader}) == {"loader.generator": generator}


def test_out_of_reach_names_where_the_search_stops():
    index_sampler = _wrapped(RandomSampler(range(4), generator=torch.Generator()))
    assert _rng.out_of_reach({"index_sampler": index_sampler}) == []
    assert _rng.find_rng_objects({"index_sampler": index_sampler}, depth=2) == {}
    assert _rng.out_of_reach({"index_sampler": index_sampler}, depth=2) == ["index_sampler.sampler.dataset._sampler"]


def test_restore_global_restores_cuda_states_for_as_many_devices(monkeypatch):
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    states = [torch.zeros(16, dtype=torch.uint8), torch.ones(16, dtype=torch.uint8)]
    assert _rng.restore_global({"cuda": states}) is None
    assert restored == [states]


@pytest.mark.parametrize(("available", "devices"), [(True, 1), (True, 3), (False, 0)])
def test_restore_global_reports_skipped_cuda_states(available, devices, monkeypatch):
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: devices)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    assert _rng.restore_global({"cuda": [torch.zeros(16, dtype=torch.uint8)] * 2}) == devices
    assert restored == []


class _OwnsGenerators:
    """A dataset with a generator under one of the usual names, and optionally one under a name of its own."""

    def __init__(self, own_name: bool) -> None:
        self.generator = torch.Generator().manual_seed(1)
        self.size = 4
        if own_name:
            self.noise = np.random.default_rng(3)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return index


class _GeneratorProperty:
    def __init__(self) -> None:
        self._made = torch.Generator()

    @property
    def generator(self) -> torch.Generator:
        return self._made


def _chains() -> dict[str, dict[str, object]]:
    """Loaders and samplers built as users and Lightning build them, by what they exercise."""
    generator = torch.Generator()
    saved_args = BatchSampler(RandomSampler(range(8), generator=generator), 2, False)
    saved_args.__pl_saved_args = (saved_args.sampler, 2, False)  # what Lightning keeps of a batch sampler
    return {
        "loader": {"loader": DataLoader(_OwnsGenerators(False), batch_size=2, shuffle=True, generator=generator)},
        "own name": {"dataset": _OwnsGenerators(True)},
        "saved args": {"index_sampler": saved_args},
        "property": {"dataset": _GeneratorProperty()},
        "wrapper": {"index_sampler": _wrapped(RandomSampler(range(4), generator=torch.Generator()))},
    }


@pytest.mark.parametrize(
    ("chain", "expected"),
    [
        ("loader", ["loader.generator"]),
        ("own name", ["dataset.generator", "dataset.noise"]),
        ("saved args", ["index_sampler.sampler.generator"]),
        ("property", ["dataset._made"]),
        ("wrapper", ["index_sampler.sampler.dataset._sampler.generator"]),
    ],
)
def test_the_search_reads_plain_attributes_and_short_containers(chain, expected):
    roots = _chains()[chain]
    assert list(_rng.find_rng_objects(roots)) == expected


def test_a_dataset_keeps_its_generators_under_their_paths():
    dataset, named = _OwnsGenerators(False), _OwnsGenerators(True)
    assert _rng.find_rng_objects({"dataset": dataset}) == {"dataset.generator": dataset.generator}
    assert list(_rng.find_rng_objects({"dataset": named})) == ["dataset.generator", "dataset.noise"]
