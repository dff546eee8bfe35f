"""A project driven by ``LightningCLI`` and a YAML config (Lightning's CLI docs, "Configure hyperparameters from the
CLI", and the ``lightning.pytorch.demos`` classes its examples use).

Kept: ``LightningCLI(Model, DataModule, run=False, args=...)`` reading a YAML file: ``seed_everything``, the
``trainer`` section (``max_epochs``, ``val_check_interval`` inside the epoch, ``log_every_n_steps``), the ``model`` and
``data`` sections (``init_args`` of their classes), and ``optimizer``/``lr_scheduler`` sections (``torch.optim.SGD``,
``StepLR``) that the CLI turns into ``configure_optimizers``; the CLI's ``SaveConfigCallback`` writing
``config.yaml`` into the run's folder; a data module with a seeded ``random_split``. Shrunk: synthetic vectors, an MLP,
40 samples, 3 epochs.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as L
import torch
from lightning.pytorch.cli import LightningCLI
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split

FOLLOWS = "Lightning docs: LightningCLI with a YAML config (optimizer and lr_scheduler from YAML)"

CONFIG = """\
seed_everything: 1234
trainer:
  max_epochs: 3
  val_check_interval: 0.5
  log_every_n_steps: 2
model:
  class_path: corpus.projects.lightning_cli.Regressor
  init_args:
    hidden: 16
    dropout: 0.2
data:
  batch_size: 4
optimizer:
  class_path: torch.optim.SGD
  init_args:
    lr: 0.01
    momentum: 0.9
lr_scheduler:
  class_path: torch.optim.lr_scheduler.StepLR
  init_args:
    step_size: 1
    gamma: 0.7
"""


class Regressor(L.LightningModule):
    def __init__(self, hidden: int = 32, dropout: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(6, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))


class RegressionData(L.LightningDataModule):
    def __init__(self, batch_size: int = 8) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(52, 6, generator=generator)
        y = x.mean(dim=1, keepdim=True) + 0.1 * torch.randn(52, 1, generator=generator)
        self.train, self.val = random_split(TensorDataset(x, y), [40, 12], generator=generator)

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=self.batch_size)


def main(run) -> None:
    config = Path(run.root) / "config-in.yaml"
    config.write_text(CONFIG)
    defaults = run.trainer_kwargs()
    cli = LightningCLI(
        Regressor,
        RegressionData,
        subclass_mode_model=True,
        run=False,
        args=["--config", str(config)],
        trainer_defaults=defaults,
        save_config_kwargs={"overwrite": True},
    )
    run.fit(cli.trainer, cli.model, datamodule=cli.datamodule)
