"""The public callback: invisible until needed, clear on bad input, never touching a user's checkpoint."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.loops.fetchers import _DataFetcher, _PrefetchDataFetcher
from lightning.pytorch.loops.fit_loop import _FitLoop
from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
from torch.utils.data import DataLoader

from harness import (
    Comparison,
    Config,
    CrashPoint,
    IndexedDataset,
    Model,
    _equal,
    assert_exact,
    checkpoint_path,
    interrupt_and_resume,
    run,
    uninterrupted,
)
from lightning_midepoch import MidEpochResume, MidEpochResumeError
from lightning_midepoch._compat import STOCK_NOT_RESUMABLE_WARNING

MID = CrashPoint("train_batch_end", epoch=1, batch=3)


@pytest.mark.parametrize(
    "config",
    [
        Config(),
        Config(num_workers=2),
        Config(num_workers=2, persistent_workers=True, loader="loader_generator"),
        Config(validation=True, val_check_interval=0.5),
        Config(combined="max_size_cycle", accumulate_grad_batches=2),
        Config(loader="batch_sampler_numpy", reload_every_n=1),
    ],
)
def test_invisible_in_an_uninterrupted_run(config, tmp_path):
    """Attaching the callback changes nothing: same batches, same weights, same random streams."""
    with_callback = run(config, tmp_path / "with", callback=True)
    without = run(config, tmp_path / "without", callback=False)
    assert with_callback.seen == without.seen
    for expected, actual in zip(without.model.parameters(), with_callback.model.parameters(), strict=True):
        assert torch.equal(expected, actual)
    assert torch.equal(with_callback.rng["torch"], without.rng["torch"])
    assert _equal(with_callback.rng["numpy"], without.rng["numpy"])
    assert with_callback.rng["python"] == without.rng["python"]


class _Batches:
    """An iterable of ready batches with a length, not a DataLoader."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches = batches

    def __iter__(self) -> Any:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


@pytest.mark.parametrize("kind", ["sized", "generator"])
def test_invisible_with_a_train_loader_that_is_not_a_dataloader(kind, tmp_path):
    """Lightning trains on any iterable of batches (found by Lightning's own tests with the callback attached)."""
    batches = list(DataLoader(IndexedDataset(12), batch_size=2))

    def loader() -> Any:
        return _Batches(batches) if kind == "sized" else (batch for batch in batches)

    def use_loader(trainer: L.Trainer, model: L.LightningModule) -> None:
        model.train_dataloader = loader  # type: ignore[method-assign]

    config = Config(max_epochs=1)
    with_callback = run(config, tmp_path / "with", callback=True, before_fit=use_loader)
    without = run(config, tmp_path / "without", callback=False, before_fit=use_loader)
    assert len(with_callback.seen) == len(batches)
    assert with_callback.seen == without.seen
    for expected, actual in zip(without.model.parameters(), with_callback.model.parameters(), strict=True):
        assert torch.equal(expected, actual)


def _resume_warnings(tmp_path, callback: bool) -> list[str]:
    interrupted = run(Config(), tmp_path / "interrupted", callback=callback, crash=MID)
    assert interrupted.crashed
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(Config(), tmp_path / "resumed", callback=callback, ckpt_path=checkpoint_path(tmp_path / "interrupted", MID))
    return [str(w.message) for w in caught]


def test_stock_warning_fires_without_the_callback(tmp_path):
    assert any(STOCK_NOT_RESUMABLE_WARNING in message for message in _resume_warnings(tmp_path, callback=False))


def test_stock_warning_does_not_fire_with_the_callback(tmp_path):
    messages = _resume_warnings(tmp_path, callback=True)
    assert not any(STOCK_NOT_RESUMABLE_WARNING in message for message in messages)
    assert not any("MidEpochResume" in message or "cannot be recovered" in message for message in messages)


def _profiled_hooks(callback: L.Callback, tmp_path: Path, **config: Any) -> set[str]:
    """The callback hooks Lightning called in a fit (the sections its simple profiler records)."""
    result = run(Config(**config), tmp_path, callback=False, extra_callbacks=[callback], profiler="simple")
    prefix = f"[Callback]{callback.state_key}."
    return {name[len(prefix) :] for name in result.trainer.profiler.recorded_durations if name.startswith(prefix)}


