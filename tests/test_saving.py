"""Checkpoints written after ``fit`` returned or raised record where training stopped, and continue from there."""

from __future__ import annotations

import importlib
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from gather_job import rank_state
from harness import (
    NAMESPACE,
    Comparison,
    Config,
    CrashPoint,
    L,
    Model,
    ModelCheckpoint,
    assert_exact,
    assert_same_state,
    interrupt_and_resume,
    run,
)
from lightning_midepoch import MidEpochResume, _saving
from lightning_midepoch import _state as S
from lightning_midepoch._saving import gather

FULL = Config(max_epochs=3, max_steps=17)  # 10 batches an epoch: ends in the middle of epoch 1


class StopAt(L.Callback):
    """Ends ``fit`` after global step ``step`` the way a user's code or a callback does."""

    def __init__(self, step: int, how: str) -> None:
        self.step, self.how = step, how
        self.trainer: Any = None

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.trainer = trainer
        if trainer.global_step != self.step:
            return
        if self.how == "should_stop":  # what EarlyStopping and Timer (max_time) do
            trainer.should_stop = True
        elif self.how == "keyboard_interrupt":
            raise KeyboardInterrupt


class Clock(L.Callback):
    """A clock for Lightning's Timer (``max_time``) that advances one second per batch: deterministic time."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def on_train_batch_start(self, *args: Any) -> None:
        self.now += 1.0


@pytest.fixture
def _sigint_restored():
    handler = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, handler)  # Lightning ignores further Ctrl+C after a KeyboardInterrupt


def _stop_then_resume(config: Config, how: str, step: int, tmp_path: Path, monkeypatch: Any = None) -> Comparison:
    """Train until ``how`` stops fit after ``step`` steps, save with ``trainer.save_checkpoint``, resume to the end."""
    full = run(config, tmp_path / "full")
    ckpt = tmp_path / "after_fit.ckpt"
    if how == "max_steps":
        first = run(replace(config, max_steps=step), tmp_path / "first")
        first.trainer.save_checkpoint(ckpt)
    elif how == "max_time":
        clock = Clock()
        monkeypatch.setattr(importlib.import_module(f"{NAMESPACE}.callbacks.timer"), "time", clock)
        first = run(config, tmp_path / "first", extra_callbacks=[clock], max_time={"seconds": step})
        first.trainer.save_checkpoint(ckpt)
    else:
        stop = StopAt(step, how)
        if how == "keyboard_interrupt":
            with pytest.raises(SystemExit):  # Lightning's graceful shutdown after Ctrl+C
                run(config, tmp_path / "first", extra_callbacks=[stop])
            first = None
        else:
            first = run(config, tmp_path / "first", extra_callbacks=[stop])
        stop.trainer.save_checkpoint(ckpt)
        model = stop.trainer.lightning_module
        if first is None:  # the interrupted run's batches, as run() would have returned them
            first = type("Stopped", (), {"seen": model.seen, "model": model})()
    assert len(first.seen) == step
    resumed = run(config, tmp_path / "resumed", ckpt_path=ckpt, seed=2)
    return Comparison(full, first, resumed)  # type: ignore[arg-type]


@pytest.mark.usefixtures("_sigint_restored")
@pytest.mark.parametrize("how", ["max_steps", "max_time", "should_stop", "keyboard_interrupt"])
@pytest.mark.parametrize(
    "config",
    [FULL, replace(FULL, num_workers=2), replace(FULL, validation=True, val_check_interval=3)],
    ids=["plain", "workers", "validation"],
)
def test_a_fit_stopped_mid_epoch_continues_exactly(config, how, tmp_path, monkeypatch):
    """fit stops at step 13 (epoch 1, batch 2); a checkpoint written after it continues that epoch exactly."""
    assert_exact(_stop_then_resume(config, how, 13, tmp_path, monkeypatch))


@pytest.mark.parametrize("how", ["max_steps", "should_stop"])
def test_a_fit_stopped_at_an_epochs_end_continues_with_the_next_epoch(how, tmp_path):
    assert_exact(_stop_then_resume(FULL, how, 10, tmp_path))


def test_stock_lightning_starts_a_new_epoch_instead(tmp_path):
    """The control: without the callback, the rest of the stopped epoch is never trained."""
    first = run(replace(FULL, max_steps=13), tmp_path / "first", callback=False)
    first.trainer.save_checkpoint(tmp_path / "after_fit.ckpt")
    resumed = run(FULL, tmp_path / "resumed", callback=False, ckpt_path=tmp_path / "after_fit.ckpt", seed=2)
    assert resumed.seen[0][0] == 2  # the rest of epoch 1 is never trained


def test_the_state_records_the_stop(tmp_path):
    first = run(replace(FULL, max_steps=13), tmp_path)
    first.trainer.save_checkpoint(tmp_path / "after_fit.ckpt")
    state = torch.load(tmp_path / "after_fit.ckpt", weights_only=True)["callbacks"]["MidEpochResume"]
    assert (state["epoch"], state["fetched"], state["stopped"]) == (1, 3, True)
    loops = torch.load(tmp_path / "after_fit.ckpt", weights_only=True)["loops"]["fit_loop"]
    assert loops["epoch_progress"]["current"]["completed"] == 2  # Lightning counts the stopped epoch as finished


def test_a_checkpoint_written_before_any_fit_resumes_as_stock(tmp_path):
    """A trainer that has not trained saves an empty state; resuming it is what stock Lightning does."""
    trainer = L.Trainer(callbacks=[MidEpochResume()], logger=False, enable_checkpointing=False)
    trainer.strategy.connect(Model(FULL))
    trainer.save_checkpoint(tmp_path / "before.ckpt")
    state = torch.load(tmp_path / "before.ckpt", weights_only=True)["callbacks"]["MidEpochResume"]
    assert state == S.empty_state()
    stock = run(FULL, tmp_path / "stock", callback=False, ckpt_path=tmp_path / "before.ckpt")
    ours = run(FULL, tmp_path / "ours", ckpt_path=tmp_path / "before.ckpt")
    assert ours.seen == stock.seen
    assert_same_state(ours, stock)


def test_gather_on_one_process_is_the_rank_itself():
    state = {"rng": {}}
    assert gather(state, rank=0, world_size=1, own_only=False) == [state]
    assert gather(state, rank=1, world_size=2, own_only=True) == [state]  # no process group: nothing to exchange


def _assert_identical(received: Any, sent: Any, where: str = "state") -> None:
    """The same nested structure, with tensors of the same dtype, shape and bytes (NaN and -0.0 included)."""
    assert type(received) is type(sent), where
    if isinstance(sent, torch.Tensor):
        assert (received.dtype, received.shape) == (sent.dtype, sent.shape), where
        assert received.contiguous().view(-1).view(torch.uint8).tolist() == (
            sent.contiguous().view(-1).view(torch.uint8).tolist()
        ), where
    elif isinstance(sent, dict):
        assert list(received) == list(sent), where
        for key in sent:
            _assert_identical(received[key], sent[key], f"{where}[{key!r}]")
    elif isinstance(sent, (list, tuple)):
        assert len(received) == len(sent), where
        for index, (r, s) in enumerate(zip(received, sent, strict=True)):
            _assert_identical(r, s, f"{where}[{index}]")
    else:
        assert received == sent, where


@pytest.mark.parametrize("world_size", [2, 3])
def test_gather_brings_every_ranks_state_to_rank_0_exactly(world_size, tmp_path):
    """Real gloo processes: rank 0 gets each rank's state bitwise (bfloat16, NaN, strided); the others get nothing."""
    job = Path(__file__).resolve().parent / "gather_job.py"
    processes = [
        subprocess.Popen([sys.executable, str(job), str(tmp_path), str(rank), str(world_size)], stderr=subprocess.PIPE)
        for rank in range(world_size)
    ]
    for process in processes:
        _, error = process.communicate(timeout=120)
        assert process.returncode == 0, error.decode()[-3000:]
    results = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in range(world_size)]
    assert len(results[0]["gathered"]) == world_size
    for rank, result in enumerate(results):
        _assert_identical(results[0]["gathered"][rank], result["sent"], f"rank {rank}'s state on rank 0")
    assert not torch.equal(results[0]["sent"]["grads"]["weight"], results[1]["sent"]["grads"]["weight"])
    for rank in range(1, world_size):
        others = [state for index, state in enumerate(results[rank]["gathered"]) if index != rank]
        assert others == [None] * (world_size - 1)
        _assert_identical(results[rank]["gathered"][rank], results[rank]["sent"])


