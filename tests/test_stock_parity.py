"""Never worse than stock Lightning: the patterns ordinary projects train with, each run with and without the callback.

Each test runs the same fit stock (no callback) and with ``MidEpochResume``, in the same test: the uninterrupted runs
are the same run, and a resume from a mid-epoch checkpoint is exact, or warned before its first batch where stock
Lightning also cannot continue the epoch (issue 35's table: one test per row; the Lightning release row is
tests/test_compat.py's ``test_an_unchecked_release_runs_with_a_warning_naming_what_differs``).
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Sampler

import lightning_midepoch._workers as W
from harness import (
    UNCHECKED_RELEASE,
    Config,
    CrashPoint,
    IndexedDataset,
    L,
    Model,
    assert_exact,
    assert_same_state,
    assert_transparent,
    checkpoint_path,
    interrupt_and_resume,
    run,
    uninterrupted,
)
from lightning_midepoch import MidEpochResume

STOCK_WARNING = "You're resuming from a checkpoint that ended before the epoch ended"
MID = CrashPoint("train_batch_end", epoch=1, batch=3)


class FirstBatchWarnings(L.Callback):
    """The warnings given before a run trains on its first batch (``caught`` is a ``catch_warnings(record=True)``)."""

    def __init__(self, caught: list[warnings.WarningMessage]) -> None:
        self.caught = caught
        self.before: list[str] | None = None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.before is None:
            self.before = [str(warning.message) for warning in self.caught]


def resumed(config: Config, crash: CrashPoint, tmp_path: Path, *, callback: bool) -> tuple[Any, list[str]]:
    """Run ``config`` until ``crash``, then resume it: the resumed run and the warnings given before it trained."""
    interrupted = run(config, tmp_path / "interrupted", callback=callback, crash=crash)
    assert interrupted.crashed, f"the run never reached {crash}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = FirstBatchWarnings(caught)
        ckpt = checkpoint_path(tmp_path / "interrupted", crash)
        result = run(config, tmp_path / "resumed", callback=callback, ckpt_path=ckpt, seed=2, extra_callbacks=[first])
    assert first.before is not None, "the resumed run trained on no batch"
    return result, first.before


# ---------------------------------------------------------------------------------------------- the row of OneCycleLR
class EarlyIteratorModel(Model):
    """``OneCycleLR`` sized from ``trainer.estimated_stepping_batches`` (read in ``read_in``), stepped every batch.

    Reading it before the fit loop runs makes Lightning set up the train dataloader and create its iterator inside
    ``strategy.setup``, before the checkpoint's training state is restored.
    """

    read_in = "configure_optimizers"

    def _total_steps(self, hook: str) -> None:
        if self.read_in == hook:
            self.total_steps = int(self.trainer.estimated_stepping_batches)

    def setup(self, stage: str) -> None:
        self._total_steps("setup")

    def on_fit_start(self) -> None:
        self._total_steps("on_fit_start")
        if self.read_in == "on_fit_start":  # the schedule is sized here: rebuild it, as such projects do
            scheduler = self.trainer.lr_scheduler_configs[0].scheduler
            scheduler.total_steps = self.total_steps

    def on_train_start(self) -> None:
        super().on_train_start()
        if self.read_in == "on_train_start":  # the loader and its length, read once training starts
            assert self.trainer.train_dataloader is not None
            assert self.trainer.num_training_batches == self.config.batches_per_epoch

    def configure_optimizers(self) -> Any:
        self._total_steps("configure_optimizers")
        optimizer = torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)
        steps = getattr(self, "total_steps", self.config.max_epochs * self.config.batches_per_epoch)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


_EARLY_MODELS = {
    hook: type(f"ReadIn_{hook}", (EarlyIteratorModel,), {"read_in": hook})
    for hook in ("configure_optimizers", "setup", "on_fit_start", "on_train_start")
}


@pytest.mark.parametrize(
    ("read_in", "num_workers"),
    [
        ("configure_optimizers", 0),
        ("configure_optimizers", 2),
        ("setup", 0),
        ("on_fit_start", 0),
        ("on_train_start", 0),
    ],
)
def test_estimated_stepping_batches_before_the_restore_resumes_exactly(read_in, num_workers, tmp_path):
    config = Config(max_epochs=2, num_workers=num_workers, model_class=_EARLY_MODELS[read_in])
    # stock Lightning: the same fit, and a resume it says it cannot continue
    stock, stock_warned = resumed(config, MID, tmp_path / "stock", callback=False)
    assert any(STOCK_WARNING in message for message in stock_warned)
    stock_full = uninterrupted(config, tmp_path / "stock_full", callback=False)
    assert stock.seen != stock_full.seen[len(stock_full.seen) - len(stock.seen) :]  # (stock's resume is inexact)
    # with the callback: the uninterrupted run is stock's (batches, weights, schedule, random streams), and the
    # resume is exact, without a warning
    assert_transparent(config, tmp_path)
    comparison = interrupt_and_resume(config, MID, tmp_path / "callback")
    assert_exact(comparison)
    _, warned = resumed(config, MID, tmp_path / "callback_warnings", callback=True)
    # (on a Lightning release the callback was not checked against, `make lightning-next`, it also says that)
    resume_warnings = [message for message in warned if not message.startswith(UNCHECKED_RELEASE)]
    assert not [message for message in resume_warnings if "MidEpochResume" in message or STOCK_WARNING in message]


class StepsReader(L.Callback):
    """A callback listed before MidEpochResume that sizes a schedule in its ``setup``: Lightning creates the train
    iterator there, before the callback's own ``setup`` (a datamodule's ``setup`` that does so is the same case)."""

    def setup(self, trainer: L.Trainer, pl_module: Any, stage: str) -> None:
        pl_module.total_steps = int(trainer.estimated_stepping_batches)


def _read_first(config: Config, path: Path, *, ours: bool, **kwargs: Any) -> Any:
    extra = kwargs.pop("extra_callbacks", [])
    callbacks = [StepsReader(), *([MidEpochResume()] if ours else []), *extra]
    return run(config, path, callback=False, extra_callbacks=callbacks, **kwargs)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("epoch", [0, 1])
def test_a_callback_before_it_that_creates_the_iterator_is_exact_or_warned_and_never_waits(
    epoch, num_workers, monkeypatch, tmp_path
):
    waited: list[tuple[int, int]] = []
    wait_for = W.LoaderWorkers._wait_for

    def counting_wait(self: W.LoaderWorkers, worker: int, batches: int) -> Any:
        found = wait_for(self, worker, batches)
        if found is None and self.wait_s > 0:  # a checkpoint waited for a worker state that never came
            waited.append((worker, batches))
        return found

    monkeypatch.setattr(W.LoaderWorkers, "_wait_for", counting_wait)
    monkeypatch.setattr(W, "WAIT_S", 2.0)  # (a regression fails the count, quickly)
    config = Config(max_epochs=2, num_workers=num_workers, model_class=EarlyIteratorModel)
    crash = CrashPoint("train_batch_end", epoch=epoch, batch=3)
    stock_full = _read_first(config, tmp_path / "stock_full", ours=False)
    full = _read_first(config, tmp_path / "full", ours=True)
    assert full.seen == stock_full.seen
    assert full.model.validated == stock_full.model.validated
    assert_same_state(full, stock_full)
    runs: dict[bool, tuple[Any, list[str]]] = {}
    for ours in (False, True):
        interrupted = _read_first(config, tmp_path / f"interrupted{ours}", ours=ours, crash=crash)
        assert interrupted.crashed
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            first = FirstBatchWarnings(caught)
            ckpt = checkpoint_path(tmp_path / f"interrupted{ours}", crash)
            resumed_run = _read_first(
                config, tmp_path / f"resumed{ours}", ours=ours, ckpt_path=ckpt, seed=2, extra_callbacks=[first]
            )
        assert first.before is not None
        runs[ours] = (resumed_run, first.before)
    assert any(STOCK_WARNING in message for message in runs[False][1])
    ours_resumed, warned = runs[True]
    exact = ours_resumed.seen == full.seen[len(full.seen) - len(ours_resumed.seen) :]
    assert waited == []
    if epoch == 0:  # the first epoch's order was drawn before the callback's setup: said before training
        assert not exact
        assert any("cannot be recovered" in m and "estimated_stepping_batches" in m for m in warned)
    else:  # a later epoch's iterator is the callback's: exact, without a warning
        assert exact
        assert_same_state(full, ours_resumed)
        resume_warnings = [m for m in warned if not m.startswith(UNCHECKED_RELEASE)]  # (`make lightning-next`)
        assert not [m for m in resume_warnings if "MidEpochResume" in m or STOCK_WARNING in m or "cannot be" in m]


# ---------------------------------------------------------------------------------------------- samplers without len
class InfiniteRandomSampler(Sampler[int]):
    """A sampler that repeats for ever, a new permutation of the global torch RNG each round (no ``__len__``)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self) -> Any:
        while True:
            yield from torch.randperm(self.size).tolist()


