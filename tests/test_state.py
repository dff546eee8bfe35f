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

from harness import Config, CrashPoint, checkpoint_path, run
from lightning_midepoch import MidEpochResumeError
from lightning_midepoch import _state as S

MID = CrashPoint("train_batch_end", epoch=1, batch=3)


def _saved_state(config: Config, tmp_path) -> dict:
    run(config, tmp_path, crash=MID)
    return torch.load(checkpoint_path(tmp_path, MID), weights_only=True)["callbacks"]["MidEpochResume"]


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
    assert set(rank) == {"rng", "passes", "generators", "dataset_states", "grads"}
    assert set(rank["rng"]) == {"torch", "numpy", "python"}
    (record,) = rank["passes"]
    assert set(record) == {"epoch", "index", "at_iter", "at_first_next"}
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
    small = _saved_state(Config(dataset_size=20), tmp_path / "small")
    large = _saved_state(Config(dataset_size=20_000), tmp_path / "large")
    assert abs(_nbytes(small) - _nbytes(large)) < 64  # only the integers describing the dataset differ
    assert _nbytes(small) < 32_000  # three snapshots of torch + numpy + python states, ~10 KB each


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


def test_unsaved_buffer_of_a_hugging_face_iterable_dataset():
    datasets = pytest.importorskip("datasets")
    plain = datasets.Dataset.from_dict({"i": list(range(10))}).to_iterable_dataset(num_shards=2)
    assert S.unsaved_buffer(plain) is None
    assert S.unsaved_buffer(plain.shuffle(seed=1, buffer_size=4)) == "a shuffle buffer of 4 examples"
    mapped = plain.shuffle(seed=1, buffer_size=3).map(lambda row: {"j": row["i"] + 1})
    assert S.unsaved_buffer(mapped) == "a shuffle buffer of 3 examples"
    interleaved = datasets.interleave_datasets([plain, plain.shuffle(seed=1, buffer_size=5)])
    assert S.unsaved_buffer(interleaved) == "a shuffle buffer of 5 examples"
