"""Data pipelines that draw their augmentation in ways users write, for the Trainer-level tests (tests/harness.py).

Each dataset yields ``(index, x, y)`` like ``harness.IndexedDataset`` and adds noise to ``x`` from where its recipe
keeps its randomness. With ``Config(pipeline=name, augment=True)`` the runs compare each batch's augmented inputs.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from harness import IndexedDataset

#: A generator at module level: nothing the callback can find (each worker process draws from its own copy).
MODULE_RNG = np.random.default_rng(0)


def fresh_process() -> None:
    """Give :data:`MODULE_RNG` the state a new process starts with (``harness.run`` calls it: each run is one)."""
    MODULE_RNG.bit_generator.state = np.random.default_rng(0).bit_generator.state


class LazyPerWorker(IndexedDataset):
    """The per-worker seeding recipe: a generator created on the first sample, from the worker's torch seed."""

    def __init__(self, size: int, offset: int = 0) -> None:
        super().__init__(size, offset)
        self.rng: np.random.Generator | None = None

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        if self.rng is None:
            self.rng = np.random.default_rng(torch.initial_seed())
        ident, x, y = super().__getitem__(index)
        return ident, x + torch.from_numpy(self.rng.random(4, dtype=np.float32)), y


class ModuleLevel(IndexedDataset):
    """Draws from :data:`MODULE_RNG`: out of the callback's reach."""

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        ident, x, y = super().__getitem__(index)
        return ident, x + torch.from_numpy(MODULE_RNG.random(4, dtype=np.float32)), y


class ModuleLevelOnRank1(IndexedDataset):
    """Draws from :data:`MODULE_RNG` on rank 1 of a distributed run only: the other ranks' batches are exact."""

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        ident, x, y = super().__getitem__(index)
        if torch.distributed.is_initialized() and torch.distributed.get_rank() == 1:
            x = x + torch.from_numpy(MODULE_RNG.random(4, dtype=np.float32))
        return ident, x, y


class Jitter:
    """A transform that owns a numpy generator."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.from_numpy(self.rng.normal(size=4).astype(np.float32))


class Flip:
    """A transform that owns a torch generator."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.flip(0) if bool(torch.rand((), generator=self.generator) < 0.5) else x


class Compose:
    """A ``torchvision.transforms.Compose``-like pipeline: its steps in a list."""

    def __init__(self, transforms: list[Any]) -> None:
        self.transforms = transforms

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for transform in self.transforms:
            x = transform(x)
        return x


class Pipeline(IndexedDataset):
    """A transform pipeline whose steps each own a generator."""

    def __init__(self, size: int, offset: int = 0) -> None:
        super().__init__(size, offset)
        self.transform = Compose([Jitter(5), Flip(6), Compose([Jitter(7)])])

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        ident, x, y = super().__getitem__(index)
        return ident, self.transform(x), y


class Containers(IndexedDataset):
    """Generators kept in a list and in a dict."""

    def __init__(self, size: int, offset: int = 0) -> None:
        super().__init__(size, offset)
        self.rngs = [random.Random(1), random.Random(2)]
        self.by_name = {"noise": torch.Generator().manual_seed(3), "scale": np.random.RandomState(4)}

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        ident, x, y = super().__getitem__(index)
        noise = torch.rand(4, generator=self.by_name["noise"]) + self.rngs[index % 2].random()
        return ident, x * float(self.by_name["scale"].rand()) + noise, y


class BatchesOnly(IndexedDataset):
    """Loads whole batches only (``__getitems__``, no ``__getitem__``), drawing once per batch.

    It refuses an empty list of indices, as code that stacks its samples would: the resume must never give it one.
    """

    def __init__(self, size: int, offset: int = 0) -> None:
        super().__init__(size, offset)
        self.generator = torch.Generator().manual_seed(8)

    __getitem__ = None  # type: ignore[assignment]

    def __getitems__(self, indices: list[int]) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
        if not indices:
            raise ValueError("BatchesOnly was given an empty list of indices")
        shift = torch.rand(1, generator=self.generator) + torch.rand(1)
        return [(ident, x + shift, y) for ident, x, y in map(self._sample, indices)]

    def _sample(self, index: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return IndexedDataset.__getitem__(self, index)


PIPELINES: dict[str, type[IndexedDataset]] = {
    "lazy": LazyPerWorker,
    "module": ModuleLevel,
    "module_on_rank_1": ModuleLevelOnRank1,
    "compose": Pipeline,
    "containers": Containers,
    "batches_only": BatchesOnly,
}