def test_a_state_sent_point_to_point_arrives_bitwise(monkeypatch):
    """The messages of one rank's state, passed through a queue in this process: the same state comes out."""
    queue: list[torch.Tensor] = []

    def send(tensor: torch.Tensor, dst: int) -> None:
        assert dst == 0
        queue.append(tensor.clone())

    def recv(tensor: torch.Tensor, src: int) -> None:
        assert src == 1
        tensor.copy_(queue.pop(0))

    monkeypatch.setattr(torch.distributed, "send", send)
    monkeypatch.setattr(torch.distributed, "recv", recv)
    sent = rank_state(1)
    _saving._send(sent, torch.device("cpu"))
    nonempty = [value for value in sent["grads"].values() if value.numel()]
    assert len(queue) == 2 + 2 + len(nonempty)  # header size, header, torch's RNG state, a generator's, each gradient
    _assert_identical(_saving._receive(1, torch.device("cpu")), sent)
    assert queue == []


def test_modelcheckpoints_last_written_when_max_steps_stopped_the_epoch_continues_it(tmp_path):
    """ModelCheckpoint(save_last=True) writes last.ckpt in on_train_epoch_end, after max_steps stopped the epoch."""
    full = run(FULL, tmp_path / "full")
    saving = ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=True, save_top_k=0)
    first = run(replace(FULL, max_steps=13), tmp_path / "first", extra_callbacks=[saving])
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["callbacks"]["MidEpochResume"]["stopped"]
    resumed = run(FULL, tmp_path / "resumed", ckpt_path=last, seed=2)
    assert_exact(Comparison(full, first, resumed))