def test_lightning_calls_the_callbacks_hooks_as_it_calls_an_empty_callbacks(tmp_path):
    """Nothing of the callback is hidden from Lightning: the same hooks run, each in its profiler section."""
    stock = _profiled_hooks(L.Callback(), tmp_path / "stock")
    assert {"on_train_batch_start", "on_train_batch_end", "on_after_backward"} <= stock
    assert _profiled_hooks(MidEpochResume(), tmp_path / "ours") == stock


class _CountingResume(MidEpochResume):
    """A user's subclass that uses per-batch hooks, calling the callback's own through super()."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = {"on_train_batch_end": 0, "on_after_backward": 0}

    def on_train_batch_end(self, *args: Any) -> None:
        super().on_train_batch_end(*args)
        self.calls["on_train_batch_end"] += 1

    def on_after_backward(self, *args: Any) -> None:
        super().on_after_backward(*args)
        self.calls["on_after_backward"] += 1


def test_a_subclass_keeps_the_per_batch_hooks_it_overrides(tmp_path):
    callback = _CountingResume()
    result = run(Config(), tmp_path, callback=False, extra_callbacks=[callback])
    batches = len(result.seen)
    assert callback.calls == {"on_train_batch_end": batches, "on_after_backward": batches}


class _LoopTypes(L.Callback):
    def on_train_epoch_start(self, trainer, pl_module):
        self.types = (type(trainer.fit_loop), type(trainer.fit_loop.epoch_loop), type(trainer.fit_loop._data_fetcher))


def test_overrides_live_on_this_trainer_only(tmp_path):
    snapshot = {cls: dict(vars(cls)) for cls in (_FitLoop, _TrainingEpochLoop, _DataFetcher, _PrefetchDataFetcher)}
    seen_with, seen_without = _LoopTypes(), _LoopTypes()
    run(Config(), tmp_path / "with", extra_callbacks=[seen_with])
    result = run(Config(), tmp_path / "without", callback=False, extra_callbacks=[seen_without])
    # during fit, the trainer with the callback runs the overrides, mixed in front of Lightning's classes (the epoch
    # loop's only once the loops are restored from a checkpoint: test_mixin)
    fit_loop, epoch_loop, fetcher = seen_with.types
    assert all(
        issubclass(ours, stock) and ours is not stock
        for ours, stock in ((fit_loop, _FitLoop), (fetcher, _PrefetchDataFetcher))
    )
    assert epoch_loop is _TrainingEpochLoop
    # the one without runs the stock classes, which nothing modified
    assert seen_without.types == (_FitLoop, _TrainingEpochLoop, _PrefetchDataFetcher)
    assert {cls: dict(vars(cls)) for cls in snapshot} == snapshot
    # after fit the loops are stock again and the train loader has its own batch sampler back
    assert type(result.trainer.fit_loop) is _FitLoop
    assert type(result.trainer.fit_loop.epoch_loop) is _TrainingEpochLoop


def test_teardown_gives_back_the_loaders_and_loops(tmp_path):
    result = run(Config(), tmp_path)
    trainer = result.trainer
    assert type(trainer.fit_loop) is _FitLoop
    assert type(trainer.fit_loop.epoch_loop) is _TrainingEpochLoop
    assert not hasattr(trainer.fit_loop, "_midepoch")
    loader = trainer.train_dataloader
    assert type(loader.batch_sampler) is torch.utils.data.BatchSampler


def test_on_mismatch_is_validated():
    with pytest.raises(ValueError, match="`on_mismatch` must be one of"):
        MidEpochResume(on_mismatch="ignore")


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("changed", "message"),
    [
        ({"dataset_size": 22}, "a train dataset of 20 samples but the current one has a train dataset of 22 samples"),
        ({"batch_size": 4}, "batch_size=2 but the current one has batch_size=4"),
        ({"drop_last": True, "dataset_size": 21}, "drop_last=False but the current one has drop_last=True"),
        (
            {"loader": "sequential"},
            "RandomSampler .global torch RNG. but the current one has an order from "
            "BatchSampler over SequentialSampler",
        ),
        ({"combined": "max_size_cycle"}, "saved with 1 train dataloader.s. but the current run has 2"),
    ],
)
def test_changed_data_is_a_clear_error(changed, message, tmp_path):
    config = Config(dataset_size=21) if "drop_last" in changed else Config()
    interrupted = run(config, tmp_path / "interrupted", crash=MID)
    ckpt = checkpoint_path(tmp_path / "interrupted", MID)
    digest = _digest(ckpt)
    with pytest.raises(MidEpochResumeError, match=message):
        run(replace(config, **changed), tmp_path / "resumed", ckpt_path=ckpt, seed=2)
    assert interrupted.crashed
    assert _digest(ckpt) == digest  # never modified


def test_restart_epoch_opt_out(tmp_path):
    run(Config(), tmp_path / "interrupted", crash=MID)
    ckpt = checkpoint_path(tmp_path / "interrupted", MID)
    L.seed_everything(2, verbose=False)
    model = Model(replace(Config(), dataset_size=24))
    trainer = L.Trainer(
        callbacks=[MidEpochResume(on_mismatch="restart_epoch")],
        max_epochs=2,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        limit_val_batches=0,
    )
    with pytest.warns(UserWarning, match="on_mismatch='restart_epoch'"):
        trainer.fit(model, ckpt_path=ckpt)
    # the rest of epoch 1 is trained on a freshly started order: 12 batches per epoch now, 4 already done
    resumed_epoch = [batch for batch in model.seen if batch[0] == 1]
    assert [batch_idx for _, batch_idx, _ in resumed_epoch] == list(range(4, 12))


def test_resumes_without_the_callback_as_stock_lightning(tmp_path):
    run(Config(), tmp_path / "interrupted", crash=MID)
    ckpt = checkpoint_path(tmp_path / "interrupted", MID)
    with pytest.warns(UserWarning, match=STOCK_NOT_RESUMABLE_WARNING):
        resumed = run(Config(), tmp_path / "resumed", callback=False, ckpt_path=ckpt, seed=2)
    assert [batch_idx for epoch, batch_idx, _ in resumed.seen if epoch == 1] == list(range(4, 10))


@pytest.mark.parametrize("loader", ["sequential", "distributed"])
def test_stock_checkpoint_with_a_seed_determined_order(loader, tmp_path):
    """A checkpoint written without the callback: orders fixed by a seed and the epoch still continue exactly."""
    config = Config(loader=loader, hook_draws=False)
    full = run(config, tmp_path / "full", callback=False)
    interrupted = run(config, tmp_path / "interrupted", callback=False, crash=MID)
    with pytest.warns(UserWarning, match="no MidEpochResume state"):
        resumed = run(config, tmp_path / "resumed", ckpt_path=checkpoint_path(tmp_path / "interrupted", MID), seed=2)
    assert interrupted.seen + resumed.seen == full.seen


def test_stock_checkpoint_with_a_random_order_warns(tmp_path):
    config = Config()
    run(config, tmp_path / "interrupted", callback=False, crash=MID)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = run(config, tmp_path / "resumed", ckpt_path=checkpoint_path(tmp_path / "interrupted", MID), seed=2)
    messages = [str(w.message) for w in caught]
    assert any("cannot be recovered" in message for message in messages)
    assert any("no MidEpochResume state" in message for message in messages)
    # the epoch still has its remaining number of batches
    assert [batch_idx for epoch, batch_idx, _ in resumed.seen if epoch == 1] == list(range(4, 10))


def test_weights_only_resume(tmp_path):
    """``fit(weights_only=True)`` loads the callback's state (primitives and tensors only) and resumes exactly."""
    interrupted = run(Config(), tmp_path / "interrupted", crash=MID)
    ckpt = checkpoint_path(tmp_path / "interrupted", MID)
    checkpoint = torch.load(ckpt, weights_only=True)
    assert checkpoint["callbacks"]["MidEpochResume"]["version"] == 1
    full = uninterrupted(Config(), tmp_path / "full")
    resumed = run(Config(), tmp_path / "resumed", ckpt_path=ckpt, seed=2, weights_only=True)
    assert_exact(Comparison(full, interrupted, resumed))


