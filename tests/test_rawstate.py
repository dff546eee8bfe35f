"""The cheap batch-start snapshots of torch's, numpy's and Python's generators equal their documented reads."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

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


def _same_position_other_words(generator: str, kind: str) -> None:
    """Give numpy's or Python's generator other words at the position it is at (seeded, set, or regenerated)."""
    if generator == "python":
        state = random.getstate()
        if kind == "reseeded":  # seeding sets the position to the same value whatever the seed
            random.seed(state[1][5] + 1)
        elif kind == "set":  # another seed's words, at the position the generator was at
            random.setstate((state[0], (*random.Random(77).getstate()[1][:-1], state[1][-1]), state[2]))
        else:  # 624 words drawn one by one: the words regenerated once, the position back where it was
            for _ in range(624):
                random.getrandbits(32)
        assert random.getstate()[1][-1] == state[1][-1]  # the position
        assert random.getstate()[1][:-1] != state[1][:-1]
    else:
        state = np.random.get_state()
        if kind == "reseeded":
            np.random.seed(int(state[1][5]) + 1)
        elif kind == "set":
            np.random.set_state((state[0], np.random.RandomState(77).get_state()[1], *state[2:]))
        else:
            for _ in range(624):
                np.random.bytes(4)
        assert np.random.get_state()[2] == state[2]
        assert not np.array_equal(np.random.get_state()[1], state[1])


@pytest.mark.parametrize("kind", ["reseeded", "set", "regenerated"])
@pytest.mark.parametrize("generator", ["python", "numpy"])
def test_snapshot_notices_other_words_at_the_same_position(generator, kind):
    """A block is copied again only when it changed: a change that keeps the position is one."""
    states = _rawstate.BatchStartStates()
    assert states.fast
    np.random.seed(3), random.seed(4)
    if kind != "reseeded":
        _draw("uniform")
    states.take()
    _same_position_other_words(generator, kind)
    expected = _documented()
    states.take()
    np.random.rand(), random.random()
    assert _rng.states_equal(states.states(), expected)


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
    assert not states._follow_numpy()  # the documented read instead (numpy's legacy state exists only for MT19937)


# ------------------------------------------------------------------------------------------------ torch's generator
def _draw_torch(kind: str) -> None:
    if kind == "uniform":
        torch.rand(3)
    elif kind == "float-normal":  # torch caches the second normal sample of a pair
        torch.randn(1)
    elif kind == "double-normal":
        torch.randn(1, dtype=torch.float64)
    elif kind == "many":  # past a twist of the 624 words
        torch.rand(5000)


@pytest.mark.parametrize("fast", [True, False], ids=["raw-bytes", "get_state"])
@pytest.mark.parametrize("draws", ["none", "uniform", "float-normal", "double-normal", "many"])
def test_torch_snapshot_equals_get_state(draws, fast, monkeypatch):
    if not fast:
        monkeypatch.setattr(_rawstate, "_torch_engine_offset", lambda: None)
    states = _rawstate.BatchStartStates(torch_cpu=True)
    assert states.fast_torch is fast
    torch.manual_seed(5)
    _draw_torch(draws)
    expected = torch.default_generator.get_state()
    states.take()
    _draw_torch("float-normal"), _draw_torch("double-normal"), _draw_torch("many")  # what the batch draws
    snapshot = states.states()["torch"]
    assert _rawstate._torch_fields(bytes(snapshot.numpy())) == _rawstate._torch_fields(bytes(expected.numpy()))
    # ... and restoring it draws what the generator drew from the state it copied
    torch.default_generator.set_state(expected)
    draws_then = (torch.rand(700), torch.randn(3), torch.randn(3, dtype=torch.float64))
    torch.default_generator.set_state(snapshot)
    assert all(map(torch.equal, (torch.rand(700), torch.randn(3), torch.randn(3, dtype=torch.float64)), draws_then))


def test_torch_snapshot_with_every_cached_normal_sample():
    """Each cached normal sample, set through a real state: the layout is checked field by field."""
    states = _rawstate.BatchStartStates(torch_cpu=True)
    assert states.fast_torch
    base = bytearray(torch.default_generator.get_state().numpy())
    for normal_valid, float_valid in ((1, 0), (0, 1), (1, 1), (0, 0)):
        _rawstate._TORCH_NORMAL.pack_into(base, _rawstate._TORCH_NORMAL_AT, 0.0, 0.5 * normal_valid, 0.0, normal_valid)
        _rawstate._TORCH_FLOAT.pack_into(base, _rawstate._TORCH_FLOAT_AT, -0.75 * float_valid, bool(float_valid))
        torch.default_generator.set_state(torch.frombuffer(bytearray(base), dtype=torch.uint8))
        states.take()
        expected = _rawstate._torch_fields(bytes(torch.default_generator.get_state().numpy()))
        assert _rawstate._torch_fields(bytes(states.states()["torch"].numpy())) == expected


@pytest.mark.parametrize("kind", ["set", "regenerated"])
def test_torch_snapshot_notices_other_words_at_the_same_position(kind):
    states = _rawstate.BatchStartStates(torch_cpu=True)
    assert states.fast_torch
    torch.manual_seed(5)
    torch.rand(3)
    # both normal samples cached (set_state leaves the value of an empty cache undefined, and so changed)
    state = bytearray(torch.default_generator.get_state().numpy())
    _rawstate._TORCH_NORMAL.pack_into(state, _rawstate._TORCH_NORMAL_AT, 0.0, 0.5, 0.0, 1)
    _rawstate._TORCH_FLOAT.pack_into(state, _rawstate._TORCH_FLOAT_AT, -0.75, True)
    torch.default_generator.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
    before = bytes(torch.default_generator.get_state().numpy())
    states.take()
    if kind == "set":  # another seed's words, with this state's seed, position and cached samples
        other = bytearray(torch.Generator().manual_seed(6).get_state().numpy())
        words = slice(_rawstate._TORCH_WORDS_AT, _rawstate._TORCH_NORMAL_AT)
        state[words] = other[words]
        torch.default_generator.set_state(torch.frombuffer(state, dtype=torch.uint8))
    else:  # 624 words drawn: the words regenerated once, the position back where it was
        torch.randint(0, 2**16, (624,), dtype=torch.int32)
    expected = _rawstate._torch_fields(bytes(torch.default_generator.get_state().numpy()))
    before_fields = _rawstate._torch_fields(before)
    assert expected[:4] == before_fields[:4]  # the seed and position
    assert expected[5:] == before_fields[5:]  # the cached normal samples
    assert expected[4] != before_fields[4]  # the words
    states.take()
    torch.rand(5)
    assert _rawstate._torch_fields(bytes(states.states()["torch"].numpy())) == expected


def test_torch_memory_that_cannot_be_read_is_never_dereferenced():
    assert _rawstate._readable(0, 8) is None
    assert _rawstate._readable(2**63 - 4096, 8) is None
