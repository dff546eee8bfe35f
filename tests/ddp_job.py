"""One training run on CPU with DDP (gloo), as a script: Lightning's DDP launcher runs it once per rank.

``python tests/ddp_job.py OUT --devices 2 [--crash EPOCH BATCH] [--resume CKPT] [--config JSON] [--stock]`` trains the
harness model and writes ``OUT/rank{r}.pt`` (the batches each rank trained, the final parameters and random states);
with ``--crash`` every rank writes the checkpoint ``OUT/crash.ckpt`` in ``on_train_batch_end`` and stops; with
``--crash ... --on-exception`` every rank's ``training_step`` raises there instead and ``OnExceptionCheckpoint`` writes
``OUT/on_exception.ckpt``. Each rank records the warnings it saw.

``--strategy`` picks ``ddp`` (the default), the launchers that pickle the trainer into new processes (``ddp_spawn``,
``ddp_fork``, ``ddp_notebook``: their ranks stop at ``--crash`` by exiting, as a killed job does), or ``fsdp``: FSDP on
CPU through :class:`CPUFSDPStrategy`, whose ``crash.ckpt`` is a sharded checkpoint directory. ``--num-nodes 2`` with
``--devices 1`` is one node of a two-node job: run it twice, with ``NODE_RANK`` 0 and 1 and the same ``MASTER_ADDR``
and ``MASTER_PORT`` in the environment.

With ``MIDEPOCH_DELIVERY=lightning`` (tests/harness.py's ``DELIVERY``; `make upstream-check`, whose environment has no
lightning_midepoch) the feature is a Lightning with the upstream patches applied: the package is never imported and
no ``MidEpochResume`` is attached (as with ``--stock``); options that configure the callback (``--verify-batch``
other than its default) are refused.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import contextlib
import importlib
import logging
import os

import numpy as np
import torch
from torch.multiprocessing import ProcessExitedException

from harness import (
    DELIVERY,
    NAMESPACE,
    Config,
    Crash,
    CrashCallback,
    CrashPoint,
    L,
    Model,
    ModelCheckpoint,
    OnExceptionCheckpoint,
)

if DELIVERY == "callback":
    from lightning_midepoch import MidEpochResume, MidEpochResumeError
else:  # MIDEPOCH_DELIVERY=lightning: the patched Lightning resumes by itself, without the package

    class MidEpochResumeError(Exception):  # type: ignore[no-redef]
        """A stand-in that nothing raises: without the callback no batch is verified."""


FSDPStrategy = importlib.import_module(f"{NAMESPACE}.strategies").FSDPStrategy


class CPUFSDPStrategy(FSDPStrategy):  # type: ignore[misc,valid-type]
    """FSDP on CPU processes with gloo, for tests only: Lightning accepts this subclass where it refuses
    ``strategy="fsdp"`` without a GPU, and torch's FSDP gets the CPU as its device (Lightning passes the device's
    index, which a CPU lacks). No mixed precision, so the parameters keep the model's dtype."""

    @property
    def mixed_precision_config(self) -> None:
        return None

    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel(module=model, device_id=torch.device("cpu"), **self.kwargs)


