"""Shared pieces of the benchmarks.

A dataset whose samples cost a realistic time to load, the samplers under test, a Lightning module and trainer that
time ``trainer.fit(ckpt_path=...)`` up to the first ``training_step``, mid-epoch checkpoints built from a real one,
and the statistics, table and plot helpers every benchmark uses.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import logging
import os
import statistics
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

from lightning_midepoch import MidEpochResume

BATCH_SIZE = 32
SAMPLE_COST_S = 50e-6  # a realistic per-sample load: decoding a small image, tokenizing a line
ORDER_SEED = 1234
SAMPLERS = ("RandomSampler", "SequentialSampler", "DistributedSampler")
RESULTS_DIR = Path(__file__).resolve().parent / "results"
CALLBACK_KEY = MidEpochResume.__qualname__  # Lightning's default state_key: the callback's checkpoint entry


def setup_process() -> None:
    """One intra-op thread (stable timings on a shared machine), no Lightning chatter, no warnings.

    Warnings are silenced because stock Lightning warns on every mid-epoch resume; every resume below is checked
    against the uninterrupted order instead.
    """
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    freeze_heap()


def freeze_heap() -> None:
    """Exempt every object alive now (modules, classes) from garbage collection.

    :func:`collect_garbage` runs before every measurement; a full collection over the hundreds of thousands of
    objects torch and Lightning import takes a quarter of a second, which would otherwise dominate the benchmarks'
    runtime. Call again after lazily imported modules have been loaded.
    """
    gc.collect()
    gc.freeze()


def busy_wait(seconds: float) -> None:
    """Spin for ``seconds`` (more accurate than ``time.sleep`` at tens of microseconds)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class CostlyDataset(Dataset[int]):
    """``size`` samples; loading one costs ``cost_s`` seconds of CPU and returns its index.

    ``loaded`` counts the samples loaded, so a benchmark can check that skipped samples never were.
    """

    def __init__(self, size: int, cost_s: float = SAMPLE_COST_S) -> None:
        self.size = size
        self.cost_s = cost_s
        self.loaded = 0

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        if self.cost_s:
            busy_wait(self.cost_s)
        self.loaded += 1
        return index


def make_sampler(kind: str, data: Any) -> Any:
    """A fresh sampler of the given kind over ``data``; the random ones are seeded, so every run draws one order."""
    if kind == "RandomSampler":
        return RandomSampler(data, generator=torch.Generator().manual_seed(ORDER_SEED))
    if kind == "SequentialSampler":
        return SequentialSampler(data)
    if kind == "DistributedSampler":
        return DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=ORDER_SEED)
    raise ValueError(f"unknown sampler {kind!r}")


def make_loader(size: int, kind: str, cost_s: float = SAMPLE_COST_S) -> DataLoader[int]:
    """The train loader every method resumes: ``DataLoader(CostlyDataset, batch_size=32, sampler=...)``."""
    dataset = CostlyDataset(size, cost_s)
    return DataLoader(dataset, batch_size=BATCH_SIZE, sampler=make_sampler(kind, dataset))


def reference_batches(size: int, kind: str, positions: Iterable[int]) -> dict[int, list[int]]:
    """Batch ``k`` of the uninterrupted epoch for each ``k`` in ``positions``, from torch's own iteration."""
    wanted = set(positions)
    found: dict[int, list[int]] = {}
    batches = BatchSampler(make_sampler(kind, range(size)), BATCH_SIZE, drop_last=False)
    for index, batch in enumerate(batches):
        if index in wanted:
            found[index] = batch
            if len(found) == len(wanted):
                break
    return found


class StartAt(Sampler[list[int]]):
    """A batch sampler that iterates ``batches`` from batch ``start``, skipped by ``skip(batches, start)``."""

    def __init__(self, batches: Any, start: int, skip: Callable[[Any, int], Iterator[list[int]]]) -> None:
        self.batches, self.start, self.skip = batches, start, skip

    def __len__(self) -> int:
        return len(self.batches) - self.start

    def __iter__(self) -> Iterator[list[int]]:
        return self.skip(self.batches, self.start)


class FirstStep(Exception):
    """Raised by the first ``training_step`` of a timed fit: the resume is over, the measurement is taken."""


class ResumeProbe(L.LightningModule):
    """A one-layer model whose first ``training_step`` records the time and its batch, then ends the fit."""

    def __init__(self, size: int, kind: str, cost_s: float = SAMPLE_COST_S) -> None:
        super().__init__()
        self.layer = nn.Linear(1, 1)
        self.size, self.kind, self.cost_s = size, kind, cost_s
        self.dataset: CostlyDataset | None = None
        self.first_step_at: float | None = None
        self.first_batch: list[int] | None = None
        self.stop_at_first_step = True

    def train_dataloader(self) -> DataLoader[int]:
        loader = make_loader(self.size, self.kind, self.cost_s)
        self.dataset = loader.dataset  # type: ignore[assignment]
        return loader

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if self.first_step_at is None:
            self.first_step_at = time.perf_counter()
            self.first_batch = batch.tolist()
            if self.stop_at_first_step:
                raise FirstStep
        return self.layer(batch.float().unsqueeze(1)).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def make_trainer(callbacks: Sequence[L.Callback], **kwargs: Any) -> L.Trainer:
    """A quiet single-process CPU trainer for one epoch, without validation, logging or checkpointing."""
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=list(callbacks),
        **kwargs,
    )