class InfiniteSamplerModel(Model):
    def train_dataloader(self) -> Any:
        dataset = IndexedDataset(self.config.dataset_size)
        self.datasets.append(dataset)
        return DataLoader(dataset, sampler=InfiniteRandomSampler(len(dataset)), batch_size=self.config.batch_size)


def test_an_infinite_sampler_under_max_steps_trains_as_stock_and_its_resume_is_warned(tmp_path):
    config = Config(max_epochs=1, max_steps=14, model_class=InfiniteSamplerModel)
    # the uninterrupted run with the callback is stock's, to max_steps
    assert_transparent(config, tmp_path)
    assert uninterrupted(config, tmp_path / "full").trainer.global_step == 14
    crash = CrashPoint("train_batch_end", epoch=0, batch=5)
    stock, stock_warned = resumed(config, crash, tmp_path / "stock", callback=False)
    ours, warned = resumed(config, crash, tmp_path / "callback", callback=True)
    # stock Lightning continues the endless epoch on a new pass without a word; the callback leaves the loader to it,
    # and says so before the first batch, naming the loader and why; the run ends where stock's does
    assert not [message for message in stock_warned if "resum" in message]
    assert any("Train dataloader 0 is left to Lightning" in m and "InfiniteRandomSampler" in m for m in warned)
    assert ours.trainer.global_step == stock.trainer.global_step == 14
    assert [(epoch, batch) for epoch, batch, _ in ours.seen] == [(epoch, batch) for epoch, batch, _ in stock.seen]


