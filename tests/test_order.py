"""Recording a loader's order as it is drawn and replaying it part-way, on plain torch DataLoaders."""

from __future__ import annotations

import copy
import pickle
import random

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler

from lightning_midepoch import _rng
from lightning_midepoch._order import _IndexSamplerRecorder, _PassRecord, _Replay


def _recorded_loader(**kwargs) -> tuple[DataLoader, _IndexSamplerRecorder]:
    loader = DataLoader(list(range(23)), batch_size=3, **kwargs)
    recorder = _IndexSamplerRecorder(loader.batch_sampler, _rng.find_rng_objects({"loader": loader}), lambda: 0)
    object.__setattr__(loader, "batch_sampler", recorder)
    return loader, recorder


def test_recorder_is_transparent():
    inner = BatchSampler(DistributedSampler(range(10), num_replicas=2, rank=0), batch_size=2, drop_last=False)
    recorder = _IndexSamplerRecorder(inner, {}, lambda: 0)
    assert isinstance(recorder, BatchSampler)
    assert len(recorder) == len(inner) == 3
    assert recorder.batch_size == 2
    recorder.sampler.set_epoch(3)
    assert inner.sampler.epoch == 3
    recorder.drop_last = True
    assert inner.drop_last is True
    assert repr(recorder) == repr(inner)
    with pytest.raises(AttributeError):
        _ = recorder._midepoch_missing


def test_recorder_pickles_and_copies_as_the_users_sampler():
    loader, recorder = _recorded_loader(shuffle=True)
    data = pickle.dumps(recorder)
    assert b"_IndexSamplerRecorder" not in data
    restored = pickle.loads(data)
    assert type(restored) is BatchSampler
    assert (restored.batch_size, type(restored.sampler), len(restored)) == (3, RandomSampler, 8)
    assert type(copy.deepcopy(loader).batch_sampler) is BatchSampler


def _scramble() -> None:
    torch.manual_seed(999)
    np.random.seed(999)
    random.seed(999)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("consumed", [0, 1, 4, 8])
@pytest.mark.parametrize("generator", [False, True])
def test_replay_continues_the_recorded_order(num_workers, consumed, generator):
    def make():
        kwargs = {"generator": torch.Generator().manual_seed(5)} if generator else {}
        return _recorded_loader(shuffle=True, num_workers=num_workers, **kwargs)

    torch.manual_seed(1)
    loader, recorder = make()
    iterator = iter(loader)
    for _ in range(consumed):
        next(iterator)
    # what a checkpoint holds: the pass's record and the live states
    record = _PassRecord.from_state_dict(recorder.record.state_dict())
    live = _rng.capture_global()
    rest = [batch.tolist() for batch in iterator]
    end = _rng.capture_global()

    _scramble()
    loader, recorder = make()
    _rng.restore_global(live)
    recorder.arm(_Replay(record, skip=consumed, index=0))
    with _rng.isolated_global():  # the epoch loop builds the resumed iterator in isolation
        iterator = iter(loader)
    recorder.disarm()
    assert [batch.tolist() for batch in iterator] == rest
    # the live streams continue exactly as in the uninterrupted pass
    assert _rng.states_equal(_rng.capture_global(), end)
    # a checkpoint taken in the resumed pass saves the same record
    assert recorder.record is record


def test_recording_reads_states_only():
    torch.manual_seed(3)
    list(DataLoader(list(range(23)), batch_size=3, shuffle=True))
    reference = torch.rand(4)
    torch.manual_seed(3)
    loader, _ = _recorded_loader(shuffle=True)
    list(loader)
    assert torch.equal(torch.rand(4), reference)


def test_passes_are_counted_at_their_first_batch():
    loader, recorder = _recorded_loader(shuffle=True, num_workers=2)  # workers call iter() twice per iterator
    recorder.start_epoch()
    list(loader)
    assert recorder.record.index == 0
    list(loader)
    assert recorder.record.index == 1
    recorder.start_epoch()
    iter(loader)
    assert recorder.passes == 1


@pytest.mark.parametrize("taken", [0, 1, 2, 7, 8, 9])
def test_a_record_counts_what_the_loader_took_of_its_pass(taken):
    """`pulled` counts the items taken (through C iterators, past the first); `exhausted` a request past the end."""
    batches = BatchSampler(range(23), batch_size=3, drop_last=False)  # 8 batches
    recorder = _IndexSamplerRecorder(batches, {}, lambda: 0)
    recorder.start_epoch()
    iterator = iter(recorder)
    assert recorder.record.state_dict()["pulled"] == 0
    items = [next(iterator, None) for _ in range(taken)]
    state = recorder.record.state_dict()
    assert state["pulled"] == min(taken, 8)
    assert state["exhausted"] is (taken > 8)
    assert items[:8] == list(batches)[:taken]
    assert recorder.record.index == 0
    assert recorder.passes == (1 if taken else 0)


