"""A frozen training setup for the legacy checkpoints under tests/legacy/checkpoints: never change it.

Checkpoints written by each release of lightning-midepoch (and with each supported Lightning) with this setup are
committed; ``tests/test_legacy.py`` resumes every one with the current code and compares it with an uninterrupted
run of the same setup. Changing anything here would invalidate checkpoints that can never be written again.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_midepoch import MidEpochResume

L = importlib.import_module(os.environ.get("MIDEPOCH_TEST_NAMESPACE", "lightning.pytorch"))

#: name -> (trainer arguments, where the checkpoint is written: hook, epoch, batch)
CASES: dict[str, tuple[dict[str, Any], tuple[str, int, int | None]]] = {
    "mid_epoch": ({}, ("batch_end", 1, 3)),
    "accumulation_group": ({"accumulate_grad_batches": 3}, ("batch_end", 1, 4)),
    "epoch_end": ({}, ("epoch_end", 0, None)),
}


class Samples(Dataset):
    def __len__(self) -> int:
        return 20

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(index)
        return index, torch.randn(4, generator=generator), torch.randn(1, generator=generator)


class FrozenModel(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.3), nn.Linear(16, 1))
        self.seen: list[tuple[int, int, tuple[int, ...]]] = []

    def train_dataloader(self) -> DataLoader:
        return DataLoader(Samples(), batch_size=2, shuffle=True)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        ids, x, y = batch
        self.seen.append((self.current_epoch, batch_idx, tuple(ids.tolist())))
        noise = 1.0 + 1e-3 * (np.random.rand() + random.random())
        return nn.functional.mse_loss(self.net(x), y) * noise

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.9)]


class Interrupt(Exception):
    pass


class SaveAndInterrupt(L.Callback):
    def __init__(self, where: tuple[str, int, int | None], path: Path) -> None:
        self.hook, self.epoch, self.batch = where
        self.path = path

    def _save(self, trainer: Any) -> None:
        trainer.save_checkpoint(self.path)
        raise Interrupt

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.hook == "batch_end" and (trainer.current_epoch, batch_idx) == (self.epoch, self.batch):
            self._save(trainer)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.hook == "epoch_end" and trainer.current_epoch == self.epoch:
            self._save(trainer)


def train(case: str, root: Path, ckpt_path: Path | None = None, save_to: Path | None = None) -> FrozenModel:
    """Train the frozen setup (resuming ``ckpt_path``, or writing the case's checkpoint to ``save_to``)."""
    arguments, where = CASES[case]
    L.seed_everything(3, verbose=False)
    model = FrozenModel()
    if ckpt_path is not None:
        L.seed_everything(4, verbose=False)
    callbacks = [MidEpochResume()] + ([SaveAndInterrupt(where, save_to)] if save_to is not None else [])
    trainer = L.Trainer(
        max_epochs=3,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        limit_val_batches=0,
        callbacks=callbacks,
        default_root_dir=root,
        **arguments,
    )
    with contextlib.suppress(Interrupt):
        trainer.fit(model, ckpt_path=ckpt_path)
    return model
