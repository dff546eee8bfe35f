"""The data libraries long trainings read through, as the train loader with the callback attached.

torchdata's ``StatefulDataLoader``, litdata's ``StreamingDataset`` + ``StreamingDataLoader``, Hugging Face
``datasets`` (map-style with workers, iterable over several epochs) and torch's dataset wrappers (``Subset``,
``ConcatDataset``, a dataset fetched only through ``__getitems__``): each resumed run is compared with the
uninterrupted one (:func:`harness.assert_exact`). The data is small and written under the test's ``tmp_path``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset

from conftest import require
from harness import Config, CrashPoint, IndexedDataset, Model, assert_exact, checkpoint_path, interrupt_and_resume, run
from lightning_midepoch import _datalibs

MID = CrashPoint("train_batch_end", epoch=1, batch=3)
LAST = CrashPoint("train_batch_end", epoch=1, batch=9)  # the last of the 10 batches of an epoch of 20 samples
EPOCH_END = CrashPoint("train_epoch_end", epoch=1)
INSIDE = CrashPoint("before_optimizer_step", epoch=0, batch=4)
EPOCH_START = CrashPoint("train_epoch_start", epoch=1)
CRASHES = [MID, LAST, EPOCH_END, INSIDE, EPOCH_START]
CRASH_IDS = ["mid-epoch", "last-batch", "epoch-end", "inside-a-batch", "epoch-start"]


def _sample(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The data of sample ``i`` (the harness's: fixed by ``i``)."""
    generator = torch.Generator().manual_seed(i)
    return torch.randn(4, generator=generator), torch.randn(1, generator=generator)