# ---------------------------------------------------------------------------------------------- a reused iterator
class RepeatingBatches:
    """A batch sampler that repeats another for ever (no ``__len__``)."""

    def __init__(self, batch_sampler: Any) -> None:
        self.batch_sampler = batch_sampler

    def __iter__(self) -> Any:
        while True:
            yield from iter(self.batch_sampler)


class ReusingLoader(DataLoader):
    """Starts its workers once, in ``__init__``, and hands out ``len(self)`` batches of that one iterator per epoch."""

    made: list[ReusingLoader] = []  # (the test stops their workers at its end)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        object.__setattr__(self, "batch_sampler", RepeatingBatches(self.batch_sampler))
        self.iterator = super().__iter__()
        ReusingLoader.made.append(self)

    def __len__(self) -> int:
        return len(self.batch_sampler.batch_sampler)

    def __iter__(self) -> Any:
        for _ in range(len(self)):
            yield next(self.iterator)


class ReusingLoaderModel(Model):
    def train_dataloader(self) -> Any:
        dataset = IndexedDataset(self.config.dataset_size)
        self.datasets.append(dataset)
        return ReusingLoader(dataset, batch_size=self.config.batch_size, shuffle=True, num_workers=2)


def test_a_loader_reusing_the_iterator_of_its_init_never_waits_and_its_resume_is_warned(monkeypatch, tmp_path):
    unwritten: list[tuple[int, int]] = []
    find = W.LoaderWorkers._find

    def counting_find(self: W.LoaderWorkers, worker: int, batches: int) -> Any:
        found = find(self, worker, batches)
        if found is False:  # a checkpoint would wait for a worker report that has not come
            unwritten.append((worker, batches))
        return found

    monkeypatch.setattr(W.LoaderWorkers, "_find", counting_find)
    monkeypatch.setattr(W, "WAIT_S", 2.0)  # (a regression fails the count, quickly)
    config = Config(max_epochs=2, model_class=ReusingLoaderModel)
    assert_transparent(config, tmp_path)
    stock, stock_warned = resumed(config, MID, tmp_path / "stock", callback=False)
    ours, warned = resumed(config, MID, tmp_path / "callback", callback=True)
    assert unwritten == []
    assert any(STOCK_WARNING in message for message in stock_warned)
    assert any("Train dataloader 0 is left to Lightning" in m and "ReusingLoader" in m for m in warned)
    assert [(epoch, batch) for epoch, batch, _ in ours.seen] == [(epoch, batch) for epoch, batch, _ in stock.seen]
    while ReusingLoader.made:  # the pattern's workers live as long as their loader: stop them here
        ReusingLoader.made.pop().iterator._shutdown_workers()


