"""What a resume restores, and what it says before it trains when it cannot: lost generators, devices and buffers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from conftest import require
from harness import Config, CrashPoint, Model, interrupted_checkpoint, resume_warnings, run

MID = CrashPoint("train_batch_end", epoch=1, batch=3)


def _interrupted_at_mid(config: Config, tmp_path: Path) -> Path:
    return interrupted_checkpoint(config, tmp_path, MID)


def _edited(ckpt: Path, edit: Any) -> Path:
    """A copy of the checkpoint with its MidEpochResume state edited (the user's file is never touched)."""
    checkpoint = torch.load(ckpt, weights_only=True)
    edit(checkpoint["callbacks"]["MidEpochResume"])
    path = ckpt.with_name("edited.ckpt")
    torch.save(checkpoint, path)
    return path


def test_a_recorded_generator_that_is_gone_warns(tmp_path):
    config = Config(loader="sampler_generator")
    ckpt = _interrupted_at_mid(config, tmp_path)

    def add_a_generator(state: dict) -> None:
        (objects,) = state["ranks"][0]["generators"]
        objects["loader.sampler.rng"] = objects["loader.sampler.generator"]  # the run that saved had one more

    messages = resume_warnings(config, _edited(ckpt, add_a_generator), tmp_path)
    assert any("loader.sampler.rng of train dataloader 0" in m and "not restored" in m for m in messages)


def test_cuda_states_for_other_devices_warn(tmp_path):
    config = Config()
    ckpt = _interrupted_at_mid(config, tmp_path)

    def add_cuda_states(state: dict) -> None:
        state["ranks"][0]["rng"]["cuda"] = [torch.zeros(16, dtype=torch.uint8)] * 2

    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    messages = resume_warnings(config, _edited(ckpt, add_cuda_states), tmp_path)
    assert any(f"CUDA random states of 2 device(s) but this process sees {devices}" in m for m in messages)


def test_a_chain_deeper_than_the_search_warns(tmp_path, monkeypatch):
    from lightning_midepoch import _rng

    config = Config(loader="sampler_generator")
    ckpt = _interrupted_at_mid(config, tmp_path)
    monkeypatch.setattr(_rng, "_DEPTH", 0)  # the search stops at the loader: its sampler chain goes on
    messages = resume_warnings(config, ckpt, tmp_path)
    assert any("goes deeper than the search for random generators (loader.sampler" in m for m in messages)


# ---------------------------------------------------------------- Hugging Face datasets.IterableDataset
def _collate(rows: list[dict[str, int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows ``{"i": i}`` as the harness's ``(ids, x, y)`` batches, with data fixed by ``i``."""
    xs, ys = [], []
    for row in rows:
        generator = torch.Generator().manual_seed(row["i"])
        xs.append(torch.randn(4, generator=generator))
        ys.append(torch.randn(1, generator=generator))
    return torch.tensor([row["i"] for row in rows]), torch.stack(xs), torch.stack(ys)


@dataclass(frozen=True)
class HuggingFaceConfig(Config):
    buffer_size: int = 0  # shuffle through a buffer of this many examples

    def loaders(self, model: Model) -> Any:
        datasets = require("datasets")
        dataset = datasets.Dataset.from_dict({"i": list(range(self.dataset_size))}).to_iterable_dataset()
        if self.buffer_size:
            dataset = dataset.shuffle(seed=3, buffer_size=self.buffer_size)
        return DataLoader(dataset, batch_size=self.batch_size, collate_fn=_collate)


def test_a_hugging_face_shuffle_buffer_warns_before_training(tmp_path):
    config = HuggingFaceConfig(buffer_size=4)
    full = run(config, tmp_path / "full")
    ckpt = _interrupted_at_mid(config, tmp_path)
    messages = resume_warnings(config, ckpt, tmp_path)
    assert any(
        "Train dataloader 0 iterates over an IterableDataset that draws from a shuffle buffer of 4" in m
        for m in messages
    )
    # what the warning says: the resumed epoch is not the uninterrupted run's
    resumed = run(config, tmp_path / "again", ckpt_path=ckpt, seed=2)
    assert resumed.seen != full.seen[-len(resumed.seen) :]


def test_no_buffer_warning_without_a_buffer(tmp_path):
    config = HuggingFaceConfig()
    assert not [m for m in resume_warnings(config, _interrupted_at_mid(config, tmp_path), tmp_path) if "buffer" in m]


def test_a_dataset_generator_the_checkpoint_did_not_save_warns(tmp_path):
    """A checkpoint of an earlier release holds no states for the generators a dataset read in the main process
    owns: they continue from fresh states, and the resumed run says so before training."""
    config = Config(augment=True, num_workers=0)
    ckpt = _interrupted_at_mid(config, tmp_path)

    def as_an_earlier_release_wrote_it(state: dict) -> None:
        del state["ranks"][0]["dataset_generators"]

    messages = resume_warnings(config, _edited(ckpt, as_an_earlier_release_wrote_it), tmp_path)
    assert any(
        "train dataloader 0 draws from its own random generator(s) dataset.generator" in m
        and "the checkpoint holds no states for them" in m
        for m in messages
    )
    assert not any("dataset.generator" in m for m in resume_warnings(config, ckpt, tmp_path / "unedited"))
