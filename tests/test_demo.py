"""The README's demo, run for real: a training process is killed with SIGKILL and resumed from ``last.ckpt``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

DEMO = Path(__file__).resolve().parents[1] / "examples" / "demo.py"


@pytest.fixture(scope="module")
def demo_output(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    completed = subprocess.run(
        [sys.executable, str(DEMO), "--quick", "--out", str(out)], capture_output=True, text=True, timeout=600
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return out


def _steps(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "final.pt", weights_only=True)


def test_killed_with_sigkill_between_checkpoints(demo_output):
    killed = _steps(demo_output / "callback-killed")
    resumed = _steps(demo_output / "callback-resumed")
    # the process died after the last checkpoint it wrote: the resumed run starts at that checkpoint, mid-epoch
    assert killed[-1]["step"] >= resumed[0]["step"]
    assert resumed[0]["batch"] > 0
    assert (demo_output / "callback" / "checkpoints" / "last.ckpt").exists()


def test_resumed_run_equals_the_uninterrupted_one(demo_output):
    full = _steps(demo_output / "uninterrupted")
    resumed = _steps(demo_output / "callback-resumed")
    start = resumed[0]["step"]
    expected = [step for step in full if step["step"] >= start]
    assert [(s["epoch"], s["batch"], s["ids"]) for s in resumed] == [
        (s["epoch"], s["batch"], s["ids"]) for s in expected
    ]
    assert [s["loss"] for s in resumed] == [s["loss"] for s in expected]
    oracle, actual = _weights(demo_output / "uninterrupted"), _weights(demo_output / "callback-resumed")
    assert all(torch.equal(oracle[name], actual[name]) for name in oracle)


def test_stock_lightning_trains_the_rest_of_the_epoch_on_the_wrong_data(demo_output):
    full = _steps(demo_output / "uninterrupted")
    resumed = _steps(demo_output / "stock-resumed")
    start = resumed[0]["step"]
    expected = [step for step in full if step["step"] >= start]
    assert [s["ids"] for s in resumed] != [s["ids"] for s in expected]
    oracle, actual = _weights(demo_output / "uninterrupted"), _weights(demo_output / "stock-resumed")
    assert not all(torch.equal(oracle[name], actual[name]) for name in oracle)


def test_report_and_plot(demo_output):
    report = json.loads((demo_output / "report.json").read_text())
    ours, stock = report["results"]
    assert ours["weights_equal"]
    assert not stock["weights_equal"]
    assert ours["samples_replayed_in_epoch"] == ours["samples_never_seen_in_epoch"] == 0
    assert stock["samples_replayed_in_epoch"] > 0
    assert (demo_output / "loss_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
