"""torchdata's ``StatefulDataLoader`` in a Lightning project (torchdata's docs, "stateful_dataloader": a drop-in
``DataLoader`` with ``state_dict``/``load_state_dict``, which Lightning's fit loop saves and restores through its
``_Stateful`` path).

Kept: ``StatefulDataLoader(dataset, shuffle=True, batch_size=..., num_workers=2)`` returned from the data module's
``train_dataloader``; augmentation drawn from torch's global RNG in ``__getitem__``; Adam with ``ExponentialLR``;
validation every epoch. Shrunk: 8x8 synthetic images, 32 of them, an MLP, 3 epochs. Needs ``torchdata`` (installed by
``make venv``).
"""

from __future__ import annotations

import lightning.pytorch as L
import torch
from torch.utils.data import DataLoader

from ._data import SmallClassifier, SyntheticImages, random_crop_flip

FOLLOWS = "torchdata StatefulDataLoader (Lightning's _Stateful loader path), 2 workers"


class DataModule(L.LightningDataModule):
    def setup(self, stage: str) -> None:
        self.train = SyntheticImages(32, transform=random_crop_flip)
        self.val = SyntheticImages(8)

    def train_dataloader(self):
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(self.train, batch_size=4, shuffle=True, num_workers=2)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=4)


class Model(SmallClassifier):
    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=1e-2)
        return [optimizer], [torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9)]


def main(run) -> None:
    L.seed_everything(42)
    trainer = run.trainer(max_epochs=3)
    run.fit(trainer, Model(), datamodule=DataModule())
