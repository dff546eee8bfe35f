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


@pytest.mark.parametrize("entry", MANIFEST, ids=[entry["file"] for entry in MANIFEST])
def test_legacy_checkpoint_resumes_exactly(entry, tmp_path):
    full = train(entry["case"], tmp_path / "full")
    resumed = train(entry["case"], tmp_path / "resumed", ckpt_path=CHECKPOINTS / entry["file"])
    assert resumed.seen == full.seen[entry["batches_before"] :]
    for (name, expected), actual in zip(full.named_parameters(), resumed.parameters()):
        assert torch.equal(expected, actual), name
