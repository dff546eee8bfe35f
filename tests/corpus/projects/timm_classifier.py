"""Image classification the timm way (pytorch-image-models' train.py: ``create_loader``, ``Mixup``,
``CosineLRScheduler`` with warmup, ``ModelEmaV2``), as Lightning projects wrap it.

Kept: a loader with persistent workers, ``drop_last=True`` and a collate function that applies mixup/cutmix to the
whole batch (``lam`` from ``np.random.beta``, the cutmix box from ``np.random``, the permutation by flipping the
batch, as timm's ``Mixup`` does: drawn inside the worker processes); ``RandomErasing`` drawn with ``random`` in
``__getitem__``; soft-target cross entropy with label smoothing; AdamW; a cosine schedule with linear warmup stepped
per optimizer step (``interval="step"``, timm's ``step_update``) from a fixed number of steps; a model EMA kept by a
callback that saves its weights in the checkpoint (``state_dict``/``load_state_dict``). Shrunk: 3x8x8 synthetic
images, 40 of them, a tiny conv net, 3 epochs.
"""

from __future__ import annotations

import copy
import math
import random

import lightning.pytorch as L
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, default_collate

from ._data import SyntheticImages

FOLLOWS = "timm train.py (create_loader, Mixup, CosineLRScheduler warmup, ModelEmaV2) in a LightningModule"
NUM_CLASSES = 10


def random_erasing(x: torch.Tensor, probability: float = 0.5) -> torch.Tensor:
    if random.random() > probability:
        return x
    height, width = x.shape[-2:]
    h, w = random.randint(1, height // 2), random.randint(1, width // 2)
    top, left = random.randint(0, height - h), random.randint(0, width - w)
    x = x.clone()
    x[..., top : top + h, left : left + w] = torch.empty((x.shape[0], h, w)).normal_()
    return x


class MixupCollate:
    """Batch-mode mixup or cutmix with label smoothing (timm's ``Mixup(mode="batch")``)."""

    def __init__(
        self, mixup_alpha: float = 0.8, cutmix_alpha: float = 1.0, switch_prob: float = 0.5, smoothing: float = 0.1
    ) -> None:
        self.mixup_alpha, self.cutmix_alpha, self.switch_prob, self.smoothing = (
            mixup_alpha,
            cutmix_alpha,
            switch_prob,
            smoothing,
        )

    def __call__(self, samples):
        x, y = default_collate(samples)
        use_cutmix = np.random.rand() < self.switch_prob
        lam = float(
            np.random.beta(self.cutmix_alpha, self.cutmix_alpha)
            if use_cutmix
            else np.random.beta(self.mixup_alpha, self.mixup_alpha)
        )
        if use_cutmix:
            height, width = x.shape[-2:]
            ratio = math.sqrt(1 - lam)
            cy, cx = np.random.randint(0, height), np.random.randint(0, width)
            top, bottom = max(cy - int(height * ratio) // 2, 0), min(cy + int(height * ratio) // 2, height)
            left, right = max(cx - int(width * ratio) // 2, 0), min(cx + int(width * ratio) // 2, width)
            x[..., top:bottom, left:right] = x.flip(0)[..., top:bottom, left:right]
            lam = 1 - (bottom - top) * (right - left) / (height * width)
        else:
            x = x * lam + x.flip(0) * (1 - lam)
        off, on = self.smoothing / NUM_CLASSES, 1 - self.smoothing + self.smoothing / NUM_CLASSES
        target = torch.full((len(y), NUM_CLASSES), off).scatter_(1, y[:, None], on)
        return x, target * lam + target.flip(0) * (1 - lam)


class ModelEma(L.Callback):
    """An exponential moving average of the weights, updated after each optimizer step, saved with the checkpoint."""

    def __init__(self, decay: float = 0.9) -> None:
        self.decay = decay
        self.ema: nn.Module | None = None

    def on_fit_start(self, trainer, pl_module):
        if self.ema is None:
            self.ema = copy.deepcopy(pl_module.model).eval().requires_grad_(False)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        with torch.no_grad():
            pairs = zip(self.ema.state_dict().values(), pl_module.model.state_dict().values(), strict=True)
            for ema, current in pairs:
                ema.copy_(ema * self.decay + (1 - self.decay) * current if ema.is_floating_point() else current)

    def state_dict(self):
        return {"ema": self.ema.state_dict()} if self.ema is not None else {}

    def load_state_dict(self, state_dict):
        self._pending = state_dict.get("ema")

    def on_train_start(self, trainer, pl_module):
        pending = getattr(self, "_pending", None)
        if pending is not None:
            self.ema.load_state_dict(pending)
            self._pending = None


class TimmClassifier(L.LightningModule):
    def __init__(self, lr: float = 5e-3, warmup_steps: int = 4, total_steps: int = 30) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.GELU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Dropout(0.2),
            nn.Linear(8, NUM_CLASSES),
        )

    def training_step(self, batch, batch_idx):
        x, target = batch
        loss = torch.sum(-target * torch.log_softmax(self.model(x), dim=-1), dim=-1).mean()
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.05)
        warmup, total = self.hparams.warmup_steps, self.hparams.total_steps

        def cosine_with_warmup(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / (total - warmup))))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_with_warmup)
        return [optimizer], [{"scheduler": scheduler, "interval": "step"}]


def main(run) -> None:
    L.seed_everything(42)
    dataset = SyntheticImages(40, (3, 8, 8), transform=random_erasing)
    loader = DataLoader(
        dataset,
        batch_size=4,
        shuffle=True,
        num_workers=2,
        persistent_workers=True,
        drop_last=True,
        collate_fn=MixupCollate(),
    )
    trainer = run.trainer(ModelEma(), max_epochs=3)
    run.fit(trainer, TimmClassifier(), train_dataloaders=loader)
