"""Every other flow in which Lightning saves, restores or re-runs loops: unchanged by the callback, and exact after
a resume (or clearly warned).

The reference for "unchanged" is the same run without the callback; for "exact", the uninterrupted run.
"""

from __future__ import annotations

import importlib
import random
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from harness import (
    NAMESPACE,
    Comparison,
    Config,
    CrashPoint,
    L,
    Model,
    RunResult,
    assert_exact,
    assert_same_state,
    checkpoint_path,
    interrupt_and_resume,
    run,
)

callbacks = importlib.import_module(f"{NAMESPACE}.callbacks")
Tuner = importlib.import_module(f"{NAMESPACE}.tuner").Tuner

MID = CrashPoint("train_batch_end", epoch=1, batch=3)


DEFAULT = Config()


def _assert_unchanged(tmp_path, config: Config = DEFAULT, **kwargs: Any) -> tuple[RunResult, RunResult]:
    """The run with the callback is the run without it: batches, validation, weights, optimizer, random streams."""
    ours = run(config, tmp_path / "ours", callback=True, **kwargs)
    stock = run(config, tmp_path / "stock", callback=False, **kwargs)
    assert ours.seen == stock.seen
    assert ours.model.validated == stock.model.validated
    assert_same_state(ours, stock)
    return ours, stock


def _lr_find(trainer: L.Trainer, model: Model) -> None:
    Tuner(trainer).lr_find(model, num_training=4, update_attr=False)


def _scale_batch_size(trainer: L.Trainer, model: Model) -> None:
    Tuner(trainer).scale_batch_size(model, mode="power", steps_per_trial=2, max_trials=2)


@pytest.mark.parametrize("tune", [_lr_find, _scale_batch_size], ids=["lr_find", "scale_batch_size"])
def test_tuner_before_fit_is_unchanged(tune, tmp_path):
    ours, _ = _assert_unchanged(tmp_path, before_fit=tune)
    assert ours.seen  # the tuner's own steps are not recorded as training


@pytest.mark.parametrize(
    "make",
    [
        lambda: callbacks.BatchSizeFinder(mode="power", steps_per_trial=2, max_trials=2),
        lambda: callbacks.LearningRateFinder(num_training_steps=4, update_attr=False),
    ],
    ids=["BatchSizeFinder", "LearningRateFinder"],
)
def test_tuner_callbacks_are_unchanged(make, tmp_path):
    ours = run(Config(), tmp_path / "ours", extra_callbacks=[make()])
    stock = run(Config(), tmp_path / "stock", callback=False, extra_callbacks=[make()])
    assert ours.seen == stock.seen
    assert_same_state(ours, stock)


def _swa() -> Any:
    return callbacks.StochasticWeightAveraging(swa_lrs=0.005, swa_epoch_start=1)


def _averaging() -> Any:
    if not hasattr(callbacks, "WeightAveraging"):  # arrived in Lightning 2.6
        pytest.skip("WeightAveraging needs Lightning 2.6")
    return callbacks.WeightAveraging()


@pytest.mark.parametrize("make", [_swa, _averaging], ids=["StochasticWeightAveraging", "WeightAveraging"])
def test_weight_averaging_is_unchanged(make, tmp_path):
    ours = run(Config(), tmp_path / "ours", extra_callbacks=[make()])
    stock = run(Config(), tmp_path / "stock", callback=False, extra_callbacks=[make()])
    assert ours.seen == stock.seen
    assert_same_state(ours, stock)


@pytest.mark.parametrize(
    "config",
    [
        Config(validation=True, check_val_every_n_epoch=2, max_epochs=4),
        Config(validation=True, val_check_interval=3),
    ],
    ids=["check_val_every_n_epoch", "val_check_interval"],
)
def test_validation_schedules_are_unchanged_and_resume_exactly(config, tmp_path):
    _assert_unchanged(tmp_path / "unchanged", config)
    assert_exact(interrupt_and_resume(config, MID, tmp_path / "resume"))


