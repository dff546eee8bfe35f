"""The train loader set up by hand in ``configure_optimizers`` (the Lightning 2 replacement of 1.x's
``self.trainer.reset_train_dataloader()``, found in many public projects: call ``self.trainer.fit_loop.setup_data()``,
then size the schedule from ``len(self.trainer.train_dataloader)``).

Kept: ``configure_optimizers`` calling ``self.trainer.fit_loop.setup_data()`` and reading
``len(self.trainer.train_dataloader)`` and ``self.trainer.max_epochs`` to build ``CosineAnnealingWarmRestarts(T_0=
iterations per epoch)`` stepped every batch; AdamW; a ``shuffle=True`` loader with a random horizontal flip in
``__getitem__``; dropout; validation every epoch. Shrunk: 8x8 synthetic images, 28 of them, an MLP, 3 epochs.
"""

from __future__ import annotations

import lightning.pytorch as L
import torch
from torch.utils.data import DataLoader

from ._data import SmallClassifier, SyntheticImages

FOLLOWS = "public projects' idiom: self.trainer.fit_loop.setup_data(), len(train_dataloader) in configure_optimizers"


def flip(x: torch.Tensor) -> torch.Tensor:
    return x.flip(-1) if torch.rand(1) < 0.5 else x


class Model(SmallClassifier):
    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2, weight_decay=1e-2)
        self.trainer.fit_loop.setup_data()
        iterations_per_epoch = len(self.trainer.train_dataloader)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(optimizer, T_0=iterations_per_epoch)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def main(run) -> None:
    L.seed_everything(3)
    train = DataLoader(SyntheticImages(28, transform=flip), batch_size=4, shuffle=True)
    val = DataLoader(SyntheticImages(8), batch_size=4)
    trainer = run.trainer(max_epochs=3)
    run.fit(trainer, Model(dropout=0.2), train_dataloaders=train, val_dataloaders=val)
