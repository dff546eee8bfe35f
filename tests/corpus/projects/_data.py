"""Small synthetic stand-ins for the datasets the projects train on (MNIST, CIFAR, ImageNet, GLUE, text), and the
small classifier of the projects whose point is their data pipeline, not their model.

Each sample is fixed by its index (a generator seeded with it), so a batch's bytes name the samples in it; the
projects' own random augmentation comes on top, drawn as the originals draw it.
"""

from __future__ import annotations

import lightning.pytorch as L
import torch
from torch import nn
from torch.utils.data import Dataset


def image(index: int, shape: tuple[int, ...] = (1, 8, 8)) -> torch.Tensor:
    """Image ``index`` of a synthetic dataset, values in [0, 1)."""
    return torch.rand(shape, generator=torch.Generator().manual_seed(index))


def label(index: int, classes: int) -> int:
    return (index * 7 + 3) % classes


class SyntheticImages(Dataset):
    """``(image, label)`` pairs, as torchvision's MNIST / CIFAR10 datasets give them, with an optional transform."""

    def __init__(self, size: int, shape: tuple[int, ...] = (1, 8, 8), classes: int = 10, transform=None) -> None:
        self.size, self.shape, self.classes, self.transform = size, shape, classes, transform

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        x = image(index, self.shape)
        if self.transform is not None:
            x = self.transform(x)
        return x, label(index, self.classes)


def random_crop_flip(x: torch.Tensor, padding: int = 1) -> torch.Tensor:
    """torchvision's ``RandomCrop(padding=...)`` then ``RandomHorizontalFlip()``: both draw from torch's global RNG."""
    height, width = x.shape[-2:]
    padded = torch.nn.functional.pad(x, (padding,) * 4)
    top, left = (int(v) for v in torch.randint(0, 2 * padding + 1, (2,)))
    x = padded[..., top : top + height, left : left + width]
    if torch.rand(1) < 0.5:
        x = x.flip(-1)
    return x


def tokens(count: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """A fixed "corpus" of ``count`` token ids."""
    return torch.randint(0, vocab, (count,), generator=torch.Generator().manual_seed(seed))


class SmallClassifier(L.LightningModule):
    """An MLP over 8x8 images with cross entropy; each project gives it its own ``configure_optimizers``."""

    def __init__(self, hidden: int = 16, dropout: float = 0.0) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 10)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))
