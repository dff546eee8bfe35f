"""The batch check never touches the run it checks: with the callback, a run that is never resumed is stock's.

Each test runs the same training twice in one process, with and without ``MidEpochResume``, and compares what a user
sees: the checkpoint files written, whether the fit completes or the exception it raises, the samples the dataset
loaded, every random number drawn by the model's hooks, and the final weights. The three cases are those of issue 36,
where fetching the next batch at a checkpoint (to fingerprint it) ran the user's data code inside ``ModelCheckpoint``.
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from harness import L, ModelCheckpoint
from lightning_midepoch import MidEpochResume


class _Samples(Dataset):
    """Sample ``i`` is ``(i, x_i + noise, y_i)``, the noise drawn from torch and numpy; sample ``corrupt`` raises."""

    def __init__(self, size: int, corrupt: int | None = None) -> None:
        self.size, self.corrupt = size, corrupt
        self.loaded: list[int] = []

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        self.loaded.append(index)
        if index == self.corrupt:
            raise OSError(f"sample {index} is corrupt")
        x = torch.full((4,), float(index)) + 0.1 * torch.rand(4) + float(np.random.rand())
        return index, x, torch.full((1,), float(index % 3))


class _Module(L.LightningModule):
    """Records the batches it trains on and a random number drawn in its own ``on_train_batch_end``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.trained: list[list[int]] = []
        self.drawn: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        ids, x, y = batch
        self.trained.append(ids.tolist())
        return nn.functional.mse_loss(self.net(x), y)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Lightning calls the module's hook after every callback's: after the checkpoint ModelCheckpoint writes here
        self.drawn.append(torch.rand(()).item())

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _Run:
    """One fit, with or without the callback: what it wrote, trained, drew and raised."""

    def __init__(self, root: Path, dataset: _Samples, callback: bool, shuffle: bool = False, **trainer: Any) -> None:
        torch.manual_seed(0)
        np.random.seed(0)
        random.seed(0)
        self.dataset, self.module = dataset, _Module()
        self.directory = root / "checkpoints"
        every_step = ModelCheckpoint(dirpath=self.directory, every_n_train_steps=1, save_top_k=-1)
        fit_trainer = L.Trainer(
            default_root_dir=root,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            callbacks=[MidEpochResume(), every_step] if callback else [every_step],
            **trainer,
        )
        self.error: BaseException | None = None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                fit_trainer.fit(self.module, DataLoader(dataset, batch_size=2 if shuffle else 1, shuffle=shuffle))
            except OSError as error:
                self.error = error
        self.warnings = [str(warning.message) for warning in caught]
        self.files = sorted(path.name for path in self.directory.glob("*.ckpt"))
        self.weights = {name: tensor.clone() for name, tensor in self.module.state_dict().items()}

    def assert_same_as(self, stock: _Run) -> None:
        assert self.files == stock.files
        assert self.dataset.loaded == stock.dataset.loaded
        assert self.module.trained == stock.module.trained
        assert self.module.drawn == stock.module.drawn
        assert self.weights.keys() == stock.weights.keys()
        assert all(torch.equal(self.weights[name], stock.weights[name]) for name in stock.weights)
        assert repr(self.error) == repr(stock.error)
        assert [message for message in self.warnings if message not in stock.warnings] == []


def test_a_data_error_in_the_next_batch_loses_no_checkpoint(tmp_path):
    """A corrupt 4th sample, a checkpoint after every step: steps 1 to 3 are written, then the fetch raises."""
    stock = _Run(tmp_path / "stock", _Samples(8, corrupt=3), callback=False, max_epochs=1)
    ours = _Run(tmp_path / "ours", _Samples(8, corrupt=3), callback=True, max_epochs=1)
    assert isinstance(stock.error, OSError)
    assert [name.split("step=")[1] for name in stock.files] == ["1.ckpt", "2.ckpt", "3.ckpt"]
    ours.assert_same_as(stock)


def test_a_fit_that_stops_at_max_steps_reads_nothing_past_it(tmp_path):
    """``max_steps=3`` with a corrupt sample only a 4th batch would read: the fit completes, as stock's does."""
    stock = _Run(tmp_path / "stock", _Samples(8, corrupt=3), callback=False, max_steps=3)
    ours = _Run(tmp_path / "ours", _Samples(8, corrupt=3), callback=True, max_steps=3)
    assert stock.error is None
    assert stock.dataset.loaded == [0, 1, 2]
    ours.assert_same_as(stock)


def test_a_run_that_is_never_interrupted_draws_what_stock_draws(tmp_path):
    """No workers, augmentation from torch and numpy, a module hook drawing after the checkpoint: the same run."""
    stock = _Run(tmp_path / "stock", _Samples(12), callback=False, shuffle=True, max_epochs=2)
    ours = _Run(tmp_path / "ours", _Samples(12), callback=True, shuffle=True, max_epochs=2)
    assert len(stock.module.drawn) == 12
    assert len(stock.files) == 12
    ours.assert_same_as(stock)