def test_stateful_iterable_dataset_resumes_exactly(tmp_path):
    assert_exact(interrupt_and_resume(Config(iterable="stateful"), MID, tmp_path))


def test_plain_iterable_dataset_warns_and_restarts_its_epoch(tmp_path):
    """Without a state of its own, the interrupted epoch's iteration starts again: every sample of it, once more."""
    config = Config(iterable="plain")
    with pytest.warns(UserWarning, match=r"IterableDataset \(CountingIterable\).* restarts its iteration"):
        comparison = interrupt_and_resume(config, MID, tmp_path)
    full, interrupted, resumed = comparison.full, comparison.interrupted, comparison.resumed
    done = len(interrupted.seen)
    assert interrupted.seen == full.seen[:done]
    epoch, consumed = MID.epoch, MID.batch + 1
    # the interrupted epoch again from its first sample, numbered on from the batches it had already trained
    whole_epoch = [ids for e, _, ids in full.seen if e == epoch]
    again = [(epoch, consumed + index, ids) for index, ids in enumerate(whole_epoch)]
    later = [batch for batch in full.seen if batch[0] > epoch]
    assert resumed.seen == again + later
    assert resumed.trainer.current_epoch == config.max_epochs


class _IteratesTheTrainLoader(L.Callback):
    """A user's callback that iterates the train loader itself in the middle of an epoch."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 1:
            sum(len(ids) for ids, _, _ in trainer.train_dataloader)


def test_iterating_the_train_loader_outside_the_loop_is_not_recorded(tmp_path):
    config = Config(hook_draws=False)
    extra = [_IteratesTheTrainLoader()]
    full = run(config, tmp_path / "full", extra_callbacks=extra)
    interrupted = run(config, tmp_path / "interrupted", crash=MID, extra_callbacks=extra)
    resumed = run(
        config,
        tmp_path / "resumed",
        ckpt_path=checkpoint_path(tmp_path / "interrupted", MID),
        seed=2,
        extra_callbacks=extra,
    )
    assert interrupted.seen + resumed.seen == full.seen


def test_configured_from_a_lightning_cli_yaml(tmp_path):
    """`trainer.callbacks: - class_path: lightning_midepoch.MidEpochResume` with typed init_args."""
    from lightning.pytorch.cli import LightningCLI

    config = tmp_path / "config.yaml"
    config.write_text(
        "trainer:\n"
        "  logger: false\n"
        "  callbacks:\n"
        "    - class_path: lightning_midepoch.MidEpochResume\n"
        "      init_args:\n"
        "        on_mismatch: restart_epoch\n"
    )
    cli = LightningCLI(L.LightningModule, run=False, args=["--config", str(config)], save_config_callback=None)
    (callback,) = [c for c in cli.trainer.callbacks if isinstance(c, MidEpochResume)]
    assert callback.on_mismatch == "restart_epoch"
    config.write_text(config.read_text().replace("restart_epoch", "ignore"))
    with pytest.raises(SystemExit):
        LightningCLI(L.LightningModule, run=False, args=["--config", str(config)], save_config_callback=None)


TESTS = Path(__file__).resolve().parent


def _python(code: str, **env: str) -> str:
    """Run ``code`` in a fresh interpreter (which Lightning namespaces are imported is per process)."""
    completed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=TESTS,
        env={**os.environ, "PYTHONPATH": str(TESTS), **env},
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return completed.stdout


def test_imports_no_lightning_namespace_the_user_has_not_imported():
    assert importlib.util.find_spec("pytorch_lightning") is not None, "the test needs both namespaces installed"
    out = _python(
        """
        import sys
        import lightning.pytorch as L
        from lightning_midepoch import MidEpochResume
        L.Trainer(callbacks=[MidEpochResume()], logger=False, enable_checkpointing=False)
        print(sorted(name for name in ("lightning", "pytorch_lightning") if name in sys.modules))
        """
    )
    assert out.strip() == "['lightning']"


def test_lightnings_log_messages_reach_a_lightning_users_logger():
    """Lightning's own messages still go to the `lightning.pytorch` logger a user configured (and caplog reads)."""
    out = _python(
        """
        import logging
        import lightning.pytorch as L
        from pathlib import Path
        import tempfile
        from harness import Config, run

        class Stop(L.Callback):
            def on_train_batch_end(self, trainer, *args):
                trainer.should_stop = True

        messages = []
        handler = logging.Handler()
        handler.emit = lambda record: messages.append(record.getMessage())
        logging.getLogger("lightning.pytorch").addHandler(handler)
        logging.getLogger("lightning.pytorch").setLevel(logging.DEBUG)
        run(Config(), Path(tempfile.mkdtemp()), extra_callbacks=[Stop()])
        print(any("`trainer.should_stop` was set" in message for message in messages))
        """
    )
    assert out.strip().splitlines()[-1] == "True"