# ---------------------------------------------------------------------------------------------- numpy's bit generator
@pytest.fixture
def pcg64_global() -> Any:
    """The global numpy generator is a PCG64 for the test (``np.random.set_bit_generator``), MT19937 again after."""
    original = np.random.get_bit_generator()
    np.random.set_bit_generator(np.random.PCG64(5))
    yield
    np.random.set_bit_generator(original)


def test_a_global_numpy_generator_other_than_mt19937_is_recorded_and_restored(pcg64_global, tmp_path):
    # the hooks and the training step draw from numpy's global generator: its stream must continue exactly
    # (a configuration of its own: the harness shares uninterrupted runs between tests by configuration, and these
    # run with another global generator)
    config = Config(max_epochs=2, dataset_size=22, hook_draws=True)
    assert_transparent(config, tmp_path)
    comparison = interrupt_and_resume(config, MID, tmp_path / "callback")
    assert type(np.random.get_bit_generator()).__name__ == "PCG64"
    assert_exact(comparison)
    assert_same_state(uninterrupted(config, tmp_path / "stock", callback=False), comparison.resumed)
    _, stock_warned = resumed(config, MID, tmp_path / "stock_resume", callback=False)
    assert any(STOCK_WARNING in message for message in stock_warned)
    random.random()  # (the fixture puts numpy's generator back; python's is seeded by every run)


# ---------------------------------------------------------------------------------------------- ReduceLROnPlateau
class PlateauModel(Model):
    """``ReduceLROnPlateau`` on the validation loss, stepped at each epoch's end (the corpus's imbalanced recipe)."""

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "val_loss"}}


def test_a_plateau_scheduler_is_stepped_at_the_end_of_the_resumed_epoch(tmp_path):
    """Stock Lightning skips every epoch-end scheduler step of the epoch it resumed into; the validation that feeds
    this one ran after the restore, so the uninterrupted run's step is taken."""
    config = Config(max_epochs=2, validation=True, val_check_interval=0.5, model_class=PlateauModel)
    comparison = interrupt_and_resume(config, MID, tmp_path)  # (the uninterrupted run is compared with stock's too)
    assert_exact(comparison)
    stock = interrupt_and_resume(config, MID, tmp_path / "stock", callback=False)
    plateau = stock.resumed.trainer.lr_scheduler_configs[0].scheduler
    assert plateau.last_epoch < comparison.full.trainer.lr_scheduler_configs[0].scheduler.last_epoch