class DivergeRanks(L.Callback):
    """Give every rank its own random streams (seed_everything seeds them alike), so that swapping them shows."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        draws = trainer.global_rank + 1
        torch.rand(draws), np.random.rand(draws), [random.random() for _ in range(draws)]


class CountSaves(L.Callback):
    """Counts this rank's torch.save calls during training (stock Lightning makes none on ranks other than 0)."""

    def __init__(self) -> None:
        self.count = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        save = torch.save

        def counting(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return save(*args, **kwargs)

        torch.save = counting  # type: ignore[assignment]
        self.restore = save

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        torch.save = self.restore  # type: ignore[assignment]


class Report(L.Callback):
    """Writes what this rank trained at the end of fit (spawned ranks have no code after ``fit`` of their own), or
    at the crash point: there each rank writes its checkpoint and exits at once, as a killed job would (an exception
    would reach the launching process as another exception, and a pickled trainer's ``fit`` returns nothing)."""

    def __init__(self, out: Path, saves: CountSaves, crash: CrashPoint | None) -> None:
        self.out, self.saves, self.crash = out, saves, crash

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.crash is not None and (trainer.current_epoch, batch_idx) == (self.crash.epoch, self.crash.batch):
            trainer.save_checkpoint(self.out / "crash.ckpt")
            _write(self.out, trainer, pl_module, self.saves)
            trainer.strategy.barrier()  # the launcher ends every rank once one exits: each has written its report
            os._exit(KILLED)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        _write(self.out, trainer, pl_module, self.saves)


#: The exit status of a spawned rank that stopped at its crash point (the launching process expects it).
KILLED = 17


class _Messages(logging.Handler):
    """Keeps the messages logged (Lightning's rank-zero info messages among them)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _write(
    out: Path,
    trainer: L.Trainer,
    model: Any,
    saves: CountSaves,
    caught: list[str] | None = None,
    error: str | None = None,
) -> None:
    if isinstance(trainer.strategy, FSDPStrategy):  # every rank gathers the full parameters from the shards
        from torch.distributed.fsdp import FullyShardedDataParallel

        with FullyShardedDataParallel.summon_full_params(trainer.strategy.model):
            params = {name: value.detach().clone() for name, value in model.state_dict().items()}
    else:
        params = {name: value.detach().clone() for name, value in model.state_dict().items()}
    result = {
        "warnings": caught or [],
        "seen": model.seen,
        "params": params,
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state()[1].copy(), "python": random.getstate()},
        "world_size": trainer.world_size,
        "saves": saves.count,
        "error": error,
    }
    torch.save(result, out / f"rank{trainer.global_rank}.pt")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--crash", type=int, nargs=2, metavar=("EPOCH", "BATCH"))
    parser.add_argument("--resume")
    parser.add_argument("--config", default="{}")
    parser.add_argument("--stock", action="store_true", help="without MidEpochResume (the transparency reference)")
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--strategy", default="ddp", choices=["ddp", "ddp_spawn", "ddp_fork", "ddp_notebook", "fsdp"])
    parser.add_argument("--checkpoint-every", type=int, default=0, help="ModelCheckpoint(every_n_train_steps=N)")
    parser.add_argument("--on-exception", action="store_true", help="--crash raises in training_step instead")
    parser.add_argument("--verify-batch", default="warn", help="MidEpochResume(verify_batch=...)")
    args = parser.parse_args()
    if DELIVERY != "callback" and args.verify_batch != parser.get_default("verify_batch"):
        parser.error(
            f"--verify-batch {args.verify_batch} configures MidEpochResume, which MIDEPOCH_DELIVERY={DELIVERY} does "
            "not attach (the patched Lightning resumes by itself)"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = Config(**json.loads(args.config))
    L.seed_everything(1, verbose=False)
    model = Model(config)
    if args.resume:  # a fresh process's states (PL_GLOBAL_SEED, which seeds the injected sampler, stays the same)
        torch.manual_seed(77), np.random.seed(77), random.seed(77)
    saves = CountSaves()
    if DELIVERY == "callback":
        ours = MidEpochResume(verify_batch=args.verify_batch)
        callbacks: list[L.Callback] = [DivergeRanks(), saves] if args.stock else [ours, DivergeRanks(), saves]
    else:  # the patched Lightning resumes by itself: nothing to attach, as with --stock
        callbacks = [DivergeRanks(), saves]
    spawned = args.strategy in ("ddp_spawn", "ddp_fork", "ddp_notebook")
    crash = CrashPoint("train_batch_end", *args.crash) if args.crash and not args.on_exception else None
    if spawned:
        callbacks.append(Report(out, saves, crash))
    if args.checkpoint_every:
        every = args.checkpoint_every
        callbacks.append(ModelCheckpoint(dirpath=out / "checkpoints", every_n_train_steps=every, save_top_k=-1))
    if args.crash and args.on_exception:
        model.raise_at = (args.crash[0], args.crash[1])
        callbacks.append(OnExceptionCheckpoint(dirpath=out))
    elif crash is not None and not spawned:
        callbacks.append(CrashCallback(crash, out / "crash.ckpt"))
    strategy: Any = args.strategy if args.devices * args.num_nodes > 1 else "auto"
    if strategy == "fsdp":
        strategy = CPUFSDPStrategy(state_dict_type="sharded")
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy=strategy,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(args.checkpoint_every) or args.on_exception,
        num_sanity_val_steps=0,
        callbacks=callbacks,
        default_root_dir=out,
        **config.trainer_kwargs(),
    )
    logged = _Messages()
    logging.getLogger(NAMESPACE).addHandler(logged)  # Lightning's rank-zero info messages (it does not propagate them)
    error = None
    with warnings.catch_warnings(record=True) as caught, contextlib.suppress(Crash):
        warnings.simplefilter("always")
        try:
            trainer.fit(model, ckpt_path=args.resume)
        except ProcessExitedException as exited:  # the spawned ranks stopped at the crash point
            if exited.exit_code != KILLED:
                raise
        except MidEpochResumeError as raised:  # verify_batch="raise": every rank raises, none is left waiting
            error = str(raised)
    if not spawned:
        _write(out, trainer, model, saves, [str(warning.message) for warning in caught] + logged.messages, error)


if __name__ == "__main__":
    main()
