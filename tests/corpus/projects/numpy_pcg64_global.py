"""A project whose global numpy generator is not MT19937: NumPy's documented ``np.random.set_bit_generator`` with
``PCG64`` under an albumentations-style augmentation pipeline that draws from ``np.random`` in ``__getitem__``.

Kept: the script sets the legacy global generator to ``PCG64(seed)`` before training (NumPy's "Legacy random
generation" docs), the dataset's transforms draw brightness/contrast jitter and a flip from ``np.random`` per sample
(as albumentations' ``RandomBrightnessContrast``/``HorizontalFlip`` do), a ``shuffle=True`` loader, Adam with
``StepLR`` per epoch. Shrunk: 8x8 synthetic images, 30 samples, 3 epochs.
"""

from __future__ import annotations

import lightning.pytorch as L
import numpy as np
import torch
from torch.utils.data import DataLoader

from ._data import SmallClassifier, SyntheticImages

FOLLOWS = "numpy set_bit_generator(PCG64) + albumentations-style np.random transforms"


def jitter_and_flip(x: torch.Tensor) -> torch.Tensor:
    brightness, contrast = np.random.uniform(-0.2, 0.2), np.random.uniform(0.8, 1.2)
    x = (x - x.mean()) * contrast + x.mean() + brightness
    if np.random.random() < 0.5:
        x = x.flip(-1)
    return x.float()


class Model(SmallClassifier):
    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=1e-2)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]


def main(run) -> None:
    L.seed_everything(42)
    np.random.set_bit_generator(np.random.PCG64(42))
    loader = DataLoader(SyntheticImages(30, transform=jitter_and_flip), batch_size=4, shuffle=True)
    trainer = run.trainer(max_epochs=3)
    run.fit(trainer, Model(), train_dataloaders=loader)
