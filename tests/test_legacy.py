"""Checkpoints written by earlier releases of this package, and with the oldest supported Lightning, still resume
exactly with the current code."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "legacy"))

from frozen import train

CHECKPOINTS = Path(__file__).resolve().parent / "legacy" / "checkpoints"
MANIFEST = json.loads((CHECKPOINTS / "manifest.json").read_text())


def test_every_supported_lightning_wrote_legacy_checkpoints():
    assert {entry["lightning_version"] for entry in MANIFEST} >= {"2.5.0", "2.6.6"}


def _with_this_machines_floats(entry: dict, tmp_path: Path) -> Path:
    """The legacy checkpoint, with the weights, optimizer and partial gradients this machine computes at its point.

    Floating-point results differ between CPUs (vector kernels): a checkpoint written elsewhere cannot be continued
    bitwise here. What a legacy checkpoint must still carry over exactly is everything else: Lightning's loop state
    and the MidEpochResume state (random states, order records, positions), which are kept.
    """
    here_path = tmp_path / "here.ckpt"
    train(entry["case"], tmp_path / "here", save_to=here_path)
    here = torch.load(here_path, weights_only=True)
    legacy = torch.load(CHECKPOINTS / entry["file"], weights_only=True)
    for key in ("state_dict", "optimizer_states", "lr_schedulers"):
        legacy[key] = here[key]
    ours, theirs = here["callbacks"]["MidEpochResume"]["ranks"], legacy["callbacks"]["MidEpochResume"]["ranks"]
    for rank_here, rank_legacy in zip(ours, theirs, strict=True):
        assert (rank_legacy["grads"] is None) == (rank_here["grads"] is None)
        rank_legacy["grads"] = rank_here["grads"]
    path = tmp_path / entry["file"]
    torch.save(legacy, path)
    return path


@pytest.mark.parametrize("entry", MANIFEST, ids=[entry["file"] for entry in MANIFEST])
def test_legacy_checkpoint_resumes_exactly(entry, tmp_path):
    full = train(entry["case"], tmp_path / "full")
    resumed = train(entry["case"], tmp_path / "resumed", ckpt_path=_with_this_machines_floats(entry, tmp_path))
    assert resumed.seen == full.seen[entry["batches_before"] :]
    for (name, expected), actual in zip(full.named_parameters(), resumed.parameters(), strict=True):
        assert torch.equal(expected, actual), name
