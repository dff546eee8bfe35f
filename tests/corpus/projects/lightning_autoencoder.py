"""Lightning's own autoencoder example (examples/pytorch/basics/autoencoder.py).

Kept: the ``LitAutoEncoder`` with an encoder/decoder, ``MNISTDataModule``-style data module that splits its training
set with ``random_split`` (a seeded generator) in ``setup``, ``shuffle=True`` training loader, a validation loader
every epoch with ``num_sanity_val_steps`` left at Lightning's default, Adam, and the ``Trainer``'s defaults
otherwise: the progress bar (it reads ``trainer.num_training_batches`` at each epoch's start), the model summary,
the default logger writing into ``lightning_logs/`` and the default ``ModelCheckpoint`` saving each epoch.
Shrunk: 8x8 synthetic "digits", 40 training samples, 3 epochs.
"""

from __future__ import annotations

import lightning.pytorch as L
import torch
from torch import nn
from torch.utils.data import DataLoader, random_split

from ._data import SyntheticImages

FOLLOWS = "Lightning examples/pytorch/basics/autoencoder.py"


class LitAutoEncoder(L.LightningModule):
    def __init__(self, hidden_dim: int = 16, learning_rate: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Linear(64, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 4))
        self.decoder = nn.Sequential(nn.Linear(4, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x))

    def _loss(self, batch):
        x, _ = batch
        x = x.view(x.size(0), -1)
        return nn.functional.mse_loss(self(x), x)

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._loss(batch))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.learning_rate)


class MyDataModule(L.LightningDataModule):
    def __init__(self, batch_size: int = 4) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        full = SyntheticImages(50)
        self.train, self.val = random_split(full, [40, 10], generator=torch.Generator().manual_seed(42))

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=self.batch_size)


def main(run) -> None:
    L.seed_everything(42)
    model = LitAutoEncoder()
    trainer = run.trainer(
        max_epochs=3, enable_progress_bar=True, enable_model_summary=True, logger=True, enable_checkpointing=True
    )
    run.fit(trainer, model, datamodule=MyDataModule())