@pytest.mark.parametrize(
    ("every", "crash"),
    [
        (2, CrashPoint("train_batch_start", epoch=0, batch=1)),
        (2, CrashPoint("before_backward", epoch=1, batch=5)),
        (2, CrashPoint("exception", epoch=1, batch=3)),
        (4, CrashPoint("before_backward", epoch=1, batch=9)),  # the group of batches 8, 9 that the epoch's end closes
        (3, CrashPoint("before_optimizer_step", epoch=1, batch=9)),  # a group of one (batch 9): zeroed when run again
    ],
    ids=repr,
)
def test_a_checkpoint_inside_the_batch_that_ends_an_accumulation_group_keeps_the_groups_gradients(
    every, crash, tmp_path, recwarn
):
    """Lightning runs the interrupted batch again without zeroing the gradients (it zeroes them at a group's first
    batch only): it needs those of the group's earlier batches, also in the batch that steps."""
    assert_exact(interrupt_and_resume(Config(accumulate_grad_batches=every), crash, tmp_path))
    assert not [w for w in recwarn if "gradient accumulation group" in str(w.message)]


def test_a_checkpoint_after_backward_in_the_batch_that_ends_an_accumulation_group_warns(tmp_path):
    """After that batch's backward, its gradients are in those saved: running it again adds them twice (warned)."""
    config = Config(accumulate_grad_batches=2, hook_draws=False)
    crash = CrashPoint("before_optimizer_step", epoch=1, batch=5)
    with pytest.warns(UserWarning, match="after the backward pass of a batch inside a gradient accumulation group"):
        comparison = interrupt_and_resume(config, crash, tmp_path)
    full, interrupted, resumed = comparison.full, comparison.interrupted, comparison.resumed
    assert interrupted.seen + resumed.seen == full.seen
    differ = [
        name
        for (name, a), b in zip(full.model.named_parameters(), resumed.model.parameters(), strict=True)
        if not a.equal(b)
    ]
    assert differ


def test_a_checkpoint_after_backward_warns_where_a_schedule_starts_accumulating(tmp_path):
    """Whether a batch's backward ran is followed from the batch a GradientAccumulationScheduler starts accumulating
    in (the first epoch accumulates nothing)."""
    config = Config(accumulate_schedule=((1, 3),), hook_draws=False)
    crash = CrashPoint("after_backward", epoch=1, batch=4)
    with pytest.warns(UserWarning, match="after the backward pass of a batch inside a gradient accumulation group"):
        comparison = interrupt_and_resume(config, crash, tmp_path)
    assert comparison.interrupted.seen + comparison.resumed.seen == comparison.full.seen