def test_a_plateau_scheduler_without_a_validation_after_the_restore_is_warned_before_the_next_epoch(tmp_path):
    """Nine batches, validated after batches 3 and 7: resumed after batch 8, no validation gives the plateau its metric
    at the epoch's end (stock Lightning skips that step too, silently); the learning rate of the next epoch differs."""
    config = Config(max_epochs=2, dataset_size=18, validation=True, val_check_interval=0.5, model_class=PlateauModel)
    crash = CrashPoint("train_batch_end", epoch=0, batch=8)
    stock, stock_warned = resumed(config, crash, tmp_path / "stock", callback=False)
    assert not [message for message in stock_warned if "ReduceLROnPlateau" in message]
    ours, warned = resumed(config, crash, tmp_path / "callback", callback=True)
    assert any("A ReduceLROnPlateau scheduler is not stepped at the end of the epoch" in m for m in warned)
    full = uninterrupted(config, tmp_path / "full")
    assert ours.seen == full.seen[len(full.seen) - len(ours.seen) :]  # the batches are still exact
    schedulers = [run.trainer.lr_scheduler_configs[0].scheduler for run in (stock, ours, full)]
    # one step fewer than the uninterrupted run (stock Lightning, rolling over the epoch's end, misses more)
    assert schedulers[0].last_epoch <= schedulers[1].last_epoch == schedulers[2].last_epoch - 1


# ---------------------------------------------------------------------------------------------- hooks after the write
#: (the words docs/warnings.md filters it on: every test below checks that the warning starts with them)
HOOKS_WARNING = "The checkpoint was written in on_train_batch_end before"
#: the last batch of epoch 0 (stock Lightning resumes there without a warning), and ModelCheckpoint's every-step write
EPOCH_END = CrashPoint("train_batch_end", epoch=0, batch=9)
MODEL_CHECKPOINT = CrashPoint("model_checkpoint", step=14, every=1)  # after batch 3 of epoch 1, as MID


def _ema_update(ema: torch.Tensor, module: Model) -> None:
    with torch.no_grad():
        ema.mul_(0.9).add_(0.1 * module.net[0].weight)


