"""Where a resumed run continues: a changed order setting is a clear error, or a warning with the opt-out."""

from __future__ import annotations

import re

import pytest

from harness import Config, CrashPoint, interrupted_checkpoint, resume_warnings, run
from lightning_midepoch import MidEpochResumeError

MID = CrashPoint("train_batch_end", epoch=1, batch=3)


CHANGED_SETTINGS = [
    (
        Config(combined="max_size_cycle"),
        Config(combined="max_size"),
        "combined in mode 'max_size_cycle' but the current run combines them in mode 'max_size'",
    ),
    (
        Config(loader="shuffle"),
        Config(loader="replacement"),
        r"RandomSampler\(replacement=False\) but the current one has RandomSampler\(replacement=True\)",
    ),
]


@pytest.mark.parametrize(("saved", "current", "message"), CHANGED_SETTINGS, ids=["mode", "replacement"])
def test_a_changed_order_setting_is_a_clear_error(saved, current, message, tmp_path):
    ckpt = interrupted_checkpoint(saved, tmp_path, MID)
    with pytest.raises(MidEpochResumeError, match=message):
        run(current, tmp_path / "resumed", ckpt_path=ckpt, seed=2)


@pytest.mark.parametrize(("saved", "current", "message"), CHANGED_SETTINGS, ids=["mode", "replacement"])
def test_a_changed_order_setting_warns_with_the_opt_out(saved, current, message, tmp_path):
    messages = resume_warnings(
        current, interrupted_checkpoint(saved, tmp_path, MID), tmp_path, on_mismatch="restart_epoch"
    )
    assert any(m for m in messages if "on_mismatch='restart_epoch'" in m and re.search(message, m))
