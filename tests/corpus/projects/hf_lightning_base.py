"""The older Hugging Face Lightning recipe (transformers' examples ``lightning_base.py``, ``BaseTransformer``, and the
``OptimizerMixin`` pattern of projects built on it): the schedule's length computed in the LightningModule's
``setup("fit")`` from the length of the data module's train dataloader, and the loader read back from the trainer.

Kept: ``setup(stage)`` calling ``self.trainer.datamodule.train_dataloader()`` (an extra loader the trainer never
iterates) to compute ``total_steps = len(loader) // accumulate_grad_batches * max_epochs``;
``get_linear_schedule_with_warmup`` (a ``LambdaLR``) stepped every step; ``on_train_start`` reading
``self.trainer.num_training_batches`` and ``self.trainer.train_dataloader`` (the progress-bar/ETA code of such
projects); AdamW; dropout; a ``RandomSampler`` with its own generator in the data module (the recipe's
``--seed`` handling); ``accumulate_grad_batches=2``. Shrunk: a bag-of-embeddings classifier on 40 synthetic token
sequences, 2 epochs.
"""

from __future__ import annotations

import lightning.pytorch as L
import torch
from torch import nn
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from ._data import tokens

FOLLOWS = "transformers examples lightning_base.py (BaseTransformer: total steps from the train dataloader in setup)"
ALIGN = 2  # checkpoints after whole optimizer steps (accumulate_grad_batches=2)


class TextDataModule(L.LightningDataModule):
    def __init__(self, batch_size: int = 4, seed: int = 3) -> None:
        super().__init__()
        self.batch_size, self.seed = batch_size, seed

    def setup(self, stage: str) -> None:
        ids = tokens(40 * 6, 30, seed=1).view(40, 6)
        self.train = TensorDataset(ids, (ids.sum(dim=1) % 2).long())

    def train_dataloader(self):
        sampler = RandomSampler(self.train, generator=torch.Generator().manual_seed(self.seed))
        return DataLoader(self.train, batch_size=self.batch_size, sampler=sampler)


class BaseTransformer(L.LightningModule):
    def __init__(self, learning_rate: float = 5e-3, warmup_steps: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.EmbeddingBag(30, 16)
        self.dropout = nn.Dropout(0.1)
        self.head = nn.Linear(16, 2)

    def setup(self, stage: str) -> None:
        if stage == "fit":
            train_loader = self.trainer.datamodule.train_dataloader()
            self.total_steps = (len(train_loader) // self.trainer.accumulate_grad_batches) * self.trainer.max_epochs

    def on_train_start(self) -> None:
        self.batches_per_epoch = self.trainer.num_training_batches
        self.train_batch_size = self.trainer.train_dataloader.batch_size

    def training_step(self, batch, batch_idx):
        ids, labels = batch
        loss = nn.functional.cross_entropy(self.head(self.dropout(self.embed(ids))), labels)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.learning_rate, eps=1e-8)
        warmup, total = self.hparams.warmup_steps, self.total_steps

        def lr_lambda(step: int) -> float:
            return step / warmup if step < warmup else max(0.0, (total - step) / max(1, total - warmup))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
        return [optimizer], [{"scheduler": scheduler, "interval": "step", "frequency": 1}]


def main(run) -> None:
    L.seed_everything(42)
    trainer = run.trainer(max_epochs=2, accumulate_grad_batches=2)
    run.fit(trainer, BaseTransformer(), datamodule=TextDataModule())
