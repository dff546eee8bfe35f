"""The checkpoint state: its exact structure, its size, and the clear errors when a resume cannot be exact."""

from __future__ import annotations

import io

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from harness import CombinedLoader, Config, CrashPoint, checkpoint_path, run
from lightning_midepoch import MidEpochResumeError, _elastic, _rng
from lightning_midepoch import _state as S
from lightning_midepoch._order import _IndexSamplerRecorder

MID = CrashPoint("train_batch_end", epoch=1, batch=3)


def _saved_state(config: Config, tmp_path, crash: CrashPoint = MID) -> dict:
    run(config, tmp_path, crash=crash)
    return torch.load(checkpoint_path(tmp_path, crash), weights_only=True)["callbacks"]["MidEpochResume"]


def test_saved_structure(tmp_path):
    """Pin the schema: a change here is a new state version (and a migration in `_state.migrate`)."""
    state = _saved_state(Config(), tmp_path)
    assert set(state) == {
        "version",
        "package_version",
        "lightning_version",
        "torch_version",
        "epoch",
        "fetched",
        "stopped",
        "world_size",
        "mode",
        "elastic",
        "loaders",
        "ranks",
    }
    assert state["elastic"] is None
    assert state["version"] == S.STATE_VERSION == 1
    assert (state["epoch"], state["fetched"], state["world_size"], state["mode"]) == (1, 4, 1, "max_size_cycle")
    assert state["stopped"] is False
    assert state["loaders"] == [
        {
            "kind": "map",
            "dataset_length": 20,
            "num_batches": 10,
            "batch_size": 2,
            "drop_last": False,
            "order": "BatchSampler over RandomSampler (global torch RNG)",
            "seed_determined": False,
            "global_order": {"kind": "random", "own_generator": False, "batch_drop_last": False, "generator": None},
            "settings": {
                "BatchSampler.batch_size": 2,
                "BatchSampler.drop_last": False,
                "RandomSampler.num_samples": 20,
                "RandomSampler.replacement": False,
            },
        }
    ]
    (rank,) = state["ranks"]
    assert set(rank) == {"rng", "passes", "generators", "dataset_states", "grads", "last_batch"}
    # the batch check (tests/test_batch_check): the last batch trained (ids, inputs, targets), fingerprinted, and the
    # process-wide states it was loaded from (no dataset read in the main process owns a generator here)
    assert set(rank["last_batch"]) == {"fingerprint", "rng"}
    assert set(rank["last_batch"]["fingerprint"]) == {"digest", "leaves"}
    assert list(rank["last_batch"]["fingerprint"]["leaves"]) == ["", "[0]", "[1]", "[2]"]
    assert set(rank["last_batch"]["rng"]) == {"torch", "numpy", "python"}
    assert set(rank["rng"]) == {"torch", "numpy", "python"}
    (record,) = rank["passes"]
    assert set(record) == {"epoch", "index", "at_iter", "at_first_next", "pulled", "exhausted"}
    # how far the loader had taken the pass (optional: records written before they were counted lack them): with no
    # workers fetching ahead (and Lightning not prefetching from a sized loader), exactly the batches fetched
    assert (record["pulled"], record["exhausted"]) == (state["fetched"], False)
    assert (record["epoch"], record["index"]) == (1, 0)
    assert set(record["at_iter"]) == set(record["at_first_next"]) == {"global", "objects"}
    # only what changed between iter() and the first next() is stored twice: here the worker base seed draw
    assert set(record["at_first_next"]["global"]) == {"torch"}
    assert rank["generators"] == [{}]
    assert rank["dataset_states"] == [None]
    assert rank["grads"] is None


def _nbytes(state: dict) -> int:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getbuffer().nbytes


def test_size_does_not_depend_on_the_dataset(tmp_path):
    early = CrashPoint("train_batch_end", epoch=0, batch=3)  # an epoch of 10,000 batches is not trained through
    small = _saved_state(Config(dataset_size=20), tmp_path / "small", early)
    large = _saved_state(Config(dataset_size=20_000), tmp_path / "large", early)
    assert abs(_nbytes(small) - _nbytes(large)) < 128  # only integers differ (a saved order would be 80 KB more)
    later = _saved_state(Config(dataset_size=20), tmp_path / "later")
    # four snapshots of torch + numpy + python states, ~10 KB each (the fourth: the batch check's, those the last batch
    # trained was loaded from)
    assert _nbytes(later) < 44_000


