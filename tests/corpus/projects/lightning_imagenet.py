"""Lightning's ImageNet example (examples/pytorch/domain_templates/imagenet.py).

Kept: the datasets built in the module's ``setup(stage)``, a training transform of random crop and horizontal flip
drawn from torch's global RNG inside ``__getitem__`` (torchvision's ``RandomResizedCrop``/``RandomHorizontalFlip``),
``DataLoader(shuffle=True, num_workers=...)`` (two worker processes here), a validation loader, SGD with momentum and
weight decay, ``LambdaLR(lambda epoch: 0.1 ** (epoch // 30))`` stepped each epoch, top-1 accuracy logged with
``sync_dist``. Shrunk: 3x8x8 synthetic images, 10 classes, a small conv net, 32 training images, 3 epochs.
"""

from __future__ import annotations

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from ._data import SyntheticImages, random_crop_flip

FOLLOWS = "Lightning examples/pytorch/domain_templates/imagenet.py"


class ImageNetLightningModel(L.LightningModule):
    def __init__(
        self, lr: float = 0.1, momentum: float = 0.9, weight_decay: float = 1e-4, batch_size: int = 4, workers: int = 2
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
            nn.Linear(16, 10),
        )

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        images, target = batch
        output = self(images)
        loss = F.cross_entropy(output, target)
        self.log("train_loss", loss)
        self.log("train_acc1", (output.argmax(-1) == target).float().mean(), prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        images, target = batch
        output = self(images)
        self.log("val_loss", F.cross_entropy(output, target), sync_dist=True)
        self.log("val_acc1", (output.argmax(-1) == target).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(
            self.parameters(),
            lr=self.hparams.lr,
            momentum=self.hparams.momentum,
            weight_decay=self.hparams.weight_decay,
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 0.1 ** (epoch // 30))
        return [optimizer], [scheduler]

    def setup(self, stage: str):
        if stage == "fit":
            self.train_dataset = SyntheticImages(32, (3, 8, 8), transform=random_crop_flip)
            self.val_dataset = SyntheticImages(8, (3, 8, 8))

    def train_dataloader(self):
        return DataLoader(
            self.train_dataset, batch_size=self.hparams.batch_size, shuffle=True, num_workers=self.hparams.workers
        )

    def val_dataloader(self):
        return DataLoader(self.val_dataset, batch_size=self.hparams.batch_size, num_workers=0)


def main(run) -> None:
    L.seed_everything(42)
    model = ImageNetLightningModel()
    trainer = run.trainer(max_epochs=3)
    run.fit(trainer, model)
