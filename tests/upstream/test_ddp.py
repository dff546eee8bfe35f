"""Exact mid-epoch resume under DDP: two CPU processes (gloo), each rank continuing as the uninterrupted run did.

`make upstream-check` runs this module with ``MIDEPOCH_DELIVERY=lightning`` on a Lightning with upstream/*.patch
applied: tests/ddp_job.py (which Lightning's DDP launcher runs once per rank, the environment inherited) attaches no
callback, and the patched fit loop gathers every rank's random states and train order into the checkpoint's
``loops.fit_loop.state_dict.train_order``. In the default mode (``MIDEPOCH_DELIVERY=callback``) the same cases run
with ``MidEpochResume`` attached, whose state sits in ``callbacks.MidEpochResume``: that shows the cases are sound.

Each case trains uninterrupted, crashes at a checkpoint (every rank writes ``crash.ckpt`` in ``on_train_batch_end``
and stops) and resumes from it in processes whose random states were scrambled, then compares rank by rank: the
batches trained, the final parameters bit for bit, the torch, numpy and python random states. The helpers are copied
from tests/test_distributed.py, which this environment cannot import (it needs lightning_midepoch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from harness import DELIVERY

JOB = Path(__file__).resolve().parent.parent / "ddp_job.py"
DEVICES = 2
DATASET = 24  # 12 samples (6 batches of 2) per rank on 2 devices: no padding


def _command(out: Path, config: dict, crash: tuple[int, int] | None = None, resume: Path | None = None) -> list[str]:
    # in the default (callback) delivery ddp_job.py attaches MidEpochResume (no --stock); in the lightning delivery
    # it attaches nothing
    command = [sys.executable, str(JOB), str(out), "--devices", str(DEVICES), "--config", json.dumps(config)]
    if crash is not None:
        command += ["--crash", str(crash[0]), str(crash[1])]
    if resume is not None:
        command += ["--resume", str(resume)]
    return command


def _train(out: Path, config: dict, **options: Any) -> list:
    """One DDP run of tests/ddp_job.py; every rank's report (``rank{r}.pt``)."""
    # the environment is inherited (the ranks Lightning launches inherit it in turn), with this module's delivery
    env = {**os.environ, "MIDEPOCH_DELIVERY": DELIVERY}
    completed = subprocess.run(
        _command(out, config, **options), capture_output=True, text=True, timeout=300, env=env, check=False
    )
    # every rank exits 0, as stock's do: an abort in the teardown (gloo's "terminate called without an active
    # exception") is a failure, even after the reports were written
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    results = [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(DEVICES)]
    assert [result["world_size"] for result in results] == [DEVICES] * DEVICES
    return results


def _assert_same_end(first, second) -> None:
    for rank, (f, s) in enumerate(zip(first, second, strict=True)):
        for name, value in f["params"].items():
            assert torch.equal(value, s["params"][name]), f"rank {rank}: {name} differs"
        assert torch.equal(f["rng"]["torch"], s["rng"]["torch"]), f"rank {rank}: torch random state differs"
        assert (f["rng"]["numpy"] == s["rng"]["numpy"]).all(), f"rank {rank}: numpy random state differs"
        assert f["rng"]["python"] == s["rng"]["python"], f"rank {rank}: python random state differs"


def _assert_same_continuation(full, interrupted, resumed) -> None:
    for rank, (f, i, r) in enumerate(zip(full, interrupted, resumed, strict=True)):
        assert i["seen"], f"rank {rank} trained nothing before the crash"
        assert r["seen"], f"rank {rank} trained nothing after the resume"
        assert i["seen"] + r["seen"] == f["seen"], f"rank {rank} trained other batches"
    _assert_same_end(full, resumed)


def _saved_ranks(checkpoint: dict[str, Any]) -> list:
    """Every rank's part of the resume state in the checkpoint: the patched fit loop's, or the callback's."""
    fit_loop = checkpoint["loops"]["fit_loop"]["state_dict"]
    if DELIVERY == "lightning":
        assert "MidEpochResume" not in checkpoint["callbacks"], "no callback is attached in the lightning delivery"
        ranks = fit_loop["train_order"]["ranks"]  # by global rank, each with its process-wide random states
        return [{"rng": ranks[rank]["random_states"]} for rank in sorted(ranks)]
    assert "train_order" not in fit_loop, "stock Lightning (the callback delivery) saves no train order"
    return checkpoint["callbacks"]["MidEpochResume"]["ranks"]


def _torch_states_equal(first: Any, second: Any) -> bool:
    """The patched Lightning saves a torch state as bytes (a primitive), the callback as a tensor."""
    if isinstance(first, torch.Tensor):
        return isinstance(second, torch.Tensor) and torch.equal(first, second)
    return bool(first == second)


@pytest.mark.parametrize(
    ("config", "crash"),
    [
        # the DistributedSampler Lightning injects for shuffle=True
        ({"dataset_size": DATASET}, (1, 2)),
        # an explicit DistributedSampler with workers, interrupted at an epoch's last batch: the next epoch's
        # iterator must see set_epoch before its workers prefetch
        ({"dataset_size": DATASET, "loader": "distributed", "num_workers": 2}, (0, 5)),
    ],
    ids=["injected-sampler", "explicit-sampler-workers-epoch-end"],
)
def test_ddp_resume_is_exact_on_every_rank(config, crash, tmp_path):
    full = _train(tmp_path / "full", config)
    interrupted = _train(tmp_path / "interrupted", config, crash=crash)
    checkpoint_path = tmp_path / "interrupted" / "crash.ckpt"
    checkpoint = torch.load(checkpoint_path, weights_only=True)  # primitives and tensors only
    ranks = _saved_ranks(checkpoint)
    assert len(ranks) == DEVICES
    # each rank's own states were gathered (DivergeRanks gives every rank its own streams)
    assert all(rank is not None for rank in ranks)
    assert not _torch_states_equal(ranks[0]["rng"]["torch"], ranks[1]["rng"]["torch"])
    resumed = _train(tmp_path / "resumed", config, resume=checkpoint_path)
    _assert_same_continuation(full, interrupted, resumed)