def test_partial_gradients_only_inside_an_accumulation_group(tmp_path):
    inside = _saved_state(Config(accumulate_grad_batches=3), tmp_path / "inside")  # batch 3 of group 3..5
    at_end = _saved_state(Config(accumulate_grad_batches=2), tmp_path / "end")  # batch 3 ends group 2..3
    assert set(inside["ranks"][0]["grads"]) == {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"}
    assert at_end["ranks"][0]["grads"] is None


FIX = "pass the opt-out"


def _facts(**changes):
    facts = S.loader_facts(DataLoader(range(20), batch_size=2, shuffle=True))
    facts.update(changes)
    return facts


@pytest.mark.parametrize(
    ("current", "message"),
    [
        ([_facts(), _facts()], "saved with 1 train dataloader.s. but the current run has 2"),
        ([_facts(dataset_length=30)], "20 samples but the current one has a train dataset of 30 samples"),
        ([_facts(batch_size=4)], "batch_size=2 but the current one has batch_size=4"),
        ([_facts(drop_last=True)], "drop_last=False but the current one has drop_last=True"),
        ([_facts(num_batches=11)], "10 batches per epoch but the current one has 11 batches"),
        ([_facts(kind="iterable")], "of kind 'map' but it is 'iterable' now"),
    ],
)
def test_check_loaders(current, message):
    with pytest.raises(MidEpochResumeError, match=message + ".*pass the opt-out"):
        S.check_loaders([_facts()], current, FIX)


def test_check_loaders_names_the_loader_that_differs():
    """The message says which train dataloader differs; every one is compared, whatever the kind of those before."""
    saved = [_facts(kind="stateful"), _facts(), _facts()]
    with pytest.raises(MidEpochResumeError, match="saved with train dataloader 2 having batch_size=2 but the current"):
        S.check_loaders(saved, [_facts(kind="stateful"), _facts(), _facts(batch_size=3)], FIX)
    with pytest.raises(MidEpochResumeError, match="saved with train dataloader 1 of kind 'map' but it is 'iterable'"):
        S.check_loaders(saved, [_facts(kind="stateful"), _facts(kind="iterable"), _facts()], FIX)
    with pytest.raises(MidEpochResumeError, match="saved with the train dataloader having drop_last=False but"):
        S.check_loaders([_facts()], [_facts(drop_last=True)], FIX)


def test_check_loaders_accepts_the_same_and_ignores_non_map_details():
    S.check_loaders([_facts()], [_facts()], FIX)
    S.check_loaders([_facts(kind="stateful", batch_size=1)], [_facts(kind="stateful", batch_size=2)], FIX)


def _distributed_facts(**changes):
    sampler = DistributedSampler(range(20), num_replicas=2, rank=0, seed=3)
    facts = S.loader_facts(DataLoader(range(20), batch_size=2, sampler=sampler))
    facts.update(changes)
    return facts


@pytest.mark.parametrize(
    ("saved", "saved_world_size", "message"),
    [
        ([_distributed_facts(), _distributed_facts()], 2, "it has 2 train dataloaders"),
        ([_distributed_facts(kind="iterable")], 2, "its train dataloader is of kind 'iterable'"),
        (
            [_distributed_facts(global_order=None, order="MySampler (custom)")],
            2,
            r"its train dataloader's order \(MySampler \(custom\)\) has no global order",
        ),
        ([_facts()], 2, "its 2 ranks did not shard one order with a DistributedSampler"),
        ([], 2, "it has 0 train dataloaders"),
    ],
)
def test_check_elastic_rejects(saved, saved_world_size, message):
    with pytest.raises(
        MidEpochResumeError,
        match=f"world size of {saved_world_size} but the current run has a world"
        f" size of 1, and that epoch cannot be re-sharded: {message}",
    ):
        S.check_elastic(saved, saved_world_size, 1, FIX)


@pytest.mark.parametrize(("saved", "saved_world_size"), [([_distributed_facts()], 2), ([_facts()], 1)])
def test_check_elastic_accepts(saved, saved_world_size):
    S.check_elastic(saved, saved_world_size, 3, FIX)


def test_check_elastic_needs_the_record_of_a_random_order():
    S.check_elastic([_distributed_facts()], 2, 1, FIX, recorded=False)  # a DistributedSampler's needs none
    with pytest.raises(MidEpochResumeError, match="the random order of the interrupted epoch was not recorded"):
        S.check_elastic([_facts()], 1, 2, FIX, recorded=False)


def test_facts_that_depend_on_the_world_size_are_compared_only_on_the_same_world_size():
    saved, current = [_distributed_facts()], [_facts(num_batches=20)]
    S.check_loaders(saved, current, FIX, same_world_size=False)
    with pytest.raises(MidEpochResumeError, match=r"DistributedSampler \(seed 3"):
        S.check_loaders(saved, current, FIX)
    with pytest.raises(MidEpochResumeError, match="5 batches per epoch"):
        S.check_loaders(saved, [{**current[0], "order": saved[0]["order"], "settings": {}}], FIX)


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({}, "no valid version"),
        ({"version": "1"}, "no valid version"),
        ({"version": 2}, "version 2, newer than this lightning-midepoch"),
    ],
)
def test_migrate_rejects(state, message):
    with pytest.raises(MidEpochResumeError, match=message):
        S.migrate(state)


