"""Streaming shards through an ``IterableDataset`` the WebDataset way (webdataset's ``WebDataset(urls,
shardshuffle=...)`` + ``.shuffle(buffer)`` + ``split_by_worker``, as Lightning projects that train on tar shards use
it).

Kept: a list of shards reshuffled every epoch with a ``random.Random`` seeded from the seed and the epoch (the
dataset's ``set_epoch``, called from the LightningModule's ``on_train_epoch_start``), each DataLoader worker taking
every ``num_workers``-th shard, a shuffle buffer drawing from a ``random.Random`` seeded per worker from
``torch.utils.data.get_worker_info().seed`` (so it follows the loader's base seed), batching in the DataLoader, two
workers, ``Trainer(max_epochs=...)`` with no length (the epoch ends when the shards do). Shrunk: 4 shards of 6
synthetic samples, a linear model, 2 epochs.
"""

from __future__ import annotations

import random

import lightning.pytorch as L
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ._data import image, label

FOLLOWS = "webdataset: WebDataset(shards, shardshuffle) + shuffle buffer + split_by_worker, 2 workers"


class ShardStream(IterableDataset):
    def __init__(self, shards: int = 4, per_shard: int = 6, buffer: int = 5, seed: int = 0) -> None:
        self.shards, self.per_shard, self.buffer, self.seed = shards, per_shard, buffer, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = list(range(self.shards))
        random.Random(self.seed + self.epoch).shuffle(order)
        info = get_worker_info()
        if info is not None:
            order = order[info.id :: info.num_workers]
        rng = random.Random(info.seed if info is not None else torch.initial_seed())
        buffer = []
        for shard in order:
            for index in range(shard * self.per_shard, (shard + 1) * self.per_shard):
                buffer.append((image(index), label(index, 10)))
                if len(buffer) >= self.buffer:
                    yield buffer.pop(rng.randrange(len(buffer)))
        rng.shuffle(buffer)
        yield from buffer


class Model(L.LightningModule):
    def __init__(self, dataset: ShardStream) -> None:
        super().__init__()
        self.dataset = dataset
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))

    def on_train_epoch_start(self) -> None:
        self.dataset.set_epoch(self.current_epoch)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(run) -> None:
    L.seed_everything(42)
    dataset = ShardStream()
    loader = DataLoader(dataset, batch_size=4, num_workers=2)
    trainer = run.trainer(max_epochs=2)
    run.fit(trainer, Model(dataset), train_dataloaders=loader)
