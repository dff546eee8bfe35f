"""Re-sharding an interrupted epoch's remaining samples, against torch's own DistributedSampler."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler

from lightning_midepoch import _elastic, _rng
from lightning_midepoch import _state as S
from lightning_midepoch._order import _capture, _IndexSamplerRecorder


def _rank_orders(order_source: range, world_size: int, shuffle: bool, drop_last: bool, epoch: int) -> list[list[int]]:
    orders = []
    for rank in range(world_size):
        sampler = DistributedSampler(order_source, world_size, rank, shuffle=shuffle, seed=3, drop_last=drop_last)
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    return orders


@given(
    n=st.integers(1, 40),
    world_size=st.integers(1, 5),
    new_world_size=st.integers(1, 5),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    consumed=st.integers(0, 12),
    consumed_after=st.integers(0, 12),
)
def test_remaining_is_exactly_what_the_ranks_did_not_consume(
    n, world_size, new_world_size, shuffle, drop_last, consumed, consumed_after
):
    spec = {"kind": "distributed", "seed": 3, "shuffle": shuffle, "drop_last": drop_last, "batch_drop_last": False}
    order = _elastic.global_order(spec, n, epoch=4, record=None)
    ranks = _rank_orders(range(n), world_size, shuffle, drop_last, epoch=4)
    epoch_samples = set().union(*map(set, ranks))
    phase = {"world_size": world_size, "drop_last": drop_last, "batch_size": 1, "batch_drop_last": False}
    left = _elastic.remaining(order, [{**phase, "consumed": consumed}])
    done = {i for rank in ranks for i in rank[:consumed]}
    # nothing consumed remains, nothing remains twice, and together they are the epoch's samples
    assert not done & set(left)
    assert len(left) == len(set(left))
    assert done | set(left) == epoch_samples
    # a second phase on another world size, laid out as DistributedSampler would lay out what is left
    shards = [_elastic.shard(left, rank, new_world_size, drop_last) for rank in range(new_world_size)]
    second = {**phase, "world_size": new_world_size, "consumed": consumed_after}
    left_after = _elastic.remaining(order, [{**phase, "consumed": consumed}, second])
    done_after = {i for shard in shards for i in shard[:consumed_after]}
    assert not done_after & set(left_after)
    assert done_after | set(left_after) == set().union(*map(set, shards))


def test_shard_matches_distributed_sampler():
    for world_size in range(1, 5):
        for drop_last in (False, True):
            expected = _rank_orders(range(11), world_size, shuffle=False, drop_last=drop_last, epoch=0)
            actual = [_elastic.shard(list(range(11)), r, world_size, drop_last) for r in range(world_size)]
            assert actual == expected


def test_batch_drop_last_keeps_the_dropped_tail_out():
    phase = {"world_size": 2, "drop_last": False, "batch_size": 4, "batch_drop_last": True, "consumed": 4}
    # 10 samples, 5 per rank, batches of 4 with drop_last: each rank uses 4; after one batch nothing is left
    assert _elastic.remaining(list(range(10)), [phase]) == []


@pytest.mark.parametrize("own_generator", [False, True])
def test_global_order_of_a_recorded_random_order(own_generator):
    generator = torch.Generator().manual_seed(9) if own_generator else None
    sampler = RandomSampler(range(17), generator=generator)
    objects = {"index_sampler.sampler.generator": generator} if own_generator else {}
    torch.manual_seed(5)
    at_iter = _capture(objects)
    expected = list(sampler)
    record = {"at_iter": at_iter, "at_first_next": {"global": {}, "objects": {}}}
    torch.manual_seed(123)
    with _rng.isolated_global():
        order = _elastic.global_order({"kind": "random", "own_generator": own_generator}, 17, 0, record)
    assert order == expected


def test_global_order_of_fixed_orders():
    assert _elastic.global_order({"kind": "sequential"}, 4, 7, None) == list(SequentialSampler(range(4)))
    spec = {"kind": "distributed", "seed": 0, "shuffle": False}
    assert _elastic.global_order(spec, 4, 7, None) == [0, 1, 2, 3]


def test_batched():
    assert _elastic.batched(list(range(5)), 2, drop_last=True) == [[0, 1], [2, 3]]
    assert Counter(i for b in _elastic.batched(list(range(5)), 2, drop_last=False) for i in b) == Counter(range(5))


def _recorded_pass(loader: DataLoader) -> tuple[list[int], dict, dict]:
    """Iterate ``loader`` through a recorder as the training loop does: its order, pass record and order spec."""
    objects = _rng.find_rng_objects({"loader": loader, "index_sampler": loader.batch_sampler})
    recorder = _IndexSamplerRecorder(loader.batch_sampler, objects, lambda: 0)
    object.__setattr__(loader, "batch_sampler", recorder)
    order = [int(i) for batch in loader for i in batch]
    assert recorder.record is not None
    return order, recorder.record.state_dict(), S.global_order(recorder)


@pytest.mark.parametrize("spec_names_the_generator", [True, False], ids=["spec", "spec-of-0.2.0"])
def test_global_order_draws_from_the_samplers_generator_not_the_loaders(spec_names_the_generator):
    sampler = RandomSampler(range(17), generator=torch.Generator().manual_seed(7))
    loader = DataLoader(range(17), batch_size=3, sampler=sampler, generator=torch.Generator().manual_seed(11))
    order, record, spec = _recorded_pass(loader)
    assert spec["generator"] == "loader.sampler.generator"
    if not spec_names_the_generator:
        del spec["generator"]
    torch.manual_seed(123)
    with _rng.isolated_global():
        assert _elastic.global_order(spec, 17, 0, record) == order


def test_global_order_with_one_generator_shared_by_loader_and_sampler():
    generator = torch.Generator().manual_seed(3)
    loader = DataLoader(
        range(9), batch_size=2, sampler=RandomSampler(range(9), generator=generator), generator=generator
    )
    order, record, spec = _recorded_pass(loader)
    assert spec["generator"] == "loader.generator"  # found once, under the loader
    del spec["generator"]
    assert _elastic.global_order(spec, 9, 0, record) == order
