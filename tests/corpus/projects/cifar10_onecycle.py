"""CIFAR-10 with ``OneCycleLR`` (Lightning's tutorial "PyTorch Lightning CIFAR10 ~94% Baseline Tutorial", with the
schedule's length taken from ``self.trainer.estimated_stepping_batches`` as Lightning's docs for that property show).

Kept: SGD with momentum, weight decay and Nesterov; ``OneCycleLR(max_lr=0.1, total_steps=...)`` stepped every batch
(``interval="step"``) and sized in ``configure_optimizers`` from ``self.trainer.estimated_stepping_batches``; random
crop with padding and horizontal flip drawn from torch's global RNG in the worker processes (two workers);
``shuffle=True``; a ``LightningDataModule``; validation every epoch. Shrunk: 3x8x8 synthetic images, a small conv
net with BatchNorm, 32 training images, 3 epochs.
"""

from __future__ import annotations

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from ._data import SyntheticImages, random_crop_flip

FOLLOWS = "Lightning tutorial cifar10-baseline (OneCycleLR) sized from trainer.estimated_stepping_batches, 2 workers"


class CIFAR10DataModule(L.LightningDataModule):
    def __init__(self, batch_size: int = 4, num_workers: int = 2) -> None:
        super().__init__()
        self.batch_size, self.num_workers = batch_size, num_workers

    def setup(self, stage: str) -> None:
        self.train = SyntheticImages(32, (3, 8, 8), transform=random_crop_flip)
        self.val = SyntheticImages(8, (3, 8, 8))

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=self.batch_size)


class LitResnet(L.LightningModule):
    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(8, 10),
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.nll_loss(F.log_softmax(self.model(x), dim=1), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = F.log_softmax(self.model(x), dim=1)
        self.log("val_loss", F.nll_loss(logits, y), prog_bar=True)
        self.log("val_acc", (logits.argmax(dim=1) == y).float().mean(), prog_bar=True)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(
            self.parameters(), lr=self.hparams.lr, momentum=0.9, weight_decay=5e-4, nesterov=True
        )
        scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, 0.1, total_steps=self.trainer.estimated_stepping_batches
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def main(run) -> None:
    L.seed_everything(7)
    trainer = run.trainer(max_epochs=3)
    run.fit(trainer, LitResnet(), datamodule=CIFAR10DataModule())
