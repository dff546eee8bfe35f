"""An infinite training sampler under ``max_steps`` (detectron2's ``TrainingSampler``, which YOLOX, fast-reid and
many detection code bases copy).

Kept: a sampler without ``__len__`` that yields ``randperm`` orders of the dataset for ever from its own
``torch.Generator`` seeded once, a ``DataLoader`` given it as ``sampler`` with a batch size, ``Trainer(max_steps=...)``
with ``max_epochs=-1`` (Lightning's one long epoch), SGD with momentum and a ``MultiStepLR`` stepped every step (the
detectron2 "steps" schedule), validation every ``val_check_interval`` steps. Shrunk: 20 synthetic images, a linear
classifier, 24 steps.
"""

from __future__ import annotations

import itertools

import lightning.pytorch as L
import torch
from torch.utils.data import DataLoader, Sampler

from ._data import SmallClassifier, SyntheticImages

FOLLOWS = "detectron2 data/samplers/distributed_sampler.py TrainingSampler under max_steps"


class TrainingSampler(Sampler[int]):
    """Yields ``shuffle(range(size)) + shuffle(range(size)) + ...`` for ever (no ``__len__``)."""

    def __init__(self, size: int, shuffle: bool = True, seed: int = 0) -> None:
        self._size, self._shuffle, self._seed = size, shuffle, seed

    def __iter__(self):
        yield from itertools.islice(self._infinite_indices(), 0, None)

    def _infinite_indices(self):
        generator = torch.Generator()
        generator.manual_seed(self._seed)
        while True:
            if self._shuffle:
                yield from torch.randperm(self._size, generator=generator).tolist()
            else:
                yield from range(self._size)


class Classifier(SmallClassifier):
    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[12, 20], gamma=0.1)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def main(run) -> None:
    L.seed_everything(42)
    train = DataLoader(SyntheticImages(20), sampler=TrainingSampler(20, seed=7), batch_size=4)
    val = DataLoader(SyntheticImages(8), batch_size=4)
    trainer = run.trainer(max_steps=24, max_epochs=-1, val_check_interval=8)
    run.fit(trainer, Classifier(), train_dataloaders=train, val_dataloaders=val)