def collate_rows(rows: list[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows ``{"i": i}`` as the harness's ``(ids, x, y)`` batches (module level: workers pickle it)."""
    ids = [int(row["i"]) for row in rows]
    xs, ys = zip(*map(_sample, ids), strict=True)
    return torch.tensor(ids), torch.stack(xs), torch.stack(ys)


def _resume_messages(config: Config, crash: CrashPoint, tmp_path: Path) -> list[str]:
    """The warnings a resume from ``crash`` gives (the comparison itself is the test's)."""
    assert run(config, tmp_path / "interrupted", crash=crash).crashed
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(config, tmp_path / "resumed", ckpt_path=checkpoint_path(tmp_path / "interrupted", crash), seed=2)
    return [str(warning.message) for warning in caught]


# ---------------------------------------------------------------- torchdata's StatefulDataLoader
@dataclass(frozen=True)
class StatefulLoaderConfig(Config):
    """A map-style dataset shuffled by torchdata's ``StatefulDataLoader``, which saves its own position; or a Hugging
    Face ``IterableDataset``, whose state it saves."""

    hugging_face: bool = False

    def make_loader(self, model: Model) -> DataLoader:
        stateful_dataloader = require("torchdata.stateful_dataloader")
        if self.hugging_face:
            datasets = require("datasets")
            rows = datasets.Dataset.from_dict({"i": list(range(self.dataset_size))}).to_iterable_dataset()
            return stateful_dataloader.StatefulDataLoader(rows, batch_size=self.batch_size, collate_fn=collate_rows)
        dataset = IndexedDataset(self.dataset_size)
        model.datasets.append(dataset)
        return stateful_dataloader.StatefulDataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=True,
            num_workers=self.num_workers,
            persistent_workers=self.persistent_workers,
        )


# ---------------------------------------------------------------- litdata's StreamingDataset + StreamingDataLoader
def write_streaming_dataset(directory: Path, size: int) -> None:
    """Rows ``{"i": i}`` in litdata's chunked format, as ``litdata.optimize`` writes them (in this process)."""
    writer_module = require("litdata.streaming.writer")
    writer = writer_module.BinaryWriter(str(directory), chunk_size=5)
    for i in range(size):
        writer[i] = {"i": i}
    writer.done()
    writer.merge()


@dataclass(frozen=True)
class StreamingConfig(Config):
    """litdata's ``StreamingDataset`` (shuffled) over a local directory, through its ``StreamingDataLoader``."""

    directory: str = ""
    noisy: bool = False  # each row drawn from torch's global generator as it is read (in the main process)

    def make_loader(self, model: Model) -> DataLoader:
        litdata = require("litdata")
        transform = noisy_row if self.noisy else None
        dataset = litdata.StreamingDataset(self.directory, shuffle=True, seed=3, transform=transform)
        return litdata.StreamingDataLoader(
            dataset, batch_size=self.batch_size, num_workers=self.num_workers, collate_fn=collate_rows
        )


def noisy_row(row: dict[str, Any]) -> dict[str, Any]:
    """An augmentation that draws from torch's global generator."""
    return {**row, "noise": torch.rand(())}


@pytest.fixture(scope="module")
def streaming_directory(tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = tmp_path_factory.mktemp("streaming")
    write_streaming_dataset(directory, 20)
    return str(directory)


# ---------------------------------------------------------------- Hugging Face datasets
@dataclass(frozen=True)
class HuggingFaceMapConfig(Config):
    """An Arrow-backed ``datasets.Dataset`` in torch format, shuffled by the DataLoader, loaded by workers."""

    def make_loader(self, model: Model) -> DataLoader:
        datasets = require("datasets")
        dataset = datasets.Dataset.from_dict({"i": list(range(self.dataset_size))}).with_format("torch")
        return DataLoader(
            dataset, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers, collate_fn=collate_rows
        )


@dataclass(frozen=True)
class HuggingFaceIterableConfig(Config):
    """A ``datasets.IterableDataset`` (its own ``state_dict()``), through a buffer of ``buffer_size`` if set."""

    buffer_size: int = 0

    def make_loader(self, model: Model) -> DataLoader:
        datasets = require("datasets")
        dataset = datasets.Dataset.from_dict({"i": list(range(self.dataset_size))}).to_iterable_dataset()
        if self.buffer_size:
            dataset = dataset.shuffle(seed=3, buffer_size=self.buffer_size)
        return DataLoader(dataset, batch_size=self.batch_size, collate_fn=collate_rows)


# ---------------------------------------------------------------- torch's dataset wrappers
class BatchFetchedDataset(Dataset):
    """A dataset that can only fetch whole batches (``__getitems__``), as torch's fetcher prefers."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> Any:
        raise AssertionError("a batched dataset is fetched through __getitems__")

    def __getitems__(self, indices: list[int]) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
        return [(i, *_sample(i)) for i in indices]


@dataclass(frozen=True)
class WrappedConfig(Config):
    """A shuffled map-style dataset built from torch's wrappers: ``Subset``, ``ConcatDataset``, or batch-fetched."""

    wrapper: str = "subset"

    def make_loader(self, model: Model) -> DataLoader:
        if self.wrapper == "subset":  # every other sample of a dataset twice the size
            dataset: Dataset = Subset(IndexedDataset(2 * self.dataset_size), range(0, 2 * self.dataset_size, 2))
        elif self.wrapper == "concat":
            half = self.dataset_size // 2
            dataset = ConcatDataset([IndexedDataset(half), IndexedDataset(self.dataset_size - half, offset=100)])
        else:
            dataset = BatchFetchedDataset(self.dataset_size)
        return DataLoader(dataset, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers)


# ================================================================ the tests
@pytest.mark.parametrize("crash", CRASHES, ids=CRASH_IDS)
def test_stateful_dataloader(crash, tmp_path):
    """Its own state drives the position (no second skip), the callback restores the random states. At an epoch's
    end Lightning leaves the loader's state unused: the next epoch's order comes from that state's generator. Inside
    a batch Lightning saved the state after that batch's fetch: the state before it is saved instead."""
    assert_exact(interrupt_and_resume(StatefulLoaderConfig(), crash, tmp_path))


def test_stateful_dataloader_with_workers(tmp_path):
    assert_exact(interrupt_and_resume(StatefulLoaderConfig(num_workers=2), MID, tmp_path))


@pytest.mark.parametrize("crash", CRASHES, ids=CRASH_IDS)
def test_stateful_dataloader_over_a_hugging_face_iterable(crash, tmp_path):
    """Lightning fetches ahead from this unsized loader: the state before the fetches a resumed run makes again is
    saved; the dataset state the loader gives it applies to the resumed pass only."""
    assert_exact(interrupt_and_resume(StatefulLoaderConfig(hugging_face=True), crash, tmp_path))


def test_streaming_dataloader_with_workers(streaming_directory, tmp_path):
    config = StreamingConfig(directory=streaming_directory, num_workers=2)
    assert_exact(interrupt_and_resume(config, MID, tmp_path))


@pytest.mark.parametrize("crash", CRASHES, ids=CRASH_IDS)
def test_streaming_dataloader(crash, streaming_directory, tmp_path):
    """litdata's loader leaves its restore mode for the next epoch, and its lazily started iterator's base seed is
    not drawn a second time in the resumed epoch."""
    assert_exact(interrupt_and_resume(StreamingConfig(directory=streaming_directory), crash, tmp_path))


def test_hugging_face_map_style_with_workers(tmp_path):
    assert_exact(interrupt_and_resume(HuggingFaceMapConfig(num_workers=2), MID, tmp_path))


@pytest.mark.parametrize("crash", CRASHES, ids=CRASH_IDS)
def test_hugging_face_iterable_over_several_epochs(crash, tmp_path):
    """The state it was given applies to the resumed pass only: every later epoch starts afresh, as uninterrupted."""
    assert_exact(interrupt_and_resume(HuggingFaceIterableConfig(), crash, tmp_path))


@pytest.mark.parametrize("crash", [LAST, EPOCH_END], ids=["last-batch", "epoch-end"])
def test_hugging_face_shuffle_buffer_at_an_epochs_end(crash, tmp_path):
    """Nothing of the epoch is left in the buffer: exact, and no warning."""
    config = HuggingFaceIterableConfig(buffer_size=4)
    assert not [m for m in _resume_messages(config, crash, tmp_path / "warnings") if "buffer" in m]
    assert_exact(interrupt_and_resume(config, crash, tmp_path))


def test_hugging_face_shuffle_buffer_mid_epoch_loses_that_epoch_only(tmp_path):
    """The warned epoch differs; the epochs after it are the uninterrupted run's."""
    config = HuggingFaceIterableConfig(buffer_size=4)
    comparison = interrupt_and_resume(config, MID, tmp_path)
    later = [row for row in comparison.full.seen if row[0] > MID.epoch]
    assert later
    assert [row for row in comparison.resumed.seen if row[0] > MID.epoch] == later


@pytest.mark.parametrize("wrapper", ["subset", "concat", "batched"])
def test_torch_dataset_wrappers(wrapper, tmp_path):
    assert_exact(interrupt_and_resume(WrappedConfig(wrapper=wrapper), MID, tmp_path))


def test_a_lazily_started_loader_whose_dataset_draws_in_the_main_process_warns(streaming_directory, tmp_path):
    """Its iterator's base seed and the dataset's draws cannot be told apart at the resumed epoch's first fetch."""
    config = StreamingConfig(directory=streaming_directory, noisy=True)
    messages = _resume_messages(config, MID, tmp_path)
    assert any("beyond the iterator's base seed (the dataset, in the main process)" in m for m in messages)
    # what the warning says: the random draws differ from the uninterrupted run's
    full = run(config, tmp_path / "full")
    resumed = run(config, tmp_path / "again", ckpt_path=checkpoint_path(tmp_path / "interrupted", MID), seed=2)
    assert resumed.seen == full.seen[-len(resumed.seen) :]
    assert not torch.equal(resumed.rng["torch"], full.rng["torch"])


def test_a_pass_start_of_a_hugging_face_iterable_in_a_stateful_loader_warns_when_written(tmp_path):
    """Before its first batch the dataset reports its previous pass: Lightning's own loader state is kept, and the
    batch Lightning fetched ahead is skipped on resume, as in stock Lightning."""
    config = StatefulLoaderConfig(hugging_face=True)
    crash = CrashPoint("train_epoch_start", epoch=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run(config, tmp_path / "interrupted", crash=crash).crashed
    assert any(
        "A checkpoint was written before the first batch of train dataloader 0 (StatefulDataLoader)" in str(w.message)
        for w in caught
    )
    full = run(config, tmp_path / "full")
    resumed = run(config, tmp_path / "resumed", ckpt_path=checkpoint_path(tmp_path / "interrupted", crash), seed=2)
    assert resumed.seen[0][2] == full.seen[1][2]


def test_unsaved_buffer_of_a_hugging_face_iterable_dataset():
    datasets = require("datasets")
    plain = datasets.Dataset.from_dict({"i": list(range(10))}).to_iterable_dataset(num_shards=2)
    assert _datalibs.unsaved_buffer(plain) is None
    assert _datalibs.unsaved_buffer(plain.shuffle(seed=1, buffer_size=4)) == "a shuffle buffer of 4 examples"
    mapped = plain.shuffle(seed=1, buffer_size=3).map(lambda row: {"j": row["i"] + 1})
    assert _datalibs.unsaved_buffer(mapped) == "a shuffle buffer of 3 examples"
    interleaved = datasets.interleave_datasets([plain, plain.shuffle(seed=1, buffer_size=5)])
    assert _datalibs.unsaved_buffer(interleaved) == "a shuffle buffer of 5 examples"
