"""What one trainer's session runs at every training step, counted in Python calls (not timed)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning_midepoch
from harness import L
from lightning_midepoch import MidEpochResume

PACKAGE = str(Path(lightning_midepoch.__file__).parent)
COUNTED = range(5, 15)  # the steps counted, past the epoch's start


class _Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _CountOurCalls(L.Callback):
    """Counts the Python calls of the package's code during the counted steps (the rest of the fit is not counted)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def _profile(self, frame, event, arg) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            self.calls[frame.f_code.co_name] += 1

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == COUNTED.start:
            sys.setprofile(self._profile)
        elif trainer.global_step == COUNTED.stop:
            sys.setprofile(None)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_training_step_runs_a_fixed_few_python_calls_of_the_callbacks_own(num_workers, tmp_path):
    """The fetch's override and its hooks, the batch start's read and the backward hook; nothing per item of a pass."""
    counter = _CountOurCalls()
    data = TensorDataset(torch.randn(64, 4))
    trainer = L.Trainer(
        default_root_dir=tmp_path,
        max_steps=COUNTED.stop + 2,
        callbacks=[MidEpochResume(), counter],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(_Model(), DataLoader(data, batch_size=2, shuffle=True, num_workers=num_workers))
    steps = len(COUNTED)
    per_step = ("__next__", "before_fetch", "take", "_numpy_global_mark", "after_fetch", "on_after_backward")
    per_step += ("on_train_batch_end", "_serve_signals")  # a consistent point for signals (see _preemption)
    per_step += ("validation_follows",)  # (the random states a checkpoint inside a validation records)
    per_step += ("batch_end_reached",)  # (which on_train_batch_end hooks a checkpoint written now precedes)
    assert counter.calls == Counter({name: steps for name in per_step})