def test_an_empty_pass_is_exhausted_at_its_first_request():
    recorder = _IndexSamplerRecorder(BatchSampler(range(0), batch_size=3, drop_last=False), {}, lambda: 0)
    recorder.start_epoch()
    assert list(recorder) == []
    assert recorder.record.state_dict()["pulled"] == 0
    assert recorder.record.exhausted is True


def test_replay_without_a_record_skips_a_fresh_order():
    loader, recorder = _recorded_loader(shuffle=False)
    recorder.arm(_Replay(None, skip=5, index=0))
    batches = [batch.tolist() for batch in loader]
    recorder.disarm()
    assert batches == [[15, 16, 17], [18, 19, 20], [21, 22]]


def test_live_replay_keeps_the_states_still_across_iterator_creation():
    """With persistent workers, a resumed run creates an iterator (drawing a base seed) where the original reset one."""
    torch.manual_seed(4)
    expected = list(RandomSampler(range(23)))
    torch.manual_seed(4)
    loader = DataLoader(list(range(23)), batch_size=1, shuffle=True, num_workers=2, persistent_workers=True)
    recorder = _IndexSamplerRecorder(loader.batch_sampler, {}, lambda: 0)
    object.__setattr__(loader, "batch_sampler", recorder)
    recorder.arm(_Replay(None, skip=0, index=0, live=True))
    batches = [int(batch) for batch in loader]
    recorder.disarm()
    assert batches == expected


def test_the_pass_after_a_resumed_pass_is_numbered_next():
    """A loader cycling inside an epoch (max_size_cycle): after the resumed third pass comes the fourth."""
    loader, recorder = _recorded_loader(shuffle=True)
    recorder.start_epoch()
    list(loader), list(loader)
    next(iter(loader))
    record = _PassRecord.from_state_dict(recorder.record.state_dict())
    assert record.index == 2

    loader, recorder = _recorded_loader(shuffle=True)
    recorder.start_epoch()
    recorder.arm(_Replay(record, skip=1, index=record.index))
    with _rng.isolated_global():
        iterator = iter(loader)
    recorder.disarm()
    assert len(list(iterator)) == len(loader) - 1
    assert recorder.record.index == 2
    list(loader)
    assert recorder.record.index == 3


@pytest.mark.parametrize(
    ("consumed", "skip", "counted_twice"), [(6, 5, True), (6, 6, False), (7, 6, False), (3, 2, False), (9, 9, False)]
)
def test_the_loaders_generators_are_set_where_the_loader_had_taken_the_pass(consumed, skip, counted_twice):
    """Workers fetch ahead: at a checkpoint, RandomSampler may already have drawn again past its end.

    The resumed pass (which skips ``skip`` batches, one fewer when the checkpoint was written inside a batch) is
    built with less fetched ahead; the saved generator states must land where the loader had taken the original
    pass, or the draw past the end counts twice and the next epoch's order differs.
    """

    def make():
        generator = torch.Generator().manual_seed(11)
        sampler = RandomSampler(range(9), generator=generator)
        loader = DataLoader(list(range(9)), batch_size=1, sampler=sampler, num_workers=2)
        recorder = _IndexSamplerRecorder(loader.batch_sampler, _rng.find_rng_objects({"loader": loader}), lambda: 0)
        object.__setattr__(loader, "batch_sampler", recorder)
        return loader, recorder, generator

    loader, recorder, generator = make()
    iterator = iter(loader)
    for _ in range(consumed):
        next(iterator)
    record = _PassRecord.from_state_dict(recorder.record.state_dict())  # what the checkpoint holds
    saved = _rng.capture_objects(recorder.rng_objects)
    list(iterator)
    end = generator.get_state()

    def resume(generators):
        loader, recorder, generator = make()
        replay = _Replay(_PassRecord.from_state_dict(record.state_dict()), skip=skip, index=0, generators=generators)
        recorder.arm(replay)
        with _rng.isolated_global():
            iterator = iter(loader)
        recorder.disarm()
        if not replay.restored:  # the session's fallback: set them once the iterator is built
            _rng.restore_objects(recorder.rng_objects, saved)
        rest = [int(batch) for batch in iterator]
        return rest, generator.get_state()

    rest, state = resume(saved)
    assert len(rest) == 9 - skip
    assert torch.equal(state, end)
    # the control: set once the iterator is built (as a record without the position is), the draw past the end
    # happens twice where the original had drawn it before the checkpoint and the resumed one draws it after
    _, fallback = resume(None)
    assert torch.equal(fallback, end) is not counted_twice
