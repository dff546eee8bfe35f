"""Imbalanced classification with a ``WeightedRandomSampler``, ``ReduceLROnPlateau``, ``EarlyStopping`` and
``ModelCheckpoint`` (the recipe of PyTorch forum answers and Kaggle kernels for class imbalance, and of
torchsampler's ImbalancedDatasetSampler, in a Lightning project).

Kept: per-sample weights ``1 / class_count[label]`` given to ``WeightedRandomSampler(weights, num_samples,
replacement=True)`` without a generator (it draws from torch's global RNG); ``ReduceLROnPlateau`` on ``val_loss``
(``monitor`` in the scheduler config); ``EarlyStopping(monitor="val_loss", patience=...)``;
``ModelCheckpoint(monitor="val_loss", save_top_k=2, save_last=True, every_n_train_steps=...)`` writing files;
validation twice an epoch; class-weighted cross entropy. Shrunk: 36 synthetic samples with a 4:1 class imbalance, a
small MLP, 3 epochs.
"""

from __future__ import annotations

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

FOLLOWS = "WeightedRandomSampler for class imbalance + ReduceLROnPlateau + EarlyStopping + ModelCheckpoint"


def imbalanced(size: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    y = (torch.arange(size) % 5 == 0).long()
    x = torch.randn(size, 6, generator=generator) + y[:, None].float()
    return TensorDataset(x, y)


class Classifier(L.LightningModule):
    def __init__(self, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 2))
        self.loss = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0]))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self.loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", self.loss(self.net(x), y))

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.5, patience=0)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "val_loss"}}


def main(run) -> None:
    L.seed_everything(42)
    train = imbalanced(36, 0)
    labels = train.tensors[1]
    class_count = torch.bincount(labels)
    weights = (1.0 / class_count[labels]).double()
    sampler = WeightedRandomSampler(weights, num_samples=len(weights), replacement=True)
    checkpoint = ModelCheckpoint(
        dirpath=run.root / "ckpts", monitor="val_loss", save_top_k=2, save_last=True, every_n_train_steps=4
    )
    trainer = run.trainer(
        EarlyStopping(monitor="val_loss", patience=3),
        checkpoint,
        max_epochs=3,
        val_check_interval=0.5,
        enable_checkpointing=True,
    )
    run.fit(
        trainer,
        Classifier(),
        train_dataloaders=DataLoader(train, batch_size=4, sampler=sampler),
        val_dataloaders=DataLoader(imbalanced(12, 1), batch_size=6),
    )
