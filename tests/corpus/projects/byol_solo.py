"""BYOL the solo-learn way (vturrisi/solo-learn: ``BaseMomentumMethod``, ``MomentumUpdater``, its
``LinearWarmupCosineAnnealingLR`` setup in ``BaseMethod.configure_optimizers``).

Kept: two augmented views per image; an online network (backbone, projector, predictor) and a momentum target
network updated after every training batch in ``on_train_batch_end`` with a cosine ``tau`` schedule over
``self.trainer.estimated_stepping_batches``; LARS-like SGD; a warmup-cosine schedule with ``interval="step"`` whose
warmup is ``warmup_epochs * (self.trainer.estimated_stepping_batches / self.trainer.max_epochs)`` and whose length is
``estimated_stepping_batches``, both read in ``configure_optimizers``; ``on_train_start`` reads
``self.trainer.num_training_batches`` (solo-learn logs it); a ``LightningDataModule``. Shrunk: 3x8x8 synthetic images,
28 of them, tiny MLPs, 3 epochs, no workers.
"""

from __future__ import annotations

import copy
import math

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from ._data import SyntheticImages, random_crop_flip

FOLLOWS = "solo-learn BYOL (BaseMomentumMethod, MomentumUpdater, warmup-cosine from estimated_stepping_batches)"


class TwoViews:
    def __call__(self, x):
        return [random_crop_flip(x), random_crop_flip(x)]


class ImagesDataModule(L.LightningDataModule):
    def setup(self, stage: str) -> None:
        self.train = SyntheticImages(28, (3, 8, 8), transform=TwoViews())

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=4, shuffle=True, drop_last=True)


def mlp(inp: int, out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(inp, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, out))


class BYOL(L.LightningModule):
    def __init__(self, base_tau: float = 0.99, warmup_epochs: int = 1, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.backbone = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten())
        self.projector = mlp(16, 8)
        self.predictor = mlp(8, 8)
        self.momentum_backbone = copy.deepcopy(self.backbone).requires_grad_(False)
        self.momentum_projector = copy.deepcopy(self.projector).requires_grad_(False)

    def tau(self) -> float:
        """solo-learn's cosine tau at the current step (solo-learn keeps it in an attribute that no checkpoint holds,
        so that no resume, stock or ours, can continue it: recomputed from ``global_step`` here)."""
        max_steps = self.trainer.estimated_stepping_batches
        return 1 - (1 - self.hparams.base_tau) * (math.cos(math.pi * self.trainer.global_step / max_steps) + 1) / 2

    def on_train_start(self):
        self.num_batches_per_epoch = self.trainer.num_training_batches

    def training_step(self, batch, batch_idx):
        (x1, x2), _ = batch
        p1, p2 = self.predictor(self.projector(self.backbone(x1))), self.predictor(self.projector(self.backbone(x2)))
        with torch.no_grad():
            z1 = self.momentum_projector(self.momentum_backbone(x1))
            z2 = self.momentum_projector(self.momentum_backbone(x2))
        loss = (
            2
            - F.cosine_similarity(p1, z2.detach(), dim=-1).mean()
            - F.cosine_similarity(p2, z1.detach(), dim=-1).mean()
        )
        self.log("train_loss", loss)
        self.log("tau", self.tau())
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        tau = self.tau()
        for online, target in ((self.backbone, self.momentum_backbone), (self.projector, self.momentum_projector)):
            for p_online, p_target in zip(online.parameters(), target.parameters(), strict=True):
                p_target.data.mul_(tau).add_((1 - tau) * p_online.data)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(
            [*self.backbone.parameters(), *self.projector.parameters(), *self.predictor.parameters()],
            lr=self.hparams.lr,
            momentum=0.9,
            weight_decay=1e-5,
        )
        total = self.trainer.estimated_stepping_batches
        warmup = self.hparams.warmup_epochs * (total / self.trainer.max_epochs)

        def warmup_cosine(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine)
        return [optimizer], [{"scheduler": scheduler, "interval": "step", "frequency": 1}]


def main(run) -> None:
    L.seed_everything(5)
    trainer = run.trainer(max_epochs=3)
    run.fit(trainer, BYOL(), datamodule=ImagesDataModule())
