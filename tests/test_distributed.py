"""Real multi-process runs: DDP with the gloo backend on CPU, and elastic resume on another number of devices."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

JOB = Path(__file__).resolve().parent / "ddp_job.py"
DATASET = 24  # 12 samples (6 batches of 2) per rank on 2 devices: no padding, so coverage is exact


def _command(
    out: Path,
    devices: int,
    config: dict,
    crash: tuple[int, int] | None = None,
    resume: Path | None = None,
    stock: bool = False,
    extra: tuple[str, ...] = (),
    on_exception: bool = False,
) -> list[str]:
    command = [sys.executable, str(JOB), str(out), "--devices", str(devices), "--config", json.dumps(config), *extra]
    if stock:
        command.append("--stock")
    if crash is not None:
        command += ["--crash", str(crash[0]), str(crash[1]), *(["--on-exception"] if on_exception else [])]
    if resume is not None:
        command += ["--resume", str(resume)]
    return command


def _results(out: Path, world_size: int) -> list:
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(world_size)]


def _train(out: Path, devices: int, config: dict, **options: Any) -> list:
    completed = subprocess.run(_command(out, devices, config, **options), capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return _results(out, devices)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The uninterrupted runs, with and without the callback, shared by the tests of this module."""
    runs: dict[tuple[int, str, bool, tuple[str, ...]], list] = {}

    def train(devices: int, config: dict, stock: bool = False, extra: tuple[str, ...] = ()) -> list:
        key = (devices, json.dumps(config, sort_keys=True), stock, extra)
        if key not in runs:
            runs[key] = _train(tmp_path_factory.mktemp("uninterrupted"), devices, config, stock=stock, extra=extra)
        return runs[key]

    return train


def _assert_same_end(first, second) -> None:
    for rank, (f, s) in enumerate(zip(first, second, strict=True)):
        for name, value in f["params"].items():
            assert torch.equal(value, s["params"][name]), f"rank {rank}: {name} differs"
        assert torch.equal(f["rng"]["torch"], s["rng"]["torch"]), f"rank {rank}: torch random state differs"
        assert (f["rng"]["numpy"] == s["rng"]["numpy"]).all(), f"rank {rank}: numpy random state differs"
        assert f["rng"]["python"] == s["rng"]["python"], f"rank {rank}: python random state differs"


def _assert_transparent(uninterrupted, devices: int, config: dict) -> None:
    """The uninterrupted run with the callback is the same run as without it, on every rank."""
    ours, stock = uninterrupted(devices, config), uninterrupted(devices, config, stock=True)
    assert [rank["seen"] for rank in ours] == [rank["seen"] for rank in stock]
    _assert_same_end(ours, stock)


def _assert_same_continuation(full, interrupted, resumed) -> None:
    for rank, (f, i, r) in enumerate(zip(full, interrupted, resumed, strict=True)):
        assert i["seen"] + r["seen"] == f["seen"], f"rank {rank} trained other batches"
    _assert_same_end(full, resumed)


# The heavier multi-process cases, skipped by `make test` and run by `make strategies` (marked `strategies_matrix`):
# an explicit sampler under `ddp_spawn`, FSDP with worker processes at an epoch's end, a Subset sampler under DDP.
STRATEGIES_MATRIX = [
    pytest.mark.strategies_matrix,
    pytest.mark.skipif(
        not os.environ.get("MIDEPOCH_STRATEGIES_MATRIX"), reason="a heavier case: `make strategies` runs it"
    ),
]


