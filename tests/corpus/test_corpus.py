"""The corpus of real projects (tests/corpus/projects): each one's fits compared by tests/corpus/runner.py.

`make corpus` runs every project and writes the table (corpus-results/); `make test` runs a seeded sample of three
(``MIDEPOCH_CORPUS_SAMPLE``/``MIDEPOCH_CORPUS_SEED``, tests/conftest.py). A project marked pending (its ``PENDING``
says which finding of the package it waits for) fails until that fix lands and is never in the sample.
"""

from __future__ import annotations

import json
import os
import sys
import types
import warnings
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from corpus import runner
from corpus.projects import lightning_autoencoder

OUT_VARIABLE = "MIDEPOCH_CORPUS_OUT"
#: set (`make corpus`): also resume stock Lightning at the same moments, for the table's last column
STOCK_VARIABLE = "MIDEPOCH_CORPUS_STOCK"


def _cases() -> list:
    cases = []
    for name in runner.project_names():
        pending = getattr(runner.load(name), "PENDING", None)
        marks = [pytest.mark.corpus, *([pytest.mark.corpus_pending] if pending else [])]
        cases.append(pytest.param(name, marks=marks, id=name))
    return cases


@pytest.mark.parametrize("name", _cases())
def test_project(name: str, tmp_path: Path) -> None:
    """Uninterrupted with the callback is stock's run; each of three resumes is exact, warned before, or an error."""
    result = runner.check(name, tmp_path, compare_stock=os.environ.get(STOCK_VARIABLE) == "1")
    out = os.environ.get(OUT_VARIABLE)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{name}.json").write_text(json.dumps(asdict(result), indent=1))
    assert result.ok, result.explain()


def test_the_corpus_is_large_enough() -> None:
    """Issue 35 asks for at least 12 projects, each naming the public project it follows."""
    names = runner.project_names()
    assert len(names) >= 12
    for name in names:
        project = runner.load(name)
        assert project.FOLLOWS.strip(), name
        assert "Kept:" in (project.__doc__ or ""), f"{name}: say what was kept from the original"


# ---------------------------------------------------------------- the runner finds what it must find
def test_a_stock_resume_is_warned_mid_epoch_and_silently_inexact_at_an_epochs_end(tmp_path: Path) -> None:
    """Written and resumed without the callback (stock Lightning), the GAN example warns "not resumable" before
    training mid-epoch; at an epoch's last batch stock warns nothing and the next epoch's shuffle differs: FAIL."""
    result = runner.check("lightning_gan", tmp_path, with_callback=False)
    outcomes = {resume.moment: resume for resume in result.resumes}
    for moment in ("early", "mid-epoch"):
        assert outcomes[moment].outcome == "warned"
        assert any("not resumable" in warning for warning in outcomes[moment].warnings_before)
    assert outcomes["epoch's last batch"].outcome == "FAIL"
    assert "silently inexact" in outcomes["epoch's last batch"].detail
    assert not result.ok


class _HiddenState(lightning_autoencoder.LitAutoEncoder):
    """Scales its loss by a count kept outside the checkpoint: a resume starts it again from 0."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def training_step(self, batch, batch_idx):
        self.calls += 1
        return super().training_step(batch, batch_idx) * (1 + self.calls % 3)


def _hidden_state_main(run: runner.Run) -> None:
    lightning_autoencoder.L.seed_everything(42)
    trainer = run.trainer(max_epochs=2)
    run.fit(trainer, _HiddenState(), datamodule=lightning_autoencoder.MyDataModule())


def test_a_silently_inexact_resume_fails(tmp_path: Path) -> None:
    """Same batches, different weights and no warning: the runner reports FAIL, naming what differs."""
    project = types.ModuleType("hidden_state")
    project.FOLLOWS, project.main = "a test of the runner", _hidden_state_main
    result = runner.check(project, tmp_path)
    assert result.transparent
    assert [resume.outcome for resume in result.resumes] == ["FAIL"] * 3
    assert all("silently inexact" in r.detail and "weights differ" in r.detail for r in result.resumes)


def _data_differs_main(run: runner.Run) -> None:
    lightning_autoencoder.L.seed_everything(42)
    trainer = run.trainer(max_epochs=2)
    # without the callback the two fits' loaders differ (a stand-in for a callback that changes the data)
    data = torch.rand(24, 1, 8, 8) + (0 if run.callback else 1)
    loader = DataLoader(list(zip(data, range(24), strict=True)), batch_size=4, shuffle=True)
    run.fit(trainer, lightning_autoencoder.LitAutoEncoder(), train_dataloaders=loader)


def test_an_uninterrupted_fit_that_differs_from_stock_fails(tmp_path: Path) -> None:
    project = types.ModuleType("data_differs")
    project.FOLLOWS, project.main = "a test of the runner", _data_differs_main
    result = runner.check(project, tmp_path)
    assert not result.transparent
    assert "batches differ" in result.transparency[0]
    assert not result.ok


def _extra_file_main(run: runner.Run) -> None:
    lightning_autoencoder.L.seed_everything(42)
    if run.callback:  # a stand-in for a callback that writes a file stock does not
        (run.root / "extra.txt").write_text("written with the callback only")
    trainer = run.trainer(max_epochs=1)
    run.fit(trainer, lightning_autoencoder.LitAutoEncoder(), datamodule=lightning_autoencoder.MyDataModule())


def test_a_fit_that_leaves_other_files_than_stock_fails(tmp_path: Path) -> None:
    project = types.ModuleType("extra_file")
    project.FOLLOWS, project.main = "a test of the runner", _extra_file_main
    result = runner.check(project, tmp_path)
    assert not result.transparent
    assert result.transparency == ["files differ (extra.txt in one run only)"]


def test_a_warning_counts_for_its_words_not_for_its_paths(tmp_path: Path) -> None:
    run = runner.Run(tmp_path / "resumed-here", callback=True)
    for message in ("The folder /tmp/resumed-here/ckpts exists and is not empty.", "Resuming from the start."):
        run.caught.append(warnings.WarningMessage(UserWarning(message), UserWarning, __file__, 1))
    assert runner._resume_warnings(run) == (["UserWarning: Resuming from the start."], [])


def test_digest_names_bytes_and_structure() -> None:
    assert runner.digest({"a": torch.tensor([1.0])}) == runner.digest({"a": torch.ones(1)})
    assert runner.digest({"a": torch.tensor([1.0])}) != runner.digest({"a": torch.tensor([1.0], dtype=torch.float64)})
    assert runner.digest([torch.tensor([0.0])]) != runner.digest([torch.tensor([-0.0])])
    assert runner.digest((1, 2)) != runner.digest((2, 1))


def test_the_runner_runs_as_a_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["runner.py"])
    assert runner.main(["lightning_autoencoder", "--out", str(tmp_path)]) == 0
    assert "| lightning_autoencoder |" in capsys.readouterr().out
    assert json.loads((tmp_path / "lightning_autoencoder.json").read_text())["transparent"]
