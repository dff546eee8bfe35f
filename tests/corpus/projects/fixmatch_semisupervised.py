"""Semi-supervised FixMatch with two train loaders (the FixMatch recipe of TorchSSL / USB and of Lightning ports of
it: a labeled and an unlabeled loader trained together, weak and strong augmentations, confidence-thresholded
pseudo-labels).

Kept: ``train_dataloader`` returning a dict ``{"labeled": ..., "unlabeled": ...}`` (Lightning wraps it in a
``CombinedLoader`` in ``max_size_cycle`` mode, so the shorter labeled loader restarts inside the epoch), both
``shuffle=True`` with ``drop_last=True``; the unlabeled loader's batch is ``mu`` times larger; a weak augmentation
(flip and crop from torch's global RNG) and a strong one (RandAugment-style: ops and magnitudes chosen with Python's
``random``), both in ``__getitem__``; pseudo-labels above a confidence threshold; SGD with Nesterov and FixMatch's
cosine decay ``cos(7 pi k / 16 K)`` per step, ``K`` the recipe's ``num_train_iter`` argument. Shrunk:
8x8 synthetic images, 12 labeled and 36 unlabeled, 3 epochs.
"""

from __future__ import annotations

import math
import random

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ._data import image, label, random_crop_flip

FOLLOWS = "FixMatch (TorchSSL/USB recipe): labeled + unlabeled loaders in a CombinedLoader, weak/strong augmentation"


def strong(x: torch.Tensor) -> torch.Tensor:
    """RandAugment-like: two random ops with random magnitudes, chosen with Python's ``random``."""
    for _ in range(2):
        op, magnitude = random.choice(("brightness", "contrast", "invert", "shift")), random.uniform(0.1, 0.9)
        if op == "brightness":
            x = x * (1 + magnitude - 0.5)
        elif op == "contrast":
            x = (x - x.mean()) * (1 + magnitude - 0.5) + x.mean()
        elif op == "invert":
            x = 1 - x
        else:
            x = torch.roll(x, shifts=random.randint(-2, 2), dims=-1)
    return x


class Labeled(Dataset):
    def __init__(self, indices: list[int]) -> None:
        self.indices = indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        index = self.indices[i]
        return random_crop_flip(image(index)), label(index, 10)


class Unlabeled(Labeled):
    def __getitem__(self, i: int):
        x = image(self.indices[i])
        return random_crop_flip(x), strong(random_crop_flip(x))


class FixMatch(L.LightningModule):
    def __init__(self, threshold: float = 0.5, lambda_u: float = 1.0, total_steps: int = 30) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

    def train_dataloader(self):
        labeled = DataLoader(Labeled(list(range(12))), batch_size=2, shuffle=True, drop_last=True)
        unlabeled = DataLoader(Unlabeled(list(range(12, 48))), batch_size=6, shuffle=True, drop_last=True)
        return {"labeled": labeled, "unlabeled": unlabeled}

    def training_step(self, batch, batch_idx):
        x, y = batch["labeled"]
        weak, strong_view = batch["unlabeled"]
        logits = self.net(torch.cat([x, weak, strong_view]))
        logits_x, logits_weak, logits_strong = logits.split([len(x), len(weak), len(strong_view)])
        probs = torch.softmax(logits_weak.detach(), dim=-1)
        confidence, pseudo = probs.max(dim=-1)
        mask = (confidence >= self.hparams.threshold).float()
        loss_u = (F.cross_entropy(logits_strong, pseudo, reduction="none") * mask).mean()
        loss = F.cross_entropy(logits_x, y) + self.hparams.lambda_u * loss_u
        self.log_dict({"loss": loss, "mask": mask.mean()})
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.03, momentum=0.9, nesterov=True, weight_decay=5e-4)
        total = self.hparams.total_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: math.cos(7 * math.pi * k / (16 * total)))
        return [optimizer], [{"scheduler": scheduler, "interval": "step"}]


def main(run) -> None:
    L.seed_everything(0)
    trainer = run.trainer(max_epochs=3)
    run.fit(trainer, FixMatch())