@pytest.mark.parametrize(
    ("config", "crash"),
    [
        # the DistributedSampler Lightning injects for shuffle=True
        ({"dataset_size": DATASET}, (1, 2)),
        # an explicit DistributedSampler with workers, interrupted at an epoch's last batch: the next epoch's
        # iterator must see set_epoch before its workers prefetch (Lightning issue #21938)
        ({"dataset_size": DATASET, "loader": "distributed", "num_workers": 2}, (0, 5)),
        # inside an accumulation group: each rank's partial gradients differ and are saved per rank
        ({"dataset_size": DATASET, "accumulate_grad_batches": 4}, (1, 1)),
        # a sampler with its own generator, which Lightning wraps in its DistributedSamplerWrapper (the generator
        # sits in the wrapper's dataset)
        ({"dataset_size": DATASET, "loader": "weighted_generator"}, (1, 2)),
        pytest.param({"dataset_size": DATASET, "loader": "subset_generator"}, (1, 3), marks=STRATEGIES_MATRIX),
        # random augmentation drawn in 2 DataLoader workers on each rank; batch 2 (3 consumed) resumes at worker 1
        ({"dataset_size": DATASET, "augment": True, "num_workers": 2, "max_epochs": 2}, (0, 2)),
    ],
    ids=[
        "injected-sampler",
        "explicit-sampler-workers-epoch-end",
        "accumulation",
        "weighted-wrapped",
        "subset-wrapped",
        "augmenting-workers",
    ],
)
def test_ddp_resume_is_exact_on_every_rank(config, crash, uninterrupted, tmp_path):
    _assert_transparent(uninterrupted, 2, config)
    full = uninterrupted(2, config)
    interrupted = _train(tmp_path / "interrupted", 2, config, crash=crash)
    checkpoint = torch.load(tmp_path / "interrupted" / "crash.ckpt", weights_only=True)
    ranks = checkpoint["callbacks"]["MidEpochResume"]["ranks"]
    assert len(ranks) == 2  # written by rank 0, with every rank's states
    assert not torch.equal(ranks[0]["rng"]["torch"], ranks[1]["rng"]["torch"])
    resumed = _train(tmp_path / "resumed", 2, config, resume=tmp_path / "interrupted" / "crash.ckpt")
    _assert_same_continuation(full, interrupted, resumed)
    # the states travel to rank 0 without torch.save on the other ranks (stock Lightning calls it on rank 0 only)
    assert interrupted[1]["saves"] == 0


EXCEPTION_CONFIG = {"dataset_size": DATASET, "hook_draws": False}


@pytest.fixture(scope="module")
def on_exception(uninterrupted, tmp_path_factory):
    """Every rank raises in training_step at epoch 1, batch 2; OnExceptionCheckpoint writes without exchanging states
    (the ranks may be gone), and Lightning writes from rank 0 only. Then 2 processes resume from that file."""
    tmp_path = tmp_path_factory.mktemp("on_exception")
    full = uninterrupted(2, EXCEPTION_CONFIG)
    interrupted = _train(tmp_path / "interrupted", 2, EXCEPTION_CONFIG, crash=(1, 2), on_exception=True)
    ckpt = tmp_path / "interrupted" / "on_exception.ckpt"
    resumed = _train(tmp_path / "resumed", 2, EXCEPTION_CONFIG, resume=ckpt)
    return full, interrupted, resumed, tmp_path / "interrupted"


def test_ddp_checkpoint_written_during_an_exception_holds_rank_zeros_states(on_exception):
    full, interrupted, resumed, directory = on_exception
    assert sorted(path.name for path in directory.glob("*.ckpt")) == ["on_exception.ckpt"]
    ranks = torch.load(directory / "on_exception.ckpt", weights_only=True)["callbacks"]["MidEpochResume"]["ranks"]
    assert len(ranks) == 2
    assert ranks[0] is not None
    assert ranks[1] is None  # rank 1's own states were in its snapshot only, which Lightning does not write
    for rank, (f, i, r) in enumerate(zip(full, interrupted, resumed, strict=True)):
        # the batch that raised is not in the checkpoint: every rank trains it again, then exactly the rest
        assert i["seen"][:-1] + r["seen"] == f["seen"], f"rank {rank} trained other batches"
    # rank 0 continues from its own states, as of the start of the batch that raised
    assert torch.equal(resumed[0]["rng"]["torch"], full[0]["rng"]["torch"])
    assert (resumed[0]["rng"]["numpy"] == full[0]["rng"]["numpy"]).all()
    assert resumed[0]["rng"]["python"] == full[0]["rng"]["python"]
    # rank 1 continues with fresh states: its dropout differs, and so do the averaged weights on every rank
    assert not torch.equal(resumed[1]["rng"]["torch"], full[1]["rng"]["torch"])
    assert any(not torch.equal(value, resumed[0]["params"][name]) for name, value in full[0]["params"].items())


