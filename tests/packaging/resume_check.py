"""One real crash and resume with an *installed* lightning-midepoch; exit status 0 only if the resume was exact.

``make dist-check`` runs it with the python of a fresh virtual environment, from a directory outside the source tree
and without ``PYTHONPATH``, so that nothing from the checkout can be imported::

    python resume_check.py NAMESPACE WORKDIR      # NAMESPACE: lightning.pytorch or pytorch_lightning

It trains a small model (shuffled data, dropout) for two epochs without interruption; then again, with a
``ModelCheckpoint`` every 3 steps and an exception raised in the middle of the second epoch; then resumes from the
last checkpoint, in a process whose random states were scrambled, once with ``MidEpochResume`` (the final weights must
be bitwise equal to the uninterrupted run's) and once without it (they must differ: the check can tell). It needs only
torch, the Lightning namespace and lightning-midepoch; it prints one line per finding.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

BATCHES_PER_EPOCH = 10
CHECKPOINT_EVERY = 3
CRASH_AT_STEP = 13  # epoch 1, batch 3: the last checkpoint (step 12) is 2 batches into the second epoch


class Crash(RuntimeError):
    """The simulated failure."""


def _loader() -> DataLoader:
    data = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.randn(4 * BATCHES_PER_EPOCH, 4, generator=data), torch.randn(40, 1, generator=data))
    return DataLoader(dataset, batch_size=4, shuffle=True)


def _fit(L: Any, root: Path, callbacks: list[Any], ckpt_path: Path | None = None) -> nn.Module:
    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.3), nn.Linear(8, 1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    model = Model()
    if ckpt_path is not None:
        torch.manual_seed(12345)  # a fresh process's random states differ from the interrupted run's
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=any(isinstance(c, L.callbacks.ModelCheckpoint) for c in callbacks),
        default_root_dir=root,
        callbacks=callbacks,
    )
    trainer.fit(model, train_dataloaders=_loader(), ckpt_path=ckpt_path)
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("namespace", choices=["lightning.pytorch", "pytorch_lightning"])
    parser.add_argument("workdir", type=Path)
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=False)  # a fresh directory: no checkpoint of an earlier run in it

    for logger in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric"):
        logging.getLogger(logger).setLevel(logging.WARNING)  # no "GPU available" banners; warnings still show
    L = importlib.import_module(args.namespace)
    import lightning_midepoch
    from lightning_midepoch import MidEpochResume

    print(f"lightning_midepoch {lightning_midepoch.__version__} from {lightning_midepoch.__file__}")
    print(f"{args.namespace} {L.__version__}, torch {torch.__version__}, python {sys.version.split()[0]}")

    class CrashAt(L.Callback):
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if trainer.global_step == CRASH_AT_STEP:
                raise Crash(f"simulated crash at step {CRASH_AT_STEP}")

    full = _fit(L, args.workdir / "full", [MidEpochResume()])

    checkpoints = args.workdir / "interrupted" / "checkpoints"
    saver = L.callbacks.ModelCheckpoint(dirpath=checkpoints, every_n_train_steps=CHECKPOINT_EVERY, save_last=True)
    try:
        _fit(L, args.workdir / "interrupted", [MidEpochResume(), saver, CrashAt()])
    except Crash as crash:
        print(f"interrupted: {crash}")
    else:
        print("FAIL: the interrupted run was not interrupted")
        return 1
    last = checkpoints / "last.ckpt"
    saved = torch.load(last, map_location="cpu", weights_only=False)
    batch = saved["global_step"] - saved["epoch"] * BATCHES_PER_EPOCH
    print(f"last checkpoint: epoch {saved['epoch']}, after batch {batch} of {BATCHES_PER_EPOCH}")
    if not 0 < batch < BATCHES_PER_EPOCH:
        print("FAIL: the last checkpoint was not written in the middle of an epoch")
        return 1

    failures = 0
    for name, callbacks, want_equal in (("MidEpochResume", [MidEpochResume()], True), ("stock Lightning", [], False)):
        resumed = _fit(L, args.workdir / f"resumed-{name.split()[0]}", callbacks, ckpt_path=last)
        pairs = zip(full.state_dict().items(), resumed.state_dict().values(), strict=True)
        equal = all(torch.equal(expected, actual) for (_, expected), actual in pairs)
        verdict = "ok" if equal == want_equal else "FAIL"
        failures += verdict == "FAIL"
        print(f"{verdict}: resumed with {name}: final weights {'' if equal else 'not '}bitwise equal to uninterrupted")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
