"""Transfer learning with a frozen backbone unfrozen at milestones (Lightning's
examples/pytorch/domain_templates/computer_vision_fine_tuning.py: ``MilestonesFinetuning(BaseFinetuning)``).

Kept: a pretrained-style backbone frozen in ``freeze_before_training`` and unfrozen in two stages by a
``BaseFinetuning`` callback (``unfreeze_and_add_param_group`` adds parameter groups to the optimizer at epochs 1 and
2; the callback's own state, the groups it added, goes in the checkpoint), ``MultiStepLR``, Adam with only the
trainable parameters, random crop/flip augmentation, two workers with ``persistent_workers=False`` (fresh workers
every epoch), a validation loader. Shrunk: 3x8x8 synthetic images, a two-block conv "backbone", 32 images, 3 epochs.
"""

from __future__ import annotations

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks.finetuning import BaseFinetuning
from torch import nn
from torch.utils.data import DataLoader

from ._data import SyntheticImages, random_crop_flip

FOLLOWS = "Lightning examples/pytorch/domain_templates/computer_vision_fine_tuning.py (MilestonesFinetuning)"


class MilestonesFinetuning(BaseFinetuning):
    def __init__(self, milestones: tuple = (1, 2), train_bn: bool = False) -> None:
        super().__init__()
        self.milestones = milestones
        self.train_bn = train_bn

    def freeze_before_training(self, pl_module):
        self.freeze(modules=pl_module.feature_extractor, train_bn=self.train_bn)

    def finetune_function(self, pl_module, epoch, optimizer):
        if epoch == self.milestones[0]:
            self.unfreeze_and_add_param_group(
                modules=pl_module.feature_extractor[-3:], optimizer=optimizer, train_bn=self.train_bn
            )
        elif epoch == self.milestones[1]:
            self.unfreeze_and_add_param_group(
                modules=pl_module.feature_extractor[:-3], optimizer=optimizer, train_bn=self.train_bn
            )


class TransferLearningModel(L.LightningModule):
    def __init__(self, lr: float = 1e-2, milestones: tuple = (1, 2)) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.feature_extractor = nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.Conv2d(4, 4, 3, padding=1),
            nn.BatchNorm2d(4),
            nn.ReLU(),
        )
        self.fc = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 10))

    def forward(self, x):
        return self.fc(self.feature_extractor(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self(x).argmax(-1) == y).float().mean())

    def configure_optimizers(self):
        parameters = [p for p in self.parameters() if p.requires_grad]
        optimizer = torch.optim.Adam(parameters, lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[2], gamma=0.1)
        return [optimizer], [scheduler]


def main(run) -> None:
    L.seed_everything(42)
    train = DataLoader(
        SyntheticImages(32, (3, 8, 8), transform=random_crop_flip), batch_size=4, shuffle=True, num_workers=2
    )
    val = DataLoader(SyntheticImages(8, (3, 8, 8)), batch_size=4)
    trainer = run.trainer(MilestonesFinetuning(), max_epochs=3)
    run.fit(trainer, TransferLearningModel(), train_dataloaders=train, val_dataloaders=val)