def test_ddp_resume_from_an_exception_checkpoint_warns_that_rank_1_has_fresh_states(on_exception):
    _, _, resumed, _ = on_exception
    messages = [message for rank in resumed for message in rank["warnings"]]
    assert any("holds no random states for rank 1" in message for message in messages)


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_checkpointing_every_few_steps_is_unchanged(strategy, tmp_path):
    """ModelCheckpoint gathers every rank's states at each save: the run is still the stock run, on every rank."""
    config = {"dataset_size": DATASET}
    extra = ("--strategy", strategy, "--checkpoint-every", "2")
    ours = _train(tmp_path / "ours", 2, config, extra=extra)
    stock = _train(tmp_path / "stock", 2, config, extra=extra, stock=True)
    assert [rank["seen"] for rank in ours] == [rank["seen"] for rank in stock]
    _assert_same_end(ours, stock)
    assert [rank["saves"] for rank in ours] == [rank["saves"] for rank in stock]
    assert ours[0]["saves"] > 0
    assert ours[1]["saves"] == 0
    saved = torch.load(sorted((tmp_path / "ours" / "checkpoints").glob("*.ckpt"))[-1], weights_only=True)
    assert len(saved["callbacks"]["MidEpochResume"]["ranks"]) == 2


def _epoch_samples(results, epoch: int) -> Counter:
    return Counter(i for result in results for e, _, ids in result["seen"] if e == epoch for i in ids)