def test_early_stopping_mid_epoch_is_unchanged_and_continues_exactly(tmp_path):
    """EarlyStopping stops in the middle of an epoch; training more from the checkpoint written then is exact."""
    config = Config(validation=True, val_check_interval=3, max_epochs=4)

    def stopper() -> Any:
        return callbacks.EarlyStopping(monitor="val_loss", patience=0, check_on_train_epoch_end=False)

    ours = run(config, tmp_path / "ours", extra_callbacks=[stopper()])
    stock = run(config, tmp_path / "stock", callback=False, extra_callbacks=[stopper()])
    assert ours.seen == stock.seen
    assert_same_state(ours, stock)
    stopped_at = len(ours.seen)
    assert stopped_at % config.batches_per_epoch, "EarlyStopping should stop in the middle of an epoch here"
    ours.trainer.save_checkpoint(tmp_path / "stopped.ckpt")
    full = run(config, tmp_path / "full")
    resumed = run(config, tmp_path / "resumed", ckpt_path=tmp_path / "stopped.ckpt", seed=2)
    assert resumed.seen == full.seen[stopped_at:]
    assert_same_state(full, resumed)


def _evaluate(trainer: L.Trainer, model: Model) -> list[Any]:
    return [trainer.validate(model, verbose=False), trainer.test(model, verbose=False), trainer.predict(model)]


def test_validate_test_predict_before_and_after_fit_are_unchanged(tmp_path):
    outputs = {}
    for callback in (True, False):
        before: list[Any] = []
        result = run(
            Config(validation=True),
            tmp_path / str(callback),
            callback=callback,
            before_fit=lambda trainer, model, into=before: into.extend(_evaluate(trainer, model)),
        )
        after = _evaluate(result.trainer, result.model)
        # the process-wide random streams once the evaluations after fit are done
        streams = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
        outputs[callback] = (before, after, result, streams)
    (ours_before, ours_after, ours, ours_streams) = outputs[True]
    (stock_before, stock_after, stock, stock_streams) = outputs[False]
    assert ours.seen == stock.seen
    for mine, theirs in zip(ours_before + ours_after, stock_before + stock_after, strict=True):
        assert len(mine) == len(theirs)
        for a, b in zip(mine, theirs, strict=True):
            assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
    assert torch.equal(ours_streams[0], stock_streams[0]), "torch's global random stream differs"
    assert np.array_equal(ours_streams[1], stock_streams[1]), "numpy's global random stream differs"
    assert ours_streams[2] == stock_streams[2], "Python's global random stream differs"


def _fit_twice(config: Config, tmp_path, callback: bool, ckpt: bool) -> RunResult:
    """fit until step 13 (epoch 1, batch 2), then fit the same trainer again until step 17."""
    first = run(replace(config, max_steps=13), tmp_path, callback=callback)
    trainer = first.trainer
    path = None
    if ckpt:
        path = tmp_path / "between.ckpt"
        trainer.save_checkpoint(path)
    trainer.fit_loop.epoch_loop.max_steps = 17
    trainer.fit(first.model, ckpt_path=path)
    return first


def test_fit_twice_on_one_trainer_without_a_checkpoint_is_unchanged(tmp_path):
    """Stock Lightning starts a new epoch when fit is called again; with the callback, so does it."""
    ours = _fit_twice(Config(), tmp_path / "ours", callback=True, ckpt=False)
    stock = _fit_twice(Config(), tmp_path / "stock", callback=False, ckpt=False)
    assert ours.seen == stock.seen
    assert ours.seen[13][:2] == (2, 0)


def test_fit_twice_on_one_trainer_from_a_checkpoint_is_exact(tmp_path):
    """fit again with ckpt_path continues the stopped epoch, as one longer fit would have."""
    config = Config(max_steps=17)
    twice = _fit_twice(config, tmp_path / "twice", callback=True, ckpt=True)
    full = run(config, tmp_path / "full")
    assert twice.seen == full.seen
    for expected, actual in zip(full.model.parameters(), twice.model.parameters(), strict=True):
        assert torch.equal(expected, actual)


