"""Trainer-level exactness: an interrupted-and-resumed run equals the uninterrupted one, configuration by configuration."""

from __future__ import annotations

import pytest
from harness import Config, CrashPoint, assert_exact, interrupt_and_resume

MID = CrashPoint("train_batch_end", epoch=1, batch=3)
EARLY = CrashPoint("train_batch_end", epoch=0, batch=0)
LAST_BATCH = CrashPoint("train_batch_end", epoch=1, batch=9)
EPOCH_END = CrashPoint("train_epoch_end", epoch=0)
CRASH_POINTS = [MID, EARLY, LAST_BATCH, EPOCH_END]


@pytest.mark.parametrize("crash", CRASH_POINTS, ids=["mid", "first-batch", "last-batch", "epoch-end"])
@pytest.mark.parametrize("loader", ["shuffle", "sequential", "sampler_generator", "loader_generator", "distributed",
                                    "batch_sampler_numpy", "batch_sampler_python", "batch_sampler_torch", "subclass"])
def test_samplers(loader, crash, tmp_path):
    assert_exact(interrupt_and_resume(Config(loader=loader), crash, tmp_path))
