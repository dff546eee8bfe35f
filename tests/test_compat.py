"""The supported-Lightning check and the accessors of Lightning's private names (the names: test_private.py)."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
import warnings
from types import SimpleNamespace

import lightning
import lightning.pytorch as pl_new
import pytest

from conftest import require
from lightning_midepoch import _compat, _fingerprints, _private


def _trainer() -> pl_new.Trainer:
    return pl_new.Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False)


def test_installed_lightning_is_supported():
    _compat.check_supported(_trainer())


@pytest.mark.parametrize("version", ["2.4.0", "2.7.0", "3.0.0"])
def test_an_unsupported_version_runs_with_a_warning_naming_it(version, monkeypatch):
    monkeypatch.delenv(_compat.UNVERIFIED_ENV, raising=False)
    monkeypatch.setattr(lightning, "__version__", version)
    with pytest.warns(UserWarning, match=rf"supports lightning >=2.5.0,<2.7.0, but lightning {version} is installed"):
        assert _compat.check_supported(_trainer()) == ""


def test_missing_private_names_are_listed(monkeypatch):
    trainer = _trainer()
    stripped = SimpleNamespace(**{k: v for k, v in vars(trainer.fit_loop).items() if k != "_combined_loader"})
    stripped.epoch_loop = SimpleNamespace()
    monkeypatch.setattr(type(trainer), "fit_loop", property(lambda self: stripped), raising=False)
    aside = _compat.check_supported(trainer)
    assert re.search(r"lack fit_loop\._combined_loader, .*epoch_loop\._batches_that_stepped", aside)


def test_namespace():
    import pytorch_lightning

    assert _compat.namespace(_trainer()) == "lightning"
    assert _compat.namespace(pytorch_lightning.Trainer(logger=False, enable_progress_bar=False)) == "pytorch_lightning"
    assert _compat.namespace(object()) == "lightning"


def test_warn_once_per_set():
    seen: set[str] = set()
    trainer = _trainer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _compat.warn("hello", trainer, seen)
        _compat.warn("hello", trainer, seen)
    assert [str(w.message) for w in caught] == ["hello"]


def test_stock_warning_suppressed_only_that_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _compat.stock_warning_suppressed():
            warnings.warn(
                _compat.STOCK_NOT_RESUMABLE_WARNING + " and your dataloader is not resumable.",
                UserWarning,
                stacklevel=1,
            )
            warnings.warn("something else", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["something else"]


def test_importing_the_package_changes_no_lightning_class():
    """Lightning's classes stay untouched at import: compared attribute by attribute in a fresh interpreter."""
    import subprocess
    import sys

    script = (
        "import lightning.pytorch as pl, pytorch_lightning as ptl\n"
        "from lightning.pytorch.loops import fit_loop, training_epoch_loop, fetchers\n"
        "from pytorch_lightning.loops import fit_loop as pfit\n"
        "classes = [fit_loop._FitLoop, training_epoch_loop._TrainingEpochLoop, fetchers._DataFetcher,\n"
        "           fetchers._PrefetchDataFetcher, pl.Trainer, pl.Callback, pfit._FitLoop, ptl.Trainer]\n"
        "import torch.utils.data as data\n"
        "classes += [data.DataLoader, data.BatchSampler, data.RandomSampler, data.DistributedSampler]\n"
        "before = [dict(vars(c)) for c in classes]\n"
        "import lightning_midepoch\n"
        "assert [dict(vars(c)) for c in classes] == before\n"
        "print('untouched')\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert completed.stdout.strip() == "untouched", completed.stderr[-2000:]


def test_check_fetcher_names_what_is_missing():
    from lightning.pytorch.loops.fetchers import _PrefetchDataFetcher
    from lightning.pytorch.utilities import CombinedLoader

    fetcher = _PrefetchDataFetcher()
    fetcher.setup(CombinedLoader([[1, 2]]))
    _compat.check_fetcher(fetcher)
    del fetcher.fetched
    fetcher._combined_loader._limits = None
    del fetcher._combined_loader._limits
    with pytest.raises(RuntimeError, match=r"train data fetcher lacks fetcher\.fetched, combined_loader\._limits"):
        _compat.check_fetcher(fetcher)


def _changed_on_run_start(self, data_fetcher):
    """Like the stock method, plus one line: a release that changed it."""
    if self.trainer.current_epoch > 0 and not self.restarting:
        iter(data_fetcher)
    data_fetcher.fetched += self.batch_progress.current.ready + 1


def _replacements() -> dict[str, object]:
    namespace: dict[str, object] = {}
    exec("def on_run_start(self, data_fetcher):\n    pass\n", namespace)  # no source file to read
    return {
        "changed": _changed_on_run_start,
        "without source": namespace["on_run_start"],
        "not a function": functools.partial(_changed_on_run_start),
    }


@pytest.mark.parametrize("kind", ["changed", "without source", "not a function", "removed"])
def test_a_changed_stock_method_is_a_warning_naming_it(kind, monkeypatch):
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    monkeypatch.delenv(_compat.UNVERIFIED_ENV, raising=False)
    if kind == "removed":
        monkeypatch.delattr(_TrainingEpochLoop, "on_run_start")
    else:
        monkeypatch.setattr(_TrainingEpochLoop, "on_run_start", _replacements()[kind])
    with pytest.warns(UserWarning, match="has not been checked against") as warned:
        aside = _compat.check_supported(_trainer())
    # a method the overrides call that is gone altogether: the callback steps aside for the fit (its reason)
    assert ("epoch_loop.on_run_start" in aside) == (kind == "removed")
    assert aside == "" or kind == "removed"
    message = str(warned[0].message)
    assert f"has not been checked against lightning {lightning.__version__}" in message
    assert "`_TrainingEpochLoop.on_run_start` (lightning.pytorch.loops.training_epoch_loop) differs" in message
    assert "supported range lightning>=2.5.0,<2.7.0" in message
    assert f"pip install 'lightning>=2.5.0,<2.7.0'`, {_fingerprints.CHECKED}" in message
    assert "MidEpochResume runs anyway" in message


def test_every_changed_method_is_named(monkeypatch):
    from lightning.pytorch.loops.fetchers import _DataFetcher
    from lightning.pytorch.loops.fit_loop import _FitLoop

    monkeypatch.delenv(_compat.UNVERIFIED_ENV, raising=False)
    monkeypatch.setattr(_FitLoop, "setup_data", _changed_on_run_start)
    monkeypatch.setattr(_DataFetcher, "__iter__", _changed_on_run_start)
    with pytest.warns(UserWarning, match=r"its `_FitLoop.setup_data` \(.*\), `_DataFetcher.__iter__` \(.*\) differ "):
        _compat.check_supported(_trainer())


def test_an_unchecked_release_runs_with_a_warning_naming_what_differs(monkeypatch, tmp_path):
    """Issue 35's row of Lightning's next release: never refused; stock's run, and an exact resume, with a warning."""
    from lightning.pytorch.loops.fit_loop import _FitLoop

    from harness import Config, CrashPoint, assert_exact, interrupt_and_resume

    stock = _FitLoop.on_advance_end

    def on_advance_end(self: _FitLoop) -> None:  # the stock method in another release's words: it differs
        stock(self)

    monkeypatch.delenv(_compat.UNVERIFIED_ENV, raising=False)
    monkeypatch.setattr(_FitLoop, "on_advance_end", on_advance_end)
    with pytest.warns(UserWarning, match=r"`_FitLoop.on_advance_end` \(lightning.pytorch.loops.fit_loop\) differs"):
        # the uninterrupted run is compared with stock's, the resume with the uninterrupted run
        comparison = interrupt_and_resume(Config(max_epochs=2), CrashPoint("train_batch_end", 1, 3), tmp_path)
    assert_exact(comparison)


def test_a_trainer_without_a_name_the_overrides_use_is_left_to_lightning(monkeypatch, tmp_path):
    """The callback steps aside, with a warning: the fit is stock Lightning's, its resume too (with stock's warning)."""
    from harness import Config, CrashPoint, interrupt_and_resume

    monkeypatch.setitem(_private.REQUIRED_ATTRIBUTES, "fit_loop", ("_no_such_attribute",))
    config = Config(max_epochs=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = interrupt_and_resume(config, CrashPoint("train_batch_end", 1, 3), tmp_path / "ours")
    stock = interrupt_and_resume(config, CrashPoint("train_batch_end", 1, 3), tmp_path / "stock", callback=False)
    messages = [str(warning.message) for warning in caught]
    aside = "MidEpochResume steps aside for this fit: the trainer's loops lack fit_loop._no_such"
    assert any(aside in message for message in messages)
    assert any("resuming from a checkpoint that ended before the epoch ended" in m for m in messages)
    assert ours.resumed.seen == stock.resumed.seen


@pytest.mark.parametrize("problem", ["changed method", "version"])
def test_the_note_turns_the_warning_into_information(problem, monkeypatch):
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    monkeypatch.setenv(_compat.UNVERIFIED_ENV, "1")
    if problem == "version":
        monkeypatch.setattr(lightning, "__version__", "2.7.0")
    else:
        monkeypatch.setattr(_TrainingEpochLoop, "on_run_start", _changed_on_run_start)
    told: list[str] = []
    monkeypatch.setattr(_compat, "info", lambda message, trainer: told.append(message))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _compat.check_supported(_trainer()) == ""
    assert len(told) == 1
    assert f"{_compat.UNVERIFIED_ENV}=1" in told[0]


def test_a_missing_test_dependency_fails_under_make_test_and_is_skipped_elsewhere(monkeypatch):
    missing = "lightning_midepoch_no_such_library"
    monkeypatch.setenv("MIDEPOCH_REQUIRE_TEST_DEPS", "1")  # as `make test` sets it
    with pytest.raises(pytest.fail.Exception, match=rf"{missing} cannot be imported .* `make test` installs"):
        require(missing)
    assert require("json") is importlib.import_module("json")
    monkeypatch.delenv("MIDEPOCH_REQUIRE_TEST_DEPS")  # `make compat`: a library its environment lacks is skipped
    with pytest.raises(pytest.skip.Exception, match=missing):
        require(missing)


def test_a_torch_without_a_private_name_the_worker_recording_uses_is_left_to_lightning(monkeypatch):
    import lightning as L
    from torch.utils.data import dataloader

    monkeypatch.delattr(dataloader._MultiProcessingDataLoaderIter, "_process_data")
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert "lacks _MultiProcessingDataLoaderIter._process_data" in _compat.check_supported(trainer)