@pytest.mark.parametrize(
    "crash",
    [
        CrashPoint("train_batch_end", epoch=1, batch=1),  # (the hooks' batch_idx is the step's last batch's)
        CrashPoint("train_batch_end", epoch=1, batch=9),  # the epoch's last step
        CrashPoint("train_epoch_end", epoch=0),
    ],
    ids=repr,
)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("pulls", [1, 2], ids=["one-batch-per-step", "two-batches-per-step"])
def test_training_step_with_dataloader_iter_is_unchanged_and_resumes_exactly(pulls, num_workers, crash, tmp_path):
    """The steps pull their batches themselves: the checkpoint counts the batches, not the steps."""
    config = Config(pulls=pulls, num_workers=num_workers)
    assert_exact(interrupt_and_resume(config, crash, tmp_path))


@pytest.mark.parametrize(
    "crash",
    [
        CrashPoint("train_batch_start", epoch=1, batch=3),  # the hook's batch_idx: the previous step's last batch
        CrashPoint("after_backward", epoch=1, batch=2),  # the third step of the epoch
    ],
    ids=repr,
)
def test_training_step_with_dataloader_iter_checkpoint_inside_a_step_warns(crash, tmp_path):
    """Written inside a step that pulls its own batches: not exact, and the resumed run says so before training."""
    config = Config(pulls=2)
    assert run(config, tmp_path / "interrupted", crash=crash).crashed
    with pytest.warns(UserWarning, match="inside a training_step that pulls its own batches"):
        run(config, tmp_path / "resumed", ckpt_path=checkpoint_path(tmp_path / "interrupted", crash), seed=2)


def _resume_with(make: Any, config: Config, crash: CrashPoint, tmp_path) -> Comparison:
    """interrupt_and_resume, with ``make()`` giving each run the same extra callbacks."""
    full = run(config, tmp_path / "full", extra_callbacks=[make()])
    interrupted = run(config, tmp_path / "interrupted", crash=crash, extra_callbacks=[make()])
    assert interrupted.crashed
    resumed = run(
        config,
        tmp_path / "resumed",
        ckpt_path=checkpoint_path(tmp_path / "interrupted", crash),
        seed=2,
        extra_callbacks=[make()],
    )
    return Comparison(full, interrupted, resumed)


# written by ModelCheckpoint, which Lightning runs after the other callbacks (so the average includes the batch)
WHILE_AVERAGING, BEFORE_AVERAGING = CrashPoint("model_checkpoint", step=13), CrashPoint("model_checkpoint", step=4)


@pytest.mark.parametrize("crash", [WHILE_AVERAGING, BEFORE_AVERAGING], ids=["while-averaging", "before-averaging"])
def test_weight_averaging_resumes_exactly(crash, tmp_path):
    assert_exact(_resume_with(_averaging, Config(), crash, tmp_path))


def test_stochastic_weight_averaging_resumes_exactly_from_an_epochs_end(tmp_path):
    assert_exact(_resume_with(_swa, Config(), CrashPoint("train_epoch_end", epoch=0), tmp_path))


@pytest.mark.parametrize("crash", [WHILE_AVERAGING, BEFORE_AVERAGING], ids=["while-averaging", "before-averaging"])
def test_stochastic_weight_averaging_mid_epoch_warns_before_training(crash, tmp_path):
    """Lightning's SWA callback does not resume exactly mid-epoch (stock Lightning neither): said before training."""
    with pytest.warns(UserWarning, match="StochasticWeightAveraging does not resume exactly") as caught:
        comparison = _resume_with(_swa, Config(), crash, tmp_path)
    assert comparison.resumed.seen == comparison.full.seen[len(comparison.interrupted.seen) :]  # the data is exact
    assert any("StochasticWeightAveraging" in str(w.message) for w in caught)