class _SaveAndStop(L.Callback):
    """Write a checkpoint at the epoch's start and after its first batch, then stop the fit."""

    def __init__(self, at_start: Path, after_first: Path) -> None:
        self.at_start, self.after_first = at_start, after_first

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        trainer.save_checkpoint(self.at_start)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        trainer.save_checkpoint(self.after_first)
        raise FirstStep


def write_real_checkpoints(size: int, kind: str, directory: Path) -> tuple[Path, Path]:
    """Train one batch with ``MidEpochResume`` and write two real checkpoints.

    Returns:
        The checkpoint written in ``on_train_epoch_start`` (0 batches consumed) and the one written in
        ``on_train_batch_end`` of the first batch (1 batch consumed), the base of :func:`checkpoint_at`.

    """
    at_start, after_first = directory / f"{kind}-{size}-start.ckpt", directory / f"{kind}-{size}-batch1.ckpt"
    model = ResumeProbe(size, kind)
    model.stop_at_first_step = False
    trainer = make_trainer([MidEpochResume(), _SaveAndStop(at_start, after_first)])
    with contextlib.suppress(FirstStep):
        trainer.fit(model)
    return at_start, after_first


def checkpoint_at(base: dict[str, Any], consumed: int) -> dict[str, Any]:
    """A copy of ``base`` that says ``consumed`` batches of the epoch were trained on.

    ``base`` is a real checkpoint written by ``trainer.save_checkpoint`` in ``on_train_batch_end`` of the epoch's
    first batch. Only Lightning's progress counters change (to what they are in ``on_train_batch_end`` of batch
    ``consumed - 1``): the model, optimizer, random states and the recorded order stay as written, and the order of
    an epoch does not depend on how far into it a checkpoint was taken.
    """
    loops = base["loops"]["fit_loop"]
    if loops["epoch_loop.batch_progress"]["current"]["processed"] != 1:
        raise ValueError("the base checkpoint must be written in on_train_batch_end of the epoch's first batch")
    checkpoint = copy.deepcopy(base)
    loops = checkpoint["loops"]["fit_loop"]
    optimizer = loops["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]
    for scope in ("current", "total"):
        loops["epoch_loop.batch_progress"][scope].update(
            ready=consumed, started=consumed, processed=consumed, completed=consumed - 1
        )
        optimizer["step"][scope].update(ready=consumed, completed=consumed)
        optimizer["zero_grad"][scope].update(ready=consumed, started=consumed, completed=consumed)
    loops["epoch_loop.state_dict"]["_batches_that_stepped"] = consumed - 1
    checkpoint["global_step"] = consumed
    state = checkpoint["callbacks"][CALLBACK_KEY]
    if "fetched" in state:  # batches handed to the loop so far (informational)
        state["fetched"] = consumed
    return checkpoint


def checkpoints_for(size: int, kind: str, positions: Iterable[int], directory: Path) -> dict[int, Path]:
    """Checkpoint files ``consumed`` batches into epoch 0, for each position (0: the epoch-start checkpoint)."""
    at_start, after_first = write_real_checkpoints(size, kind, directory)
    base = torch.load(after_first, weights_only=False)
    paths: dict[int, Path] = {}
    for consumed in positions:
        if consumed == 0:
            paths[consumed] = at_start
        elif consumed == 1:
            paths[consumed] = after_first
        else:
            paths[consumed] = directory / f"{kind}-{size}-at{consumed}.ckpt"
            torch.save(checkpoint_at(base, consumed), paths[consumed])
    return paths


class FitResume:
    """One timed ``trainer.fit(model, ckpt_path=...)`` from its call to the first ``training_step``."""

    def __init__(self, size: int, kind: str, ckpt_path: Path | None, with_callback: bool) -> None:
        collect_garbage()
        model = ResumeProbe(size, kind)
        trainer = make_trainer([MidEpochResume()] if with_callback else [])
        start = time.perf_counter()
        with contextlib.suppress(FirstStep):
            trainer.fit(model, ckpt_path=ckpt_path)
        if model.first_step_at is None or model.first_batch is None or model.dataset is None:
            raise RuntimeError("the fit ended without a training step")
        self.seconds = model.first_step_at - start
        self.first_batch: list[int] = model.first_batch
        self.samples_loaded = model.dataset.loaded


def collect_garbage() -> None:
    """Free what earlier measurements left behind, before the next one starts.

    Lightning's trainer holds reference cycles, and an iterator over a loader may hold a permutation of millions of
    indices: left to an automatic collection, freeing them could land inside a later measurement.
    """
    gc.collect()


def timed(action: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds taken by ``action()``, and its result (garbage is collected first, outside the clock)."""
    collect_garbage()
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def median(values: Sequence[float]) -> float:
    """The median of ``values``."""
    return float(statistics.median(values))


def seconds(value: float) -> str:
    """A duration for a table: µs, ms or s with three significant digits."""
    if value < 1e-3:
        return f"{value * 1e6:.3g} µs"
    if value < 1:
        return f"{value * 1e3:.3g} ms"
    return f"{value:.3g} s"


def ratio(value: float) -> str:
    """A ratio for a table (``1.05x``, ``1,665x``)."""
    return f"{value:,.2f}x" if value < 10 else f"{value:,.0f}x"


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def progress(message: str) -> None:
    """Print a progress line at once (benchmarks run for minutes)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def interleaved(repeats: int, items: Sequence[Any]) -> Iterator[Any]:
    """Every item once per repeat, in the same order each time (ABAB...).

    Interleaving spreads the machine's slow phases over every method instead of penalizing whichever ran then.
    """
    for _ in range(repeats):
        yield from items
