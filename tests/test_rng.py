"""Capturing, restoring and isolating random states, and finding the generators data-loading objects own."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

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