def test_works_with_both_namespaces_in_one_process(tmp_path):
    """The callback was imported with `lightning`; the user then trains with `pytorch_lightning` too."""
    out = _python(
        f"""
        import lightning.pytorch
        import lightning_midepoch.callback  # imported while only `lightning` is
        from pathlib import Path
        from harness import Config, CrashPoint, L, assert_exact, interrupt_and_resume  # pytorch_lightning
        assert L.__name__ == "pytorch_lightning"
        crash = CrashPoint("train_batch_end", epoch=1, batch=3)
        assert_exact(interrupt_and_resume(Config(), crash, Path({str(tmp_path)!r})))
        print("exact")
        """,
        MIDEPOCH_TEST_NAMESPACE="pytorch_lightning",
    )
    assert out.strip().splitlines()[-1] == "exact"


class _Raise(L.Callback):
    """Raises in on_train_batch_end of global step 3, once."""

    def __init__(self, exception: BaseException) -> None:
        self.exception: BaseException | None = exception
        self.trainer: L.Trainer | None = None

    def on_train_batch_end(self, trainer, *args):
        self.trainer = trainer
        if trainer.global_step == 3 and self.exception is not None:
            exception, self.exception = self.exception, None
            raise exception


def _raise_then_fit_again(exception: BaseException, tmp_path, callback: bool, ckpt: bool) -> tuple[L.Trainer, Model]:
    raising = _Raise(exception)
    handler = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises((RuntimeError, SystemExit)):  # Lightning exits after a KeyboardInterrupt
            run(Config(), tmp_path, callback=callback, extra_callbacks=[raising])
    finally:
        signal.signal(signal.SIGINT, handler)  # Lightning ignores further Ctrl+C after a KeyboardInterrupt
    trainer = raising.trainer
    assert trainer is not None
    model = trainer.lightning_module
    if callback:  # nothing of the callback stays installed
        assert type(trainer.fit_loop) is _FitLoop
        assert type(trainer.fit_loop.epoch_loop) is _TrainingEpochLoop
        assert not any(name.startswith("_midepoch") for name in vars(trainer.fit_loop))
        assert type(trainer.train_dataloader.batch_sampler) is torch.utils.data.BatchSampler
    path = None
    if ckpt:
        path = tmp_path / "after_exception.ckpt"
        trainer.save_checkpoint(path)
    trainer.fit(model, ckpt_path=path)
    return trainer, model


