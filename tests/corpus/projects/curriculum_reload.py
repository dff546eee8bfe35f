"""Curriculum learning with loaders rebuilt every epoch (Lightning's documented ``reload_dataloaders_every_n_epochs``
use: a ``train_dataloader`` that reads ``self.trainer.current_epoch`` to grow the task), with bf16 mixed precision on
the CPU (``precision="bf16-mixed"``).

Kept: ``Trainer(reload_dataloaders_every_n_epochs=1)``; the data module's ``train_dataloader`` choosing the sequence
length from ``self.trainer.current_epoch`` (short sequences first), ``shuffle=True``; a GRU language model under
``bf16-mixed`` autocast; Adam with a ``LinearLR`` warmup stepped per epoch; gradient clipping by
norm. Shrunk: a 20-token vocabulary, 24 sequences, lengths 4/6/8, 3 epochs.
"""

from __future__ import annotations

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ._data import tokens

FOLLOWS = "Lightning docs: reload_dataloaders_every_n_epochs with a curriculum on current_epoch; bf16-mixed on CPU"
VOCAB = 20


class CurriculumData(L.LightningDataModule):
    def train_dataloader(self):
        length = 4 + 2 * min(self.trainer.current_epoch, 2)
        data = tokens(24 * (length + 1), VOCAB, seed=length).view(24, length + 1)
        return DataLoader(TensorDataset(data[:, :-1], data[:, 1:]), batch_size=4, shuffle=True)


class GRULanguageModel(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.rnn = nn.GRU(16, 16, batch_first=True)
        self.dropout = nn.Dropout(0.1)
        self.head = nn.Linear(16, VOCAB)

    def training_step(self, batch, batch_idx):
        x, y = batch
        hidden, _ = self.rnn(self.embed(x))
        loss = F.cross_entropy(self.head(self.dropout(hidden)).float().reshape(-1, VOCAB), y.reshape(-1))
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=5e-3)
        return [optimizer], [torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.5, total_iters=2)]


def main(run) -> None:
    L.seed_everything(11)
    trainer = run.trainer(
        max_epochs=3,
        reload_dataloaders_every_n_epochs=1,
        precision="bf16-mixed",
        gradient_clip_val=0.5,
        gradient_clip_algorithm="norm",
    )
    run.fit(trainer, GRULanguageModel(), datamodule=CurriculumData())
