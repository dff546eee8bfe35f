"""The package on a Lightning that carries the change: MidEpochResume steps aside, and nothing is done twice.

`make upstream-check` runs this module in .venv-upstream (the patched Lightning) with this checkout's src/ on
PYTHONPATH and the default delivery, so that the harness attaches MidEpochResume to its runs. On stock Lightning it
fails: the point is the patched one.
"""

from __future__ import annotations

import pytest
import torch

from harness import Config, CrashPoint, assert_exact, checkpoint_path, interrupt_and_resume
from lightning_midepoch import _compat

MID = CrashPoint("train_batch_end", epoch=1, batch=3)


@pytest.fixture(autouse=True)
def _patched_lightning() -> None:
    import lightning as L

    assert _compat.resumes_mid_epoch_itself(L.Trainer(logger=False)), (
        "this module checks the callback on a Lightning with upstream/*.patch applied (`make upstream-check`)"
    )


@pytest.mark.parametrize("config", [Config(), Config(num_workers=2), Config(combined="max_size_cycle")])
def test_the_resume_is_lightnings_own_and_exact(config, monkeypatch, tmp_path):
    # the callback checks no version (a release outside its range would otherwise be refused)
    monkeypatch.setattr(_compat, "check_supported", lambda trainer: pytest.fail("the version check ran"))
    # with and without the callback: the same run (harness.assert_transparent, in interrupt_and_resume)
    comparison = interrupt_and_resume(config, MID, tmp_path)
    assert_exact(comparison)
    checkpoint = torch.load(checkpoint_path(tmp_path / "interrupted", MID), weights_only=True)
    assert checkpoint["callbacks"]["MidEpochResume"]["ranks"] == []  # the callback recorded nothing
    assert checkpoint["loops"]["fit_loop"]["state_dict"]["train_order"]["ranks"]  # Lightning did