def test_migrate_current():
    # states written before "stopped" existed were never saved after an early stop
    assert S.migrate({"version": 1, "loaders": []}) == {"version": 1, "loaders": [], "stopped": False}
    assert S.migrate({"version": 1, "stopped": True}) == {"version": 1, "stopped": True}


def test_empty_state_records_no_position():
    assert not S.records_position(S.migrate(S.empty_state()))


@pytest.mark.parametrize(
    ("sampler", "description", "determined"),
    [
        (SequentialSampler(range(3)), "SequentialSampler (fixed order)", True),
        (RandomSampler(range(3)), "RandomSampler (global torch RNG)", False),
        (RandomSampler(range(3), generator=torch.Generator()), "RandomSampler (own generator)", False),
        (
            DistributedSampler(range(3), num_replicas=2, rank=1, seed=4),
            "DistributedSampler (seed 4 + epoch)",
            True,
        ),
        (
            DistributedSampler(range(3), num_replicas=2, rank=0, shuffle=False),
            "DistributedSampler (fixed order)",
            True,
        ),
        (
            BatchSampler(SequentialSampler(range(3)), 2, False),
            "BatchSampler over SequentialSampler (fixed order)",
            True,
        ),
        (iter([]), "list_iterator (custom)", False),
    ],
)
def test_describe_order(sampler, description, determined):
    assert S.describe_order(sampler) == (description, determined)


def test_loader_kinds():
    class Stateful(DataLoader):
        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    assert S.loader_kind(DataLoader(range(3))) == S.KIND_MAP
    assert S.loader_kind(Stateful(range(3))) == S.KIND_STATEFUL

    class Numbers(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(3))

    assert S.loader_kind(DataLoader(Numbers())) == S.KIND_ITERABLE
    assert S.loader_kind([1, 2]) == S.KIND_ITERABLE


class Passes:
    """``length`` items, each saying which pass over this iterable it belongs to and its position in that pass."""

    def __init__(self, length: int) -> None:
        self.length, self.started = length, 0

    def __len__(self) -> int:
        return self.length

    def __iter__(self):
        number, self.started = self.started, self.started + 1
        return iter([(number, position) for position in range(self.length)])