@pytest.mark.parametrize("exception", [RuntimeError("boom"), KeyboardInterrupt()], ids=["error", "ctrl-c"])
def test_after_an_exception_a_second_fit_is_unchanged(exception, tmp_path):
    _, ours = _raise_then_fit_again(exception, tmp_path / "ours", callback=True, ckpt=False)
    _, stock = _raise_then_fit_again(exception, tmp_path / "stock", callback=False, ckpt=False)
    assert ours.seen == stock.seen
    for expected, actual in zip(stock.parameters(), ours.parameters(), strict=True):
        assert torch.equal(expected, actual)


@pytest.mark.parametrize("exception", [RuntimeError("boom"), KeyboardInterrupt()], ids=["error", "ctrl-c"])
def test_after_an_exception_a_second_fit_from_a_checkpoint_is_exact(exception, tmp_path):
    """The checkpoint written after the exception records where it happened; fit resumes there exactly."""
    _, model = _raise_then_fit_again(exception, tmp_path / "twice", callback=True, ckpt=True)
    full = run(Config(), tmp_path / "full")
    assert model.seen == full.seen
    for expected, actual in zip(full.model.parameters(), model.parameters(), strict=True):
        assert torch.equal(expected, actual)


def test_the_callback_steps_aside_on_a_lightning_that_resumes_mid_epoch_itself(monkeypatch, tmp_path):
    """On a Lightning carrying the upstream change (upstream/0001: `lightning.pytorch.loops._mid_epoch`), setup installs
    nothing and checks no version: the fit is the stock one, the callback saves no position and reads none.

    Stock Lightning stands in for the patched one here; `make upstream-check` runs the same on the patched Lightning.
    """
    from lightning_midepoch import _compat

    assert not _compat.resumes_mid_epoch_itself(L.Trainer(logger=False))
    monkeypatch.setattr(_compat, "resumes_mid_epoch_itself", lambda trainer: True)

    def refuse(trainer: Any) -> None:
        raise AssertionError("the version check ran")

    monkeypatch.setattr(_compat, "check_supported", refuse)
    config = Config()
    stock = run(config, tmp_path / "stock", callback=False, crash=MID)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        aside = run(config, tmp_path / "aside", crash=MID)
    assert aside.seen == stock.seen  # the same (stock) run
    assert not any("MidEpochResume" in str(w.message) for w in caught)
    state = torch.load(checkpoint_path(tmp_path / "aside", MID), weights_only=True)["callbacks"]["MidEpochResume"]
    assert state["ranks"] == []  # no position recorded