def test_a_checkpoint_after_backward_inside_an_accumulation_group_warns_and_adds_that_batch_twice(tmp_path):
    """Batch 4 is in the accumulation group of batches 3, 4, 5: its gradients are saved, and it runs again."""
    config = Config(accumulate_grad_batches=3, hook_draws=False)
    crash = CrashPoint("after_backward", epoch=1, batch=4)
    with pytest.warns(UserWarning, match="after the backward pass of a batch inside a gradient accumulation group"):
        comparison = interrupt_and_resume(config, crash, tmp_path)
    full, interrupted, resumed = comparison.full, comparison.interrupted, comparison.resumed
    done = len(interrupted.seen)
    # the order is exact: the resumed run trains batch 4 again, then the rest
    assert interrupted.seen + resumed.seen == full.seen
    assert resumed.seen[0] == (1, 4, full.seen[done][2])
    # ... but batch 4's gradients count twice in the group's step: the weights differ from there on
    differ = [
        name
        for (name, a), b in zip(full.model.named_parameters(), resumed.model.parameters(), strict=True)
        if not a.equal(b)
    ]
    assert differ


#: Augmentation in ``__getitem__`` read in the main process: the global generators and the dataset's own.
MAIN_PROCESS_AUGMENTED = Config(augment=True, num_workers=0, max_epochs=2)


@pytest.mark.parametrize(
    "crash",
    [
        CrashPoint("train_batch_end", epoch=0, batch=4),  # between batches
        CrashPoint("train_batch_start", epoch=0, batch=5),  # inside a batch: it is fetched again
        CrashPoint("before_backward", epoch=0, batch=5),
        CrashPoint("train_batch_start", epoch=1, batch=0),  # inside the batch whose fetch drew the epoch's order
        CrashPoint("train_epoch_end", epoch=0),
        CrashPoint("model_checkpoint", step=13, every=13),
    ],
    ids=str,
)
def test_augmentation_drawn_in_the_main_process_resumes_exactly(crash, tmp_path):
    """A dataset read without workers draws as each sample is loaded: a checkpoint saves its own generators' states,
    and one written inside a batch saves the states from before the batch's fetch, which a resumed run repeats."""
    assert_exact(interrupt_and_resume(MAIN_PROCESS_AUGMENTED, crash, tmp_path))


@pytest.mark.parametrize(
    ("pipeline", "crash"),
    [
        ("lazy", CrashPoint("train_batch_end", epoch=0, batch=4)),
        ("lazy", CrashPoint("model_checkpoint", step=13, every=13)),
        ("compose", CrashPoint("train_batch_end", epoch=0, batch=4)),
    ],
    ids=["lazy-mid-epoch", "lazy-model-checkpoint", "compose-mid-epoch"],
)
def test_generators_a_pipeline_creates_or_holds_in_the_main_process_resume_exactly(pipeline, crash, tmp_path):
    """A generator the dataset creates on its first sample is found at the checkpoint, and created again on resume
    (sample 0 loaded once) before its saved state is put back; a Compose pipeline's steps' generators are found."""
    config = Config(augment=True, max_epochs=2, pipeline=pipeline)
    assert_exact(interrupt_and_resume(config, crash, tmp_path))


def test_a_dataset_generator_is_saved_where_the_sampler_does_not_hold_it(tmp_path):
    checkpoint_dir = tmp_path / "run" / "checkpoints"
    crash = CrashPoint("train_batch_end", epoch=0, batch=4)
    assert run(MAIN_PROCESS_AUGMENTED, tmp_path / "run", crash=crash).crashed
    (path,) = checkpoint_dir.glob("*.ckpt")
    (ranks,) = torch.load(path, weights_only=True)["callbacks"]["MidEpochResume"][S.KEY_RANKS]
    assert list(ranks[S.KEY_DATASET_GENERATORS][0]) == ["dataset.generator"]
    assert ranks[S.KEY_GENERATORS] == [{}]  # (the sampler draws from the global generator)
