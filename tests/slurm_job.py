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

import numpy as np
import torch

from chaos import SLURMEnvironment, _SaveCounter
from harness import Config, L, Model, OnExceptionCheckpoint
from lightning_midepoch import MidEpochResume

TRAINING = threading.Event()
SIGNALLED: list[float] = []  # when the scheduler sent SLURM's signal


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


class RaiseOnOneRank(L.Callback):
    """Rank ``rank`` raises at the end of training step ``step`` (a user's error on one rank)."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            raise RuntimeError(f"a user's error on rank {self.rank}")


def scheduler(job_dir: Path, signal_after: float, kill_wait: float, signum: int) -> None:
    TRAINING.wait()
    time.sleep(signal_after)
    SIGNALLED.append(time.monotonic())
    os.kill(os.getpid(), signum)
    if signum == signal.SIGTERM:
        return  # Lightning ends the job itself (its SIGTERM exception)
    while not (job_dir / "requeued").exists():
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)  # scontrol requeue: SLURM ends every task of the job ...
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
    args = parser.parse_args()
    job_dir = Path(args.job_dir)
    rank = int(os.environ["SLURM_PROCID"])
    config = Config(**json.loads(args.config))
    L.seed_everything(1, verbose=False)
    model = Model(config)
    if args.attempt:  # a fresh process's states (PL_GLOBAL_SEED, which seeds the injected sampler, stays the same)
        torch.manual_seed(77 + rank), np.random.seed(77 + rank), random.seed(77 + rank)
    paced = Paced()
    # (paced first: the training's end is timed before the callback's last consistent point)
    callbacks = [paced, *([] if args.stock else [MidEpochResume()]), _SaveCounter()]
    if args.flow == "sigterm":
        callbacks.append(OnExceptionCheckpoint(dirpath=job_dir))
    if args.raise_on is not None:
        callbacks.append(RaiseOnOneRank(*args.raise_on))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
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
        signum = signal.SIGUSR1 if args.flow == "slurm" else signal.SIGTERM
        schedule = (job_dir, args.signal_after, args.kill_wait, signum)
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
    torch.save(result, job_dir / f"rank{rank}-{args.attempt}.pt")


if __name__ == "__main__":
    main()
