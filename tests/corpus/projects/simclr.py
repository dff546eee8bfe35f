"""Self-supervised contrastive pre-training, SimCLR (the UvA deep learning course's Lightning tutorial 17
"Self-Supervised Contrastive Learning with SimCLR", also Lightning's tutorials collection).

Kept: ``ContrastiveTransformations`` returning ``n_views=2`` independently augmented views of each image (random
crop, flip and colour jitter drawn from torch's global RNG inside the worker processes), an encoder with an MLP
projection head, the InfoNCE loss over the ``2N`` views with the positive ``N`` away, AdamW with
``CosineAnnealingLR(T_max=max_epochs, eta_min=lr / 50)`` stepped per epoch, ``drop_last=True``, two workers,
validation of the same loss, ``Trainer(max_epochs=...)``. Shrunk: 3x8x8 synthetic images, 32 of them, a tiny conv
encoder, 3 epochs.
"""

from __future__ import annotations

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from ._data import SyntheticImages, random_crop_flip

FOLLOWS = "UvA DL tutorial 17 SimCLR (Lightning tutorials): two augmented views, InfoNCE, CosineAnnealingLR"


def colour_jitter(x: torch.Tensor) -> torch.Tensor:
    brightness = 1 + (torch.rand(1) - 0.5) * 0.8
    return (x * brightness).clamp(0, 1)


class ContrastiveTransformations:
    def __init__(self, n_views: int = 2) -> None:
        self.n_views = n_views

    def __call__(self, x):
        return [colour_jitter(random_crop_flip(x)) for _ in range(self.n_views)]


class SimCLR(L.LightningModule):
    def __init__(
        self,
        hidden_dim: int = 8,
        lr: float = 5e-3,
        temperature: float = 0.07,
        weight_decay: float = 1e-4,
        max_epochs: int = 3,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.convnet = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(8, 4 * hidden_dim),
            nn.ReLU(inplace=True),
            nn.Linear(4 * hidden_dim, hidden_dim),
        )

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
            optimizer, T_max=self.hparams.max_epochs, eta_min=self.hparams.lr / 50
        )
        return [optimizer], [lr_scheduler]

    def info_nce_loss(self, batch, mode: str = "train"):
        imgs, _ = batch
        feats = self.convnet(torch.cat(imgs, dim=0))
        cos_sim = F.cosine_similarity(feats[:, None, :], feats[None, :, :], dim=-1)
        self_mask = torch.eye(cos_sim.shape[0], dtype=torch.bool, device=cos_sim.device)
        cos_sim.masked_fill_(self_mask, -9e15)
        pos_mask = self_mask.roll(shifts=cos_sim.shape[0] // 2, dims=0)
        cos_sim = cos_sim / self.hparams.temperature
        nll = (-cos_sim[pos_mask] + torch.logsumexp(cos_sim, dim=-1)).mean()
        self.log(mode + "_loss", nll)
        return nll

    def training_step(self, batch, batch_idx):
        return self.info_nce_loss(batch, mode="train")

    def validation_step(self, batch, batch_idx):
        self.info_nce_loss(batch, mode="val")


def main(run) -> None:
    L.seed_everything(42)
    transform = ContrastiveTransformations(n_views=2)
    train = DataLoader(
        SyntheticImages(32, (3, 8, 8), transform=transform), batch_size=4, shuffle=True, drop_last=True, num_workers=2
    )
    val = DataLoader(SyntheticImages(8, (3, 8, 8), transform=transform), batch_size=4, drop_last=False, num_workers=0)
    trainer = run.trainer(max_epochs=3)
    run.fit(trainer, SimCLR(), train_dataloaders=train, val_dataloaders=val)
