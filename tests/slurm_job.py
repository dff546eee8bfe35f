"""One task of a 2-task SLURM job step on CPU (gloo), as a script: what ``srun`` starts on each rank.

``python tests/slurm_job.py JOB_DIR --attempt A [--signal-after SECONDS] [--stock] [--config JSON]`` trains the
harness model with ``SLURMEnvironment(auto_requeue=True)`` and writes ``JOB_DIR/rank{r}-{A}.pt`` (the batches this
rank trained, its final parameters, how its fit ended). With ``--signal-after``, a thread plays the scheduler for this
task: SIGUSR1 after that many seconds (each rank its own moment), then, once the requeue ran (the fake ``scontrol``
wrote ``JOB_DIR/requeued``), SIGTERM, and SIGKILL ``--kill-wait`` seconds later. A requeued attempt calls ``fit``
with no ``ckpt_path``: Lightning restores the newest ``hpc_ckpt_N.ckpt`` of ``JOB_DIR`` itself. ``--flow sigterm``:
no auto-requeue, SIGTERM instead, ``OnExceptionCheckpoint`` writes ``JOB_DIR/on_exception.ckpt`` and the next
attempt passes it as ``--resume``. The SLURM variables
(``SLURM_PROCID`` and the rest) come from the launching test, as ``srun`` sets them. The signal's moment is
counted from ``on_train_start``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from chaos import SLURMEnvironment, _SaveCounter
from harness import Config, IndexedDataset, L, Model, OnExceptionCheckpoint
from lightning_midepoch import MidEpochResume

TRAINING = threading.Event()
SIGNALLED: list[float] = []  # when the scheduler sent SLURM's signal
#: training is over (``on_train_end``, or ``on_exception``): the scheduler sends no more signals. One sent later would
#: meet the default action that Lightning's teardown gives the signal back (in stock Lightning as with the callback)
#: and end the task before it writes its result, the launcher's only view of it: SLURM signals every task of a job
#: within milliseconds, and the spread of moments between the ranks here is the harness's own.
OVER = threading.Event()
SENDING = threading.Lock()  # (a signal is sent, or training ends, not both at once)


def send(signum: int, note: list[float] | None = None) -> bool:
    """Send ``signum`` to this task unless training is over (noting the moment in ``note``); whether it was sent."""
    with SENDING:
        if OVER.is_set():
            return False
        if note is not None:
            note.append(time.monotonic())
        os.kill(os.getpid(), signum)
        return True


class Paced(L.Callback):
    """Times the training, and gives each step at least ``PACE`` seconds: a signal sent within the first part of the
    uninterrupted job's training lands in this job's training however busy the machine is."""

    PACE = 0.01

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.started = time.monotonic()
        TRAINING.set()

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        time.sleep(self.PACE)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.ended = time.monotonic()
        with SENDING:
            OVER.set()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        with SENDING:
            OVER.set()


class RaiseOnOneRank(L.Callback):
    """Rank ``rank`` raises at the end of training step ``step`` (a user's error on one rank), or, ``in_validation``,
    at the end of batch ``step`` of the first validation."""

    def __init__(self, rank: int, step: int, in_validation: bool = False) -> None:
        self.rank, self.step, self.in_validation = rank, step, in_validation

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if not self.in_validation and trainer.global_rank == self.rank and trainer.global_step == self.step:
            raise RuntimeError(f"a user's error on rank {self.rank}")

    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, *_: Any
    ) -> None:
        if (
            self.in_validation
            and not trainer.sanity_checking
            and trainer.global_rank == self.rank
            and batch_idx == self.step
        ):
            raise RuntimeError(f"a user's error on rank {self.rank}, in a validation")


class LongValidation(Model):
    """The harness model with ``size`` validation samples (``size / 2 / ranks`` batches per rank)."""

    val_size = 4

    def val_dataloader(self) -> Any:
        return DataLoader(IndexedDataset(self.val_size, offset=500), batch_size=2, shuffle=True)


class SignalInValidation(L.Callback):
    """Plays the scheduler inside the first validation of the fit: the signal as its batch ``batch`` starts (to this
    rank), then what follows as :func:`scheduler`. Each validation batch takes at least ``pace`` seconds. Notes the
    moments (the signal's, each checkpoint's) and the validation batches begun at each checkpoint."""

    def __init__(self, job_dir: Path, batch: int, pace: float, kill_wait: float, signum: int | None) -> None:
        self.job_dir, self.batch, self.pace, self.kill_wait, self.signum = job_dir, batch, pace, kill_wait, signum
        self.sent_at: float | None = None
        self.saves: list[tuple[float, int | None]] = []

    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int, *_: Any
    ) -> None:
        if trainer.sanity_checking:
            return
        if self.signum is not None and self.sent_at is None and batch_idx == self.batch:
            self.sent_at = time.monotonic()
            SIGNALLED.append(self.sent_at)
            os.kill(os.getpid(), self.signum)
            if self.signum != signal.SIGTERM:
                follow = (self.job_dir, self.kill_wait)
                threading.Thread(target=requeue_ends_the_job, args=follow, daemon=True).start()
        time.sleep(self.pace)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        progress = trainer.fit_loop.epoch_loop.val_loop.batch_progress.current
        self.saves.append((time.monotonic(), progress.ready if trainer.validating else None))


def scheduler(job_dir: Path, signal_after: float, kill_wait: float, signum: int) -> None:
    TRAINING.wait()
    time.sleep(signal_after)
    if not send(signum, SIGNALLED):
        return
    if signum != signal.SIGTERM:  # (SIGTERM: Lightning ends the job itself, its SIGTERM exception)
        requeue_ends_the_job(job_dir, kill_wait)


def requeue_ends_the_job(job_dir: Path, kill_wait: float) -> None:
    """After SLURM's signal: once the requeue ran, SIGTERM to the task, and SIGKILL ``kill_wait`` seconds later."""
    while not (job_dir / "requeued").exists():
        time.sleep(0.05)
    if not send(signal.SIGTERM):  # scontrol requeue: SLURM ends every task of the job ...
        return
    time.sleep(kill_wait)
    os.kill(os.getpid(), signal.SIGKILL)  # ... and kills it after KillWait


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("job_dir")
    parser.add_argument("--attempt", type=int, required=True)
    parser.add_argument("--signal-after", type=float)
    parser.add_argument("--kill-wait", type=float, default=30.0, help="SLURM's KillWait (its default)")
    parser.add_argument("--stock", action="store_true")
    parser.add_argument("--config", default="{}")
    parser.add_argument("--flow", default="slurm", choices=["slurm", "sigterm"], help="sigterm: OnExceptionCheckpoint")
    parser.add_argument("--resume", help="ckpt_path (the slurm flow's requeued job passes none)")
    parser.add_argument("--raise-on", type=int, nargs=2, metavar=("RANK", "STEP"), help="a user's error on one rank")
    parser.add_argument("--raise-in-validation", action="store_true", help="--raise-on's STEP: a validation batch")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--val-size", type=int, default=4, help="validation samples (batches of 2, split over ranks)")
    parser.add_argument("--val-pace", type=float, default=0.0, help="seconds each validation batch takes at least")
    parser.add_argument(
        "--signal-in-validation",
        type=int,
        metavar="BATCH",
        help="the first attempt: the flow's signal as the first validation's batch BATCH starts (every rank)",
    )
    args = parser.parse_args()
    job_dir = Path(args.job_dir)
    rank = int(os.environ["SLURM_PROCID"])
    config = Config(**json.loads(args.config))
    L.seed_everything(1, verbose=False)
    LongValidation.val_size = args.val_size
    model = (LongValidation if args.val_size != 4 else Model)(config)
    if args.attempt:  # a fresh process's states (PL_GLOBAL_SEED, which seeds the injected sampler, stays the same)
        torch.manual_seed(77 + rank), np.random.seed(77 + rank), random.seed(77 + rank)
    paced = Paced()
    # (paced first: the training's end is timed before the callback's last consistent point)
    callbacks = [paced, *([] if args.stock else [MidEpochResume()]), _SaveCounter()]
    if args.flow == "sigterm":
        callbacks.append(OnExceptionCheckpoint(dirpath=job_dir))
    if args.raise_on is not None:
        callbacks.append(RaiseOnOneRank(*args.raise_on, in_validation=args.raise_in_validation))
    flow_signal = signal.SIGUSR1 if args.flow == "slurm" else signal.SIGTERM
    in_validation = args.signal_in_validation if args.attempt == 0 else None
    signum = flow_signal if in_validation is not None else None
    validation = SignalInValidation(job_dir, in_validation or 0, args.val_pace, args.kill_wait, signum)
    callbacks.append(validation)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        plugins=[SLURMEnvironment(auto_requeue=args.flow == "slurm")],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=args.flow == "sigterm",
        num_sanity_val_steps=0,
        callbacks=callbacks,
        default_root_dir=job_dir,
        **config.trainer_kwargs(),
    )
    if args.signal_after is not None:
        schedule = (job_dir, args.signal_after, args.kill_wait, flow_signal)
        threading.Thread(target=scheduler, args=schedule, daemon=True).start()
    ended = "finished"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            trainer.fit(model, ckpt_path=args.resume)
        except SystemExit:  # Lightning's SIGTERMException
            ended = "sigterm"
    params = {name: value.detach().clone() for name, value in model.state_dict().items()}
    result = {"seen": model.seen, "params": params, "ended": ended, "step": trainer.global_step}
    ended = getattr(paced, "ended", time.monotonic())
    result["seconds"] = ended - getattr(paced, "started", ended)  # of training (none: resumed at its very end)
    result["signalled_in_training"] = bool(SIGNALLED) and SIGNALLED[0] < ended
    # in the validation: seconds from the signal to each checkpoint, and the validation batches begun by then
    if validation.sent_at is not None:
        result["validation_signal"] = (
            validation.batch,
            [(at - validation.sent_at, ready) for at, ready in validation.saves],
        )
    write_result(result, job_dir / f"rank{rank}-{args.attempt}.pt")


def write_result(result: dict[str, Any], path: Path) -> None:
    """Write ``result`` to ``path`` whole or not at all: into a temporary file of the same folder, then renamed into
    place (``os.replace``), so a task killed during the write leaves no torn ``path`` (the launcher reads a missing
    one as a task that never finished)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        torch.save(result, temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
