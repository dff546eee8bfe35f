"""Looking at a user's objects without changing how CPython keeps their attributes (and how fast it reads them)."""

from __future__ import annotations

import gc
import sys
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler, Sampler

from harness import L
from lightning_midepoch import MidEpochResume
from lightning_midepoch._attrs import attribute_values, holds

#: From CPython 3.11 an object keeps its attributes inline until something reads its ``__dict__``.
INLINE = sys.version_info >= (3, 11)


def _moved_to_a_dict(obj: Any) -> bool:
    """Whether ``obj``'s attributes were moved into a dict (the collector then sees that dict, not the values)."""
    return any(isinstance(ref, dict) and ref.keys() >= {"size"} for ref in gc.get_referents(obj))


class Plain:
    def __init__(self) -> None:
        self.size = 3
        self.items = [1, 2]
        self.sampler = RandomSampler(range(3))


class Slotted:
    __slots__ = ("sampler", "size")

    def __init__(self) -> None:
        self.size, self.sampler = 3, RandomSampler(range(3))


class ListWithAttributes(list):
    pass


@pytest.mark.skipif(not INLINE, reason="attributes are kept inline from CPython 3.11")
def test_holds_reads_a_plain_object_without_moving_its_attributes():
    obj = Plain()
    assert (holds(obj, Sampler), holds(obj, list), holds(obj, str)) == (True, True, False)
    assert {id(value) for value in attribute_values(obj)} == {id(obj.size), id(obj.items), id(obj.sampler)}
    assert not _moved_to_a_dict(obj)


def test_holds_reads_objects_of_every_layout():
    moved = Plain()
    vars(moved)  # its attributes are in a dict already
    one_dict = Plain()
    del one_dict.size, one_dict.items, one_dict.sampler
    one_dict.table = {"a": 1}  # the one attribute is a dict: what the collector sees is ambiguous
    listed = ListWithAttributes([RandomSampler(range(2))])  # a C base: its items are not attributes
    listed.size = 1
    empty = Plain.__new__(Plain)
    cases = [(moved, True), (one_dict, False), (Slotted(), False), (listed, False), (empty, False), (3, False)]
    assert [holds(obj, Sampler) for obj, _ in cases] == [expected for _, expected in cases]
    assert holds(one_dict, dict)
    assert attribute_values(one_dict) == [{"a": 1}]


class _LayoutDataset(Dataset):
    """Reads its attributes at every sample, draws from a generator of its own (found by the callback, which saves
    its state); each sample says whether its attributes were still inline in that process."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.transform = nn.Identity()
        self.generator = torch.Generator().manual_seed(5)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        noise = torch.rand(1, generator=self.generator)
        return self.transform(torch.cat([index + noise, torch.tensor([float(_moved_to_a_dict(self))])]))


class _LayoutModel(L.LightningModule):
    def __init__(self, num_workers: int) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 1)
        self.num_workers = num_workers
        self.moved_in_workers: list[bool] = []
        self.dataset: _LayoutDataset | None = None

    def train_dataloader(self) -> DataLoader:
        self.dataset = _LayoutDataset(12)
        return DataLoader(self.dataset, batch_size=3, shuffle=True, num_workers=self.num_workers)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.moved_in_workers += [bool(flag) for flag in batch[:, 1]]
        return self.layer(batch[:, :1].repeat(1, 2)).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _SamplerLayout(L.Callback):
    def __init__(self) -> None:
        self.moved: list[bool] = []

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        sampler = trainer.train_dataloader.sampler
        self.moved.append(any(isinstance(ref, dict) for ref in gc.get_referents(getattr(sampler, "inner", sampler))))


@pytest.mark.skipif(not INLINE, reason="attributes are kept inline from CPython 3.11")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_fit_leaves_the_dataset_and_sampler_attributes_inline_as_stock_does(num_workers, tmp_path):
    """The searches for generators look at the dataset, its transform and the sampler but never read their
    ``__dict__`` (the dataset reads its attributes at every sample; in the main process, and in each worker)."""
    seen = {}
    for callback in (False, True):
        L.seed_everything(0, verbose=False)
        model, layout = _LayoutModel(num_workers), _SamplerLayout()
        trainer = L.Trainer(
            default_root_dir=tmp_path / str(callback),
            max_epochs=2,
            callbacks=[layout, *([MidEpochResume()] if callback else [])],
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(model)
        assert model.dataset is not None
        seen[callback] = (model.moved_in_workers, layout.moved, _moved_to_a_dict(model.dataset))
    assert seen[True] == seen[False] == ([False] * 24, [False] * 8, False)