@pytest.mark.parametrize(
    ("saved_on", "resumed_on", "crash"),
    [(2, 1, (1, 2)), (1, 2, (1, 4)), (2, 1, (1, 5))],
    ids=["2-to-1", "1-to-2", "2-to-1-at-the-epochs-last-batch"],
)
def test_elastic_resume_trains_every_remaining_sample_once(saved_on, resumed_on, crash, uninterrupted, tmp_path):
    config = {"dataset_size": DATASET, "hook_draws": False}
    _assert_transparent(uninterrupted, saved_on, config)
    interrupted = _train(tmp_path / "interrupted", saved_on, config, crash=crash)
    for rank, (before, full) in enumerate(zip(interrupted, uninterrupted(saved_on, config), strict=True)):
        assert before["seen"] == full["seen"][: len(before["seen"])], f"rank {rank} trained other batches"
    resumed = _train(tmp_path / "resumed", resumed_on, config, resume=tmp_path / "interrupted" / "crash.ckpt")
    epoch = crash[0]
    consumed, rest = _epoch_samples(interrupted, epoch), _epoch_samples(resumed, epoch)
    # every sample of the interrupted epoch exactly once: none replayed, none skipped
    assert consumed + rest == Counter(range(DATASET))
    # each rank's batches are the epoch's last ones: the epoch still ends at len(train_dataloader) batches
    batches_per_rank = -(-DATASET // resumed_on // 2)
    for result in resumed:
        indices = [batch_idx for e, batch_idx, _ in result["seen"] if e == epoch]
        assert indices == list(range(batches_per_rank - len(indices), batches_per_rank))
    # later epochs follow the new world size's normal order: a full epoch each
    assert _epoch_samples(resumed, epoch + 1) == Counter(range(DATASET))
    # each rank loads other batches than before, by design: the fingerprint of the last batch trained is not compared
    skipped = "the checkpoint's fingerprint of its last batch is not compared"
    fingerprinted = crash[1] < batches_per_rank_saved(saved_on) - 1  # (none at an epoch's last batch)
    assert any(skipped in message for message in resumed[0]["warnings"]) == fingerprinted


def batches_per_rank_saved(world_size: int) -> int:
    return -(-DATASET // world_size // 2)


def test_a_batch_that_differs_on_one_rank_stops_every_rank(tmp_path):
    """Rank 1 alone draws from a generator out of reach: with verify_batch="raise", rank 0 raises too, naming rank 1,
    after one collective, so that no rank is left waiting for another; neither trains on its batch."""
    config = {"dataset_size": DATASET, "pipeline": "module_on_rank_1", "augment": True, "max_epochs": 1}
    _train(tmp_path / "interrupted", 2, config, crash=(0, 2))
    out = tmp_path / "resumed"
    resume = tmp_path / "interrupted" / "crash.ckpt"
    command = _command(out, 2, config, resume=resume, extra=("--verify-batch", "raise"))
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    # (Lightning's launcher ends the other ranks once rank 0 raised: rank 1 may not have written its report)
    reports = [torch.load(path, weights_only=False) for path in sorted(out.glob("rank*.pt"))]
    assert reports[0]["world_size"] == 2
    for report in reports:
        assert "batch_idx 2 of epoch 0, loaded again by the resumed run, differs" in report["error"]
        assert "on rank(s) 1" in report["error"]
        assert report["seen"] == []


def _epoch_order(result, epoch: int) -> list[int]:
    return [i for e, _, ids in result["seen"] if e == epoch for i in ids]


def test_elastic_resume_rebuilds_the_order_from_the_samplers_generator(uninterrupted, tmp_path):
    """DataLoader(generator=g1) over RandomSampler(generator=g2), saved on 1 device, resumed on 2: the order is g2's."""
    config = {"dataset_size": DATASET, "hook_draws": False, "loader": "both_generators"}
    (full,) = uninterrupted(1, config)
    (interrupted,) = _train(tmp_path / "interrupted", 1, config, crash=(1, 4))
    resumed = _train(tmp_path / "resumed", 2, config, resume=tmp_path / "interrupted" / "crash.ckpt")
    order, consumed = _epoch_order(full, 1), _epoch_order(interrupted, 1)
    assert consumed == order[: len(consumed)] == order[:10]
    # the rest of the uninterrupted run's order, each sample once, laid out over the ranks as DistributedSampler does
    for rank, result in enumerate(resumed):
        assert _epoch_order(result, 1) == order[10:][rank::2], f"rank {rank} trained other samples"


def test_elastic_resume_inside_an_accumulation_group_warns_and_drops_the_partial_gradients(tmp_path):
    config = {"dataset_size": DATASET, "hook_draws": False, "accumulate_grad_batches": 4}
    interrupted = _train(tmp_path / "interrupted", 2, config, crash=(1, 1))  # batches 0, 1 of the group 0..3 done
    ranks = torch.load(tmp_path / "interrupted" / "crash.ckpt", weights_only=True)["callbacks"]["MidEpochResume"]
    assert all(rank["grads"] for rank in ranks["ranks"])  # each rank's partial gradients were saved
    (resumed,) = _train(tmp_path / "resumed", 1, config, resume=tmp_path / "interrupted" / "crash.ckpt")
    message = "inside a gradient accumulation group on another number of devices: the gradients accumulated so far"
    assert any(message in warning for warning in resumed["warnings"])
    # the data are still every remaining sample of the epoch once
    assert _epoch_samples(interrupted, 1) + _epoch_samples([resumed], 1) == Counter(range(DATASET))


def test_elastic_resume_twice_in_one_epoch(uninterrupted, tmp_path):
    """2 devices, then 1, then 2 again, all inside epoch 1: still every sample of that epoch once."""
    config = {"dataset_size": DATASET, "hook_draws": False}
    _assert_transparent(uninterrupted, 1, config)
    first = _train(tmp_path / "first", 2, config, crash=(1, 1))
    # on one device the rest of the epoch is its batches 4..11; crash after two of them
    second = _train(tmp_path / "second", 1, config, crash=(1, 5), resume=tmp_path / "first" / "crash.ckpt")
    third = _train(tmp_path / "third", 2, config, resume=tmp_path / "second" / "crash.ckpt")
    assert _epoch_samples(first, 1) + _epoch_samples(second, 1) + _epoch_samples(third, 1) == Counter(range(DATASET))
    assert _epoch_samples(second, 1).total() == 4


# Launchers that pickle the trainer into new processes: what a spawned rank receives must resume as a `ddp` rank does.
# `make test` runs `ddp_spawn`, `ddp_fork` and `ddp_notebook` once each.
@pytest.mark.parametrize(
    ("strategy", "config", "crash"),
    [
        ("ddp_spawn", {"dataset_size": DATASET}, (1, 2)),
        ("ddp_fork", {"dataset_size": DATASET}, (1, 2)),
        ("ddp_notebook", {"dataset_size": DATASET}, (0, 5)),
        # the sampler the user's loader holds, pickled with it
        pytest.param("ddp_spawn", {"dataset_size": DATASET, "loader": "distributed"}, (1, 3), marks=STRATEGIES_MATRIX),
    ],
    ids=["spawn", "fork", "notebook-epoch-end", "spawn-explicit-sampler"],
)
def test_resume_in_processes_that_received_a_pickled_trainer_is_exact_on_every_rank(
    strategy, config, crash, uninterrupted, tmp_path
):
    extra = ("--strategy", strategy)
    full = uninterrupted(2, config, extra=extra)
    # the ranks stop at the crash point by exiting, as killed ones do: the launching process then ends
    interrupted = _train(tmp_path / "interrupted", 2, config, crash=crash, extra=extra)
    ranks = torch.load(tmp_path / "interrupted" / "crash.ckpt", weights_only=True)["callbacks"]["MidEpochResume"]
    assert len(ranks["ranks"]) == 2
    resumed = _train(tmp_path / "resumed", 2, config, resume=tmp_path / "interrupted" / "crash.ckpt", extra=extra)
    _assert_same_continuation(full, interrupted, resumed)


FSDP = ("--strategy", "fsdp")


def _fsdp_runs_on_cpu() -> bool:
    """torch's FSDP creates its streams with a priority: on CPU that needs ``torch.cpu.Stream(priority=...)``, which
    older torch lacks (2.1, the lowest supported: "Stream() takes no arguments", `make floor`); 2.13 has it."""
    try:
        torch.cpu.Stream(priority=0)
    except TypeError:
        return False
    return True


# FSDP itself runs on the GPUs it is for; these tests run it on CPU (tests/ddp_job.py's CPUFSDPStrategy)
FSDP_ON_CPU = pytest.mark.skipif(
    not _fsdp_runs_on_cpu(),
    reason=f"torch {torch.__version__}'s FSDP cannot run on CPU (torch.cpu.Stream takes no priority)",
)


@FSDP_ON_CPU
@pytest.mark.parametrize(
    ("config", "crash"),
    [
        # the DistributedSampler Lightning injects (the id avoids `make compat`'s selection "injected")
        ({"dataset_size": DATASET}, (1, 2)),
        pytest.param(
            {"dataset_size": DATASET, "loader": "distributed", "num_workers": 2}, (0, 5), marks=STRATEGIES_MATRIX
        ),
    ],
    ids=["default-sampler", "explicit-sampler-workers-epoch-end"],
)
def test_fsdp_sharded_checkpoint_resumes_exactly_on_every_rank(config, crash, uninterrupted, tmp_path):
    """FSDP on CPU (tests/ddp_job.py's CPUFSDPStrategy, state_dict_type="sharded"): the checkpoint is a directory of
    shards; the callback's states travel in its metadata file, written by rank 0 with every rank's states."""
    _assert_transparent_with(uninterrupted, 2, config, FSDP)
    full = uninterrupted(2, config, extra=FSDP)
    interrupted = _train(tmp_path / "interrupted", 2, config, crash=crash, extra=FSDP)
    checkpoint = tmp_path / "interrupted" / "crash.ckpt"
    assert checkpoint.is_dir()
    ranks = torch.load(checkpoint / "meta.pt", weights_only=True)["callbacks"]["MidEpochResume"]["ranks"]
    assert len(ranks) == 2
    assert not torch.equal(ranks[0]["rng"]["torch"], ranks[1]["rng"]["torch"])
    resumed = _train(tmp_path / "resumed", 2, config, resume=checkpoint, extra=FSDP)
    _assert_same_continuation(full, interrupted, resumed)


@FSDP_ON_CPU
def test_fsdp_checkpoint_inside_an_accumulation_group_warns_and_keeps_the_order(uninterrupted, tmp_path):
    """FSDP's gradients inside an accumulation group are not shaped as the rank's sharded parameters: the resumed run
    drops them, warning before it trains; the batches and the random states still continue exactly."""
    config = {"dataset_size": DATASET, "accumulate_grad_batches": 4}
    full = uninterrupted(2, config, extra=FSDP)
    interrupted = _train(tmp_path / "interrupted", 2, config, crash=(1, 1), extra=FSDP)  # batches 0, 1 of 0..3 done
    ranks = torch.load(tmp_path / "interrupted" / "crash.ckpt" / "meta.pt", weights_only=True)
    assert all(rank["grads"] for rank in ranks["callbacks"]["MidEpochResume"]["ranks"])
    resumed = _train(tmp_path / "resumed", 2, config, resume=tmp_path / "interrupted" / "crash.ckpt", extra=FSDP)
    message = "inside a gradient accumulation group under a strategy that shards the parameters (FSDP)"
    assert any(message in warning for warning in resumed[0]["warnings"])
    for rank, (f, i, r) in enumerate(zip(full, interrupted, resumed, strict=True)):
        assert i["seen"] + r["seen"] == f["seen"], f"rank {rank} trained other batches"
        assert torch.equal(f["rng"]["torch"], r["rng"]["torch"]), f"rank {rank}: torch random state differs"
    assert any(not torch.equal(value, resumed[0]["params"][name]) for name, value in full[0]["params"].items())


def _assert_transparent_with(uninterrupted, devices: int, config: dict, extra: tuple[str, ...]) -> None:
    ours, stock = uninterrupted(devices, config, extra=extra), uninterrupted(devices, config, stock=True, extra=extra)
    assert [rank["seen"] for rank in ours] == [rank["seen"] for rank in stock]
    _assert_same_end(ours, stock)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _train_on_two_nodes(out: Path, config: dict, **options: Any) -> list:
    """One process per node, as a cluster's scheduler starts them: node ranks 0 and 1, one device each, meeting at
    the same address and port on this machine."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    command = _command(out, 1, config, extra=("--num-nodes", "2"), **options)
    nodes = [
        subprocess.Popen(command, env={**env, "NODE_RANK": str(node)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for node in (0, 1)
    ]
    outputs = [node.communicate(timeout=300)[0].decode()[-3000:] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(outputs)
    return _results(out, 2)


def test_two_nodes_resume_exactly_on_two_nodes_and_elastically_on_one(uninterrupted, tmp_path):
    """Two nodes simulated on one machine (`num_nodes=2`, node ranks 0 and 1 over localhost): a two-node job is the
    two-device job rank for rank; its mid-epoch checkpoint resumes exactly on two nodes and, on one node, trains every
    remaining sample of the epoch once."""
    config = {"dataset_size": DATASET, "hook_draws": False}
    full = _train_on_two_nodes(tmp_path / "full", config)
    assert [rank["world_size"] for rank in full] == [2, 2]
    assert [rank["seen"] for rank in full] == [rank["seen"] for rank in uninterrupted(2, config)]
    _assert_same_end(full, uninterrupted(2, config))
    interrupted = _train_on_two_nodes(tmp_path / "interrupted", config, crash=(1, 2))
    checkpoint = tmp_path / "interrupted" / "crash.ckpt"
    assert len(torch.load(checkpoint, weights_only=True)["callbacks"]["MidEpochResume"]["ranks"]) == 2
    again = _train_on_two_nodes(tmp_path / "again", config, resume=checkpoint)
    _assert_same_continuation(full, interrupted, again)
    (alone,) = _train(tmp_path / "alone", 1, config, resume=checkpoint)
    assert _epoch_samples(interrupted, 1) + _epoch_samples([alone], 1) == Counter(range(DATASET))
    assert _epoch_samples([alone], 2) == Counter(range(DATASET))
