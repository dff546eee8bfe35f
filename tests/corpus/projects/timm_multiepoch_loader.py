"""timm's ``MultiEpochsDataLoader`` (pytorch-image-models timm/data/loader.py, copied into many projects to keep
workers alive across epochs): the loader makes its worker iterator once, in its own ``__init__``, over a batch
sampler that repeats for ever (``_RepeatSampler``), and each ``iter()`` takes ``len(self)`` batches from it.

Kept: ``MultiEpochsDataLoader(dataset, batch_size=..., shuffle=True, num_workers=2, drop_last=True)`` with
``_RepeatSampler`` wrapping the batch sampler and the iterator made in ``__init__``; augmentation drawn from torch's
global RNG in the workers; SGD with a cosine schedule per epoch. Shrunk: 3x8x8 synthetic images, 24 of them, a tiny
conv net, 2 epochs.
"""

from __future__ import annotations

import lightning.pytorch as L
import torch
from torch import nn
from torch.utils.data import DataLoader

from ._data import SyntheticImages, random_crop_flip

FOLLOWS = "timm data/loader.py MultiEpochsDataLoader + _RepeatSampler (iterator made in __init__), 2 workers"


class _RepeatSampler:
    def __init__(self, sampler) -> None:
        self.sampler = sampler

    def __iter__(self):
        while True:
            yield from iter(self.sampler)


class MultiEpochsDataLoader(DataLoader):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._DataLoader__initialized = False
        self.batch_sampler = _RepeatSampler(self.batch_sampler)
        self._DataLoader__initialized = True
        self.iterator = super().__iter__()

    def __len__(self) -> int:
        return len(self.batch_sampler.sampler)

    def __iter__(self):
        for _ in range(len(self)):
            yield next(self.iterator)


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 10)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=2)]


def main(run) -> None:
    L.seed_everything(42)
    loader = MultiEpochsDataLoader(
        SyntheticImages(24, (3, 8, 8), transform=random_crop_flip),
        batch_size=4,
        shuffle=True,
        num_workers=2,
        drop_last=True,
    )
    trainer = run.trainer(max_epochs=2)
    run.fit(trainer, Model(), train_dataloaders=loader)
