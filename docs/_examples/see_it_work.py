"""See it work: train, crash, resume (the example of the docs' quickstart)."""

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_midepoch import MidEpochResume


class Numbered(Dataset):
    """Sample i is (i, x_i, y_i): every batch names the samples it holds."""

    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        g = torch.Generator().manual_seed(index)
        return index, torch.randn(4, generator=g), torch.randn(1, generator=g)


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.2), nn.Linear(16, 1))
        self.seen = []  # (epoch, batch_idx, sample ids) of every training step

    def training_step(self, batch, batch_idx):
        ids, x, y = batch
        self.seen.append((self.current_epoch, batch_idx, ids.tolist()))
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Crash(Exception):
    pass


class CrashAtStep(L.Callback):
    """Stands in for a pre-emption: the run dies when it reaches `step`."""

    def __init__(self, step):
        self.step = step

    def on_train_batch_start(self, trainer, *args):
        if trainer.global_step == self.step:
            raise Crash


def make_loader(batch_size=4):
    return DataLoader(Numbered(32), batch_size=batch_size, shuffle=True)


def train(run_dir, loader=make_loader, resumable=True, crash_at=None, ckpt_path=None):
    """Train 2 epochs, writing `run_dir/last.ckpt` every 5 steps."""
    model = Model()
    checkpoints = ModelCheckpoint(
        dirpath=run_dir, every_n_train_steps=5, save_last=True, save_top_k=0
    )
    callbacks = [checkpoints]
    if resumable:
        callbacks.append(MidEpochResume())
    if crash_at is not None:
        callbacks.append(CrashAtStep(crash_at))
    trainer = L.Trainer(
        max_epochs=2,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    try:
        trainer.fit(model, train_dataloaders=loader(), ckpt_path=ckpt_path)
    except Crash:
        print(f"{run_dir}: crashed at step {trainer.global_step}")
    return model


def same_weights(a, b):
    return all(
        torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True)
    )


def same_run(reference, resumed, first_step):
    """Did `resumed` train the batches of `reference` from `first_step` on, and end
    with its weights?"""
    batches = resumed.seen == reference.seen[first_step:]
    return batches and same_weights(reference, resumed)
