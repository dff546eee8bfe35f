"""One training run on CPU with DDP (gloo), as a script: Lightning's DDP launcher runs it once per rank.

``python tests/ddp_job.py OUT --devices 2 [--crash EPOCH BATCH] [--resume CKPT] [--config JSON]`` trains the
harness model and writes ``OUT/rank{r}.pt`` (the batches each rank trained, the final parameters and random states);
with ``--crash`` every rank writes the checkpoint ``OUT/crash.ckpt`` in ``on_train_batch_end`` and stops.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import contextlib

import numpy as np
import torch

from harness import Config, Crash, CrashCallback, CrashPoint, L, Model
from lightning_midepoch import MidEpochResume


class DivergeRanks(L.Callback):
    """Give every rank its own random streams (seed_everything seeds them alike), so that swapping them shows."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        draws = trainer.global_rank + 1
        torch.rand(draws), np.random.rand(draws), [random.random() for _ in range(draws)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--crash", type=int, nargs=2, metavar=("EPOCH", "BATCH"))
    parser.add_argument("--resume")
    parser.add_argument("--config", default="{}")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = Config(**json.loads(args.config))
    warnings.filterwarnings("ignore")
    L.seed_everything(1, verbose=False)
    model = Model(config)
    if args.resume:  # a fresh process's states (PL_GLOBAL_SEED, which seeds the injected sampler, stays the same)
        torch.manual_seed(77), np.random.seed(77), random.seed(77)
    callbacks: list[L.Callback] = [MidEpochResume(), DivergeRanks()]
    if args.crash:
        callbacks.append(CrashCallback(CrashPoint("train_batch_end", *args.crash), out / "crash.ckpt"))
    strategy = "ddp" if args.devices > 1 else "auto"
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=strategy,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
        default_root_dir=out,
        **config.trainer_kwargs(),
    )
    with contextlib.suppress(Crash):
        trainer.fit(model, ckpt_path=args.resume)
    result = {
        "seen": model.seen,
        "params": {name: value.detach().clone() for name, value in model.state_dict().items()},
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state()[1].copy(), "python": random.getstate()},
        "world_size": trainer.world_size,
    }
    torch.save(result, out / f"rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main()
