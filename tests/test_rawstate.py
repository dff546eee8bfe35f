"""The cheap batch-start snapshots of numpy's and Python's generators equal their documented reads."""

from __future__ import annotations

import random

import numpy as np
import pytest

from lightning_midepoch import _rawstate, _rng


@pytest.fixture(autouse=True)
def _global_states_restored():
    bit_generator, state = np.random.mtrand._rand._bit_generator, _rng.capture_global()
    yield
    np.random.set_bit_generator(bit_generator)
    _rng.restore_global(state)


def _documented() -> dict:
    state = _rng.capture_global()
    return {"numpy": state["numpy"], "python": state["python"]}


def _draw(kind: str) -> None:
    if kind == "uniform":
        np.random.rand(3), random.random()
    elif kind == "odd-gaussians":  # numpy caches the second gaussian of a pair, Python its gauss_next
        np.random.randn(3), random.gauss(0.0, 1.0)
    elif kind == "many":  # past a twist of both generators' 624 words
        np.random.randint(0, 10, size=2000), [random.random() for _ in range(1000)]


@pytest.mark.parametrize("fast", [True, False], ids=["raw-bytes", "documented-reads"])
@pytest.mark.parametrize("draws", ["none", "uniform", "odd-gaussians", "many"])
def test_snapshot_equals_the_documented_reads(draws, fast, monkeypatch):
    if not fast:
        monkeypatch.setattr(_rawstate, "_python_index_offset", lambda: None)
        monkeypatch.setattr(_rawstate, "_numpy_gauss_offset", lambda: None)
    states = _rawstate.BatchStartStates()
    assert states.fast is fast
    np.random.seed(3), random.seed(4)
    _draw(draws)
    expected = _documented()
    states.take()
    _draw("odd-gaussians")  # what a batch draws after it started
    assert _rng.states_equal(states.states(), expected)
    _rng.restore_global(states.states())
    assert _rng.states_equal(_documented(), expected)


def test_snapshot_follows_a_replaced_numpy_bit_generator():
    states = _rawstate.BatchStartStates()
    states.take()
    np.random.set_bit_generator(np.random.MT19937(5))
    np.random.randn()
    expected = _documented()
    states.take()
    np.random.rand()
    assert _rng.states_equal(states.states(), expected)


def test_snapshot_does_not_read_raw_bytes_behind_another_bit_generator():
    states = _rawstate.BatchStartStates()
    np.random.set_bit_generator(np.random.PCG64(5))
    assert states._follow_numpy() is None  # the documented read instead (numpy's legacy state exists only for MT19937)