class EmaModel(Model):
    """A momentum copy of a weight updated in the module's own ``on_train_batch_end`` (solo-learn's BYOL target
    network): Lightning runs that hook after every callback's, so after a checkpoint a callback writes there."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.register_buffer("ema", torch.zeros(16, 4))

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        _ema_update(self.ema, self)


class EmaCallback(L.Callback):
    """The same update in a callback's ``on_train_batch_end``, its copy saved as the callback's state."""

    def __init__(self) -> None:
        self.ema = torch.zeros(16, 4)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        _ema_update(self.ema, pl_module)

    def state_dict(self) -> dict[str, Any]:
        return {"ema": self.ema.clone()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.ema = state_dict["ema"].clone()


@pytest.mark.parametrize(
    "crash", [MID, EPOCH_END, MODEL_CHECKPOINT], ids=["mid-epoch", "epoch-end", "model-checkpoint"]
)
def test_a_module_hook_after_a_callbacks_checkpoint_is_warned_before_training(crash, tmp_path):
    """The corpus's byol_solo: a resume does not run the module's ``on_train_batch_end`` of the checkpoint's batch,
    with or without the callback. Stock Lightning warns "not resumable" inside an epoch (not at its last batch); with
    the callback the batches are exact, and the missing update is warned before training, naming the hook."""
    config = Config(max_epochs=2, model_class=EmaModel)
    full = uninterrupted(config, tmp_path / "full")
    stock, stock_warned = resumed(config, crash, tmp_path / "stock", callback=False)
    assert any(STOCK_WARNING in message for message in stock_warned) == (crash != EPOCH_END)
    assert not torch.equal(stock.model.ema, full.model.ema)
    assert_transparent(config, tmp_path)
    ours, warned = resumed(config, crash, tmp_path / "callback", callback=True)
    assert [m for m in warned if m.startswith(HOOKS_WARNING)] == [
        m for m in warned if "`EmaModel.on_train_batch_end`" in m
    ]
    assert len([m for m in warned if m.startswith(HOOKS_WARNING)]) == 1
    assert ours.seen == full.seen[len(full.seen) - len(ours.seen) :]  # the batches are exact
    assert not torch.equal(ours.model.ema, full.model.ema)  # the update the warning names is missing


def _fit_with_ema(
    config: Config, tmp_path: Path, *, crash: CrashPoint | None = None, resume: CrashPoint | None = None
) -> tuple[Any, EmaCallback, list[str]]:
    """A fit with ``[MidEpochResume(), EmaCallback()]`` after the harness's writer of ``crash`` (its CrashCallback is
    listed first; ModelCheckpoint Lightning runs last), resumed from the checkpoint of ``resume``'s fit: the run, its
    callback and the warnings given before it trained."""
    ema = EmaCallback()
    ckpt = checkpoint_path(tmp_path.parent / "interrupted", resume) if resume is not None else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = FirstBatchWarnings(caught)
        result = run(
            config,
            tmp_path,
            callback=False,
            crash=crash,
            ckpt_path=ckpt,
            seed=2 if ckpt is not None else 1,
            extra_callbacks=[MidEpochResume(), ema, first],
        )
    assert first.before is not None
    return result, ema, first.before


@pytest.mark.parametrize(
    ("crash", "named"), [(MODEL_CHECKPOINT, False), (MID, True)], ids=["writer-after-it", "writer-before-it"]
)
def test_a_stateful_callbacks_hook_after_the_write_is_warned_before_training(crash, named, tmp_path):
    """A callback's ``on_train_batch_end`` that runs before the writer (ModelCheckpoint, which Lightning runs after
    every other callback) is in the checkpoint: exact, without a warning. One that runs after it (the writer is listed
    before MidEpochResume) is not: warned before training, naming it."""
    config = Config(max_epochs=2)
    full, full_ema, _ = _fit_with_ema(config, tmp_path / "full")
    interrupted, _, _ = _fit_with_ema(config, tmp_path / "interrupted", crash=crash)
    assert interrupted.crashed
    resumed_run, ema, warned = _fit_with_ema(config, tmp_path / "resumed", resume=crash)
    assert resumed_run.seen == full.seen[len(full.seen) - len(resumed_run.seen) :]
    hooks_warnings = [message for message in warned if message.startswith(HOOKS_WARNING)]
    if named:
        assert len(hooks_warnings) == 1
        assert "`EmaCallback.on_train_batch_end`" in hooks_warnings[0]
        assert not torch.equal(ema.ema, full_ema.ema)
    else:
        assert hooks_warnings == []
        assert torch.equal(ema.ema, full_ema.ema)
        assert_same_state(full, resumed_run)


class _Counting:
    """A train "loader" that is a plain iterable without a position of its own (as in Lightning's own loop tests)."""

    def __iter__(self) -> Any:
        return iter(range(10))

    def __len__(self) -> int:
        return 10


class _Recording(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[int] = []

    def training_step(self, batch: Any, batch_idx: int) -> None:
        self.seen.append(int(batch))

    def train_dataloader(self) -> Any:
        return _Counting()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_an_iterable_without_a_position_restarts_as_stock_and_no_batch_of_it_is_dropped(tmp_path):
    """Resumed mid-epoch, an iterable that keeps no position restarts from its beginning, as stock Lightning restarts
    it: the same batches as stock, and a warning before training. (The batch check once loaded its first item as the
    "last batch trained", found it different and dropped it: the resumed run trained 1, 2 where stock trains 0, 1.)"""
    seen, warned = {}, {}
    for callback in (False, True):
        kwargs: dict[str, Any] = {
            "default_root_dir": tmp_path / str(callback),
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
        }
        first = _Recording()
        trainer = L.Trainer(max_steps=2, callbacks=[MidEpochResume()] if callback else [], **kwargs)
        trainer.fit(first)
        assert first.seen == [0, 1]
        checkpoint = tmp_path / f"{callback}.ckpt"
        trainer.save_checkpoint(checkpoint)
        model = _Recording()
        caught_before = FirstBatchWarnings([])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            caught_before.caught = caught
            extra: list[L.Callback] = [MidEpochResume()] if callback else []
            L.Trainer(max_steps=4, callbacks=[*extra, caught_before], **kwargs).fit(model, ckpt_path=checkpoint)
        seen[callback], warned[callback] = model.seen, caught_before.before or []
    assert seen[True] == seen[False] == [0, 1]
    assert any("restarts its iteration from the beginning" in message for message in warned[True])
    assert not any("loaded again by the resumed run, differs" in message for message in warned[True])


class _FailInValidation(Exception):
    pass


class _Validated(L.LightningModule):
    """Shuffled train and validation loaders; with ``fail``, the second validation raises at its second batch."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.fail, self.validations = fail, 0
        self.seen: list[int] = []
        self.validated: list[int] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.seen.extend(int(x) for x in batch)
        return self.layer(batch.float().unsqueeze(1)).sum()

    def on_validation_start(self) -> None:
        self.validations += 1

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if self.fail and self.validations == 2 and batch_idx == 1:
            raise _FailInValidation
        self.validated.extend(int(x) for x in batch)

    def train_dataloader(self) -> Any:
        return DataLoader(range(8), batch_size=2, shuffle=True)

    def val_dataloader(self) -> Any:
        return DataLoader(range(8), batch_size=2, shuffle=True)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_resume_from_inside_a_validation_runs_it_again_and_counts_its_batches_as_stock(tmp_path):
    """``OnExceptionCheckpoint`` writes a checkpoint as the validation raises: the resume runs that validation again
    from its start (the same batches as the uninterrupted run) and its progress counters are stock's, each batch
    counted once and the interrupted one as started (Lightning's ``test_fit_can_fail_during_validation``)."""
    kwargs: dict[str, Any] = {
        "max_epochs": 1,
        "val_check_interval": 0.5,
        "num_sanity_val_steps": 0,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    progress, resumed = {}, {}
    for callback in (False, True):

        def ours(callback: bool = callback) -> list[L.Callback]:
            return [MidEpochResume()] if callback else []

        root = tmp_path / str(callback)
        L.seed_everything(7)
        full = _Validated()
        L.Trainer(default_root_dir=root / "full", callbacks=ours(), **kwargs).fit(full)
        L.seed_everything(7)
        first = _Validated(fail=True)
        on_exception = L.callbacks.OnExceptionCheckpoint(root)
        with pytest.raises(_FailInValidation):
            L.Trainer(default_root_dir=root, callbacks=[*ours(), on_exception], **kwargs).fit(first)
        model = _Validated()
        trainer = L.Trainer(default_root_dir=root, callbacks=ours(), **kwargs)
        trainer.fit(model, ckpt_path=root / "on_exception.ckpt")
        progress[callback] = trainer.fit_loop.state_dict()["epoch_loop.val_loop.batch_progress"]
        resumed[callback] = (full, first, model)
    assert progress[True] == progress[False]
    assert progress[True]["total"]["ready"] == 4 + 1 + 4  # the first validation, the interrupted batch, the rerun
    full, first, model = resumed[True]
    assert first.seen + model.seen == full.seen
    assert first.validated + model.validated == full.validated[:10] + full.validated[8:]  # 2 items a batch
    assert torch.equal(model.layer.weight, full.layer.weight)