@pytest.mark.parametrize("length", [1, 3, 4, 12])
@pytest.mark.parametrize("mode", ["max_size_cycle", "max_size", "min_size"])
def test_loader_position_is_where_the_combined_loader_took_the_last_batch_from(mode, length):
    """Beside a loader of 12 batches, after each batch: the short loader's pass and how many items it consumed in it."""
    short = Passes(length)
    iterator = iter(CombinedLoader({"long": range(12), "short": short}, mode))
    assert S.loader_position(mode, 0, length) == (0, 0)
    last = None
    for consumed in range(1, 13):
        item = next(iterator, None)
        if item is None:  # min_size: the epoch ends with the shorter loader
            assert (mode, consumed) == ("min_size", length + 1)
            return
        batch = item[0]["short"]
        last = batch if batch is not None else last  # max_size: an exhausted loader gives None
        assert S.loader_position(mode, consumed, length) == (last[0], last[1] + 1), f"after {consumed} batches"


class ReversedSampler(SequentialSampler):
    def __iter__(self):
        return iter(reversed(range(len(self.data_source))))


class EveryOtherBatch(BatchSampler):
    def __iter__(self):
        return iter(list(super().__iter__())[::2])


@pytest.mark.parametrize("rank", [0, 2])
@pytest.mark.parametrize("batch_drop_last", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_global_order_rebuilds_a_distributed_samplers_batches(shuffle, drop_last, batch_drop_last, rank):
    """The spec alone (with the dataset length and epoch) gives back exactly the batches this rank iterates."""
    sampler = DistributedSampler(range(11), num_replicas=3, rank=rank, shuffle=shuffle, drop_last=drop_last, seed=5)
    sampler.set_epoch(2)
    batches = BatchSampler(sampler, 2, batch_drop_last)
    spec = S.global_order(batches)
    order = _elastic.global_order(spec, 11, 2, None)
    shard = _elastic.shard(order, rank, 3, spec["drop_last"])
    assert _elastic.batched(shard, 2, spec["batch_drop_last"]) == list(batches)


@pytest.mark.parametrize("batch_drop_last", [False, True])
def test_global_order_rebuilds_a_sequential_order(batch_drop_last):
    batches = BatchSampler(SequentialSampler(range(11)), 3, batch_drop_last)
    spec = S.global_order(batches)
    order = _elastic.global_order(spec, 11, 0, None)
    assert _elastic.batched(order, 3, spec["batch_drop_last"]) == list(batches)


@pytest.mark.parametrize("own_generator", [False, True])
def test_global_order_rebuilds_a_recorded_random_order(own_generator):
    """A random order (the global torch RNG's or the sampler's own generator's) is re-drawn from its pass record."""
    generator = torch.Generator().manual_seed(3) if own_generator else None
    loader = DataLoader(range(11), batch_size=2, sampler=RandomSampler(range(11), generator=generator))
    recorder = _IndexSamplerRecorder(loader.batch_sampler, _rng.find_rng_objects({"loader": loader}), lambda: 0)
    object.__setattr__(loader, "batch_sampler", recorder)
    batches = [batch.tolist() for batch in loader]
    torch.rand(3)  # the live states move on: the record, not the live state, determines the order
    if generator is not None:
        generator.manual_seed(4)
    spec = S.global_order(recorder)
    assert spec["own_generator"] is own_generator
    order = _elastic.global_order(spec, 11, 0, recorder.record.state_dict())
    assert _elastic.batched(order, 2, spec["batch_drop_last"]) == batches


@pytest.mark.parametrize(
    "index_sampler",
    [
        RandomSampler(range(5), replacement=True),
        RandomSampler(range(5), num_samples=7),
        RandomSampler(range(5), num_samples=4),
        ReversedSampler(range(5)),
        WeightedRandomSampler([1.0, 2.0], 2),
        BatchSampler(RandomSampler(range(5), replacement=True), 2, False),
        EveryOtherBatch(SequentialSampler(range(5)), 2, False),
        EveryOtherBatch(DistributedSampler(range(5), num_replicas=1, rank=0), 2, False),
    ],
    ids=[
        "replacement",
        "more-samples",
        "fewer-samples",
        "custom-sampler",
        "weighted",
        "batches-with-replacement",
        "custom-batch-sampler",
        "custom-batch-sampler-distributed",
    ],
)
def test_global_order_is_none_where_the_order_cannot_be_rebuilt(index_sampler):
    assert S.global_order(index_sampler) is None


@pytest.mark.parametrize(
    ("index_sampler", "description", "determined"),
    [
        # its own __iter__ draws the batches: described by what it wraps, never as determined
        (
            EveryOtherBatch(SequentialSampler(range(3)), 2, False),
            "EveryOtherBatch over SequentialSampler (fixed order)",
            False,
        ),
        (
            BatchSampler(DistributedSampler(range(3), num_replicas=2, rank=0, seed=9), 2, True),
            "BatchSampler over DistributedSampler (seed 9 + epoch)",
            True,
        ),
        (
            _IndexSamplerRecorder(BatchSampler(RandomSampler(range(3)), 2, False), {}, lambda: 0),
            "BatchSampler over RandomSampler (global torch RNG)",
            False,
        ),
    ],
    ids=["custom-batch-sampler", "distributed-batches", "recorded"],
)
def test_describe_order_of_wrapped_and_custom_samplers(index_sampler, description, determined):
    assert S.describe_order(index_sampler) == (description, determined)


@pytest.mark.parametrize("batch_size", [None, 3])
def test_index_sampler_is_what_the_loader_draws_its_indices_from(batch_size):
    generator = torch.Generator().manual_seed(6)
    loader = DataLoader(range(7), batch_size=batch_size, sampler=RandomSampler(range(7), generator=generator))
    drawn = [batch.tolist() if batch_size else batch for batch in loader]  # the items of range(7) are its indices
    generator.manual_seed(6)
    assert list(S.index_sampler(loader)) == drawn


def test_every_loader_kind_has_every_fact():
    """The facts of an iterable-style loader have the map-style keys (empty), as the checks and `inspect` read them."""
    facts = S.loader_facts(DataLoader(range(3), batch_size=2))
    for loader in ([1, 2], object()):
        other = S.loader_facts(loader)
        assert set(other) == set(facts)
        assert other["kind"] == S.KIND_ITERABLE
        assert [other[key] for key in ("dataset_length", "num_batches", "batch_size", "global_order")] == [None] * 4


def test_global_order_of_a_loader_without_batch_sampler_drops_no_batch():
    """With ``batch_size=None`` the index sampler is the sampler itself: no batch sampler drops a last batch."""
    loader = DataLoader(range(5), batch_size=None, sampler=SequentialSampler(range(5)))
    assert S.global_order(S.index_sampler(loader)) == {"kind": "sequential", "batch_drop_last": False}


def _wrapped(sampler):
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper

    return BatchSampler(DistributedSamplerWrapper(sampler, num_replicas=2, rank=0), 2, False)


@pytest.mark.parametrize(
    ("sampler", "description"),
    [
        (
            _wrapped(WeightedRandomSampler([1.0, 2.0], 2, generator=torch.Generator())),
            "BatchSampler over DistributedSamplerWrapper over WeightedRandomSampler (custom)",
        ),
        (
            _wrapped(SubsetRandomSampler([0, 1], generator=torch.Generator())),
            "BatchSampler over DistributedSamplerWrapper over SubsetRandomSampler (custom)",
        ),
        (
            _wrapped(RandomSampler(range(2), generator=torch.Generator())),
            "BatchSampler over DistributedSamplerWrapper over RandomSampler (own generator)",
        ),
    ],
)
def test_a_wrapped_order_is_not_called_seed_determined(sampler, description):
    """Lightning's DistributedSamplerWrapper is a DistributedSampler whose order comes from the sampler it wraps."""
    assert S.describe_order(sampler) == (description, False)
    assert S.global_order(sampler) is None


def _loader_facts(**sampler_kwargs):
    kind = sampler_kwargs.pop("kind", "random")
    if kind == "random":
        sampler = RandomSampler(range(20), **sampler_kwargs)
    elif kind == "weighted":
        sampler = WeightedRandomSampler([1.0] * 20, **{"num_samples": 20, **sampler_kwargs})
    else:
        sampler = DistributedSampler(range(40), num_replicas=2, rank=0, **sampler_kwargs)
    return S.loader_facts(DataLoader(range(40), batch_size=2, sampler=sampler))


@pytest.mark.parametrize(
    ("saved", "current", "message"),
    [
        ({}, {"replacement": True}, r"RandomSampler\(replacement=False\) but the current one has RandomSampler\(rep"),
        (
            {"replacement": True},
            {"replacement": True, "num_samples": 30},
            r"RandomSampler\(num_samples=20\) but the current one has RandomSampler\(num_samples=30\)",
        ),
        (
            {"kind": "weighted"},
            {"kind": "weighted", "replacement": False},
            r"WeightedRandomSampler\(replacement=True\) but the current one has WeightedRandomSampler\(replacement=F",
        ),
        (
            {"kind": "weighted", "num_samples": 10},
            {"kind": "weighted", "num_samples": 8},
            r"WeightedRandomSampler\(num_samples=10\) but the current one has WeightedRandomSampler\(num_samples=8\)",
        ),
        (
            {"kind": "distributed"},
            {"kind": "distributed", "drop_last": True},
            r"DistributedSampler\(drop_last=False\) but the current one has DistributedSampler\(drop_last=True\)",
        ),
    ],
    ids=["random-replacement", "random-num-samples", "weighted-replacement", "weighted-num-samples", "drop-last"],
)
def test_a_changed_sampler_setting_is_named(saved, current, message):
    with pytest.raises(MidEpochResumeError, match=message + ".*pass the opt-out"):
        S.check_loaders([_loader_facts(**saved)], [_loader_facts(**current)], FIX)


@pytest.mark.parametrize(("current", "setting"), [({"shuffle": False}, "fixed order"), ({"seed": 4}, "seed 4")])
def test_distributed_shuffle_and_seed_are_compared(current, setting):
    with pytest.raises(MidEpochResumeError, match=f"DistributedSampler \\({setting}"):
        S.check_loaders([_loader_facts(kind="distributed")], [_loader_facts(kind="distributed", **current)], FIX)


def test_a_changed_batch_sampler_setting_is_named():
    def facts(batch_size: int) -> dict:
        return S.loader_facts(DataLoader(range(8), batch_sampler=BatchSampler(range(8), batch_size, False)))

    # 8 samples in batches of 3 or 4 are 3 or 2 batches: the batch size is named first
    with pytest.raises(MidEpochResumeError, match=r"BatchSampler\(batch_size=3\) but the current one has Batch"):
        S.check_loaders([facts(3)], [{**facts(4), "num_batches": 3}], FIX)


def test_facts_a_checkpoint_did_not_save_are_not_compared():
    """An older release saved fewer facts: what it did not save is not compared (tests/legacy resume with them)."""
    old = {key: value for key, value in _loader_facts().items() if key not in ("settings", "drop_last")}
    S.check_loaders([old], [_loader_facts(replacement=True)], FIX)
    assert "settings" in _loader_facts()


def test_settings_depend_on_the_world_size():
    S.check_loaders([_loader_facts()], [_loader_facts(replacement=True)], FIX, same_world_size=False)


def test_check_mode():
    S.check_mode("max_size_cycle", "max_size_cycle", FIX)
    S.check_mode(None, "min_size", FIX)  # a state without a mode
    with pytest.raises(MidEpochResumeError, match="mode 'max_size_cycle' but the current run combines them in mode"):
        S.check_mode("max_size_cycle", "max_size", FIX)


def test_global_order_names_the_samplers_generator_path():
    from lightning_midepoch._order import _IndexSamplerRecorder
    from lightning_midepoch._rng import find_rng_objects

    sampler_generator, loader_generator = torch.Generator(), torch.Generator()
    sampler = RandomSampler(range(8), generator=sampler_generator)
    loader = DataLoader(range(8), batch_size=2, sampler=sampler, generator=loader_generator)
    objects = find_rng_objects({"loader": loader, "index_sampler": loader.batch_sampler})
    recorder = _IndexSamplerRecorder(loader.batch_sampler, objects, lambda: 0)
    assert S.global_order(recorder)["generator"] == "loader.sampler.generator"
    assert objects["loader.generator"] is loader_generator
