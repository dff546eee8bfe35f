"""Benchmark 4: what recording the random states of DataLoader workers costs.

Times are CPU times of the measuring thread (the machine is shared).

* **Work per batch in each worker**: the recording wrapper around ``collate_fn`` runs in the worker once per batch,
  searches the worker's copy of the dataset for generators again (it may have created one since) and copies the
  worker's states into shared memory. Timed in this process exactly as a worker runs it (the same objects), for a
  dataset without and with a generator of its own and for one with a transform pipeline whose three steps own one
  each, against the baseline of what a worker does for a batch anyway: loading and collating 32 augmented samples of
  16 floats (the demo's dataset). The search alone is timed too.
* **Main-process time per batch**: the one thing the main process does per batch is pass each index list through one
  more generator frame (it numbers a pass at its first index): timed with and without it over a ``BatchSampler``.
* **Checkpoint bytes per worker**: ``torch.save`` of the worker entry a real checkpoint holds, for 1 to 4 workers.

Run alone: ``python benchmarks/bench_workers.py``.
"""

from __future__ import annotations

import io
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import BATCH_SIZE, median, progress, table
from torch.utils.data import BatchSampler, Dataset, RandomSampler, default_collate

from lightning_midepoch import _order, _workers

REPEATS = 2000
WORKER_COUNTS = (1, 2, 3, 4)


class Jitter:
    """A pipeline step that owns a numpy generator."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.from_numpy(self.rng.normal(size=x.shape).astype(np.float32))


class Compose:
    def __init__(self, steps: list[Any]) -> None:
        self.transforms = steps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for step in self.transforms:
            x = step(x)
        return x


class Augmented(Dataset):
    """The demo's dataset: 16 fixed floats per sample plus noise drawn from torch's and numpy's generators."""

    def __init__(self, size: int, own_generator: bool, pipeline: bool = False) -> None:
        self.x = torch.randn(size, 16, generator=torch.Generator().manual_seed(0))
        self.generator = torch.Generator().manual_seed(1) if own_generator else None
        self.transform = Compose([Jitter(2), Jitter(3), Jitter(4)]) if pipeline else None

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor]:
        noise = 0.05 * torch.randn(16) * (1.0 + float(np.random.rand()))
        if self.generator is not None:
            noise = noise + torch.rand(16, generator=self.generator)
        x = self.x[index] + noise
        return index, self.transform(x) if self.transform is not None else x


def _per_call(action: Any, repeats: int = REPEATS) -> float:
    """The median CPU time of one call, over ``repeats`` calls timed in 20 groups.

    CPU time of this thread: on a shared machine, wall-clock time would count the time other processes ran.
    """
    group = max(repeats // 20, 1)
    times = []
    for _ in range(20):
        start = time.thread_time()
        for _ in range(group):
            action()
        times.append((time.thread_time() - start) / group)
    return median(times)


def worker_cost() -> list[dict[str, Any]]:
    rows = []
    kinds = {
        "global generators only": {"own_generator": False},
        "with its own torch.Generator": {"own_generator": True},
        "a Compose of 3 steps, each with a numpy Generator": {"own_generator": False, "pipeline": True},
    }
    for name, options in kinds.items():
        dataset = Augmented(10_000, **options)
        buffers = _workers._Buffers.allocate(1, 8, 65536, 1)
        recorder = _workers._WorkerRecorder(0, buffers, dataset)
        baseline = _per_call(lambda data=dataset: default_collate([data[i] for i in range(BATCH_SIZE)]), REPEATS // 10)
        recording = _per_call(recorder.batch_done)
        search = _per_call(lambda data=dataset: _workers._generators(data))
        rows.append(
            {
                "dataset": name,
                "search_s": search,
                "recording_s": recording,
                "batch_s": baseline,
                "ratio": recording / baseline,
                "slot_bytes": len(recorder.raw()),
            }
        )
    return rows


def main_process_cost() -> dict[str, float]:
    sampler = BatchSampler(RandomSampler(range(BATCH_SIZE * 10_000)), BATCH_SIZE, drop_last=False)

    def epoch(on_pass: Any) -> float:
        recorder = _order._IndexSamplerRecorder(sampler, {}, lambda: 0)
        recorder.on_pass = on_pass
        start = time.thread_time()
        for _ in recorder:
            pass
        return (time.thread_time() - start) / len(sampler)

    plain, numbered = [], []
    for _ in range(5):
        plain.append(epoch(None))
        numbered.append(epoch(lambda skip, first: []))
    return {"without_s": median(plain), "with_s": median(numbered), "added_s": median(numbered) - median(plain)}


def checkpoint_bytes() -> list[dict[str, Any]]:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from harness import Config, CrashPoint, checkpoint_path, run

    rows = []
    crash = CrashPoint("train_batch_end", epoch=0, batch=4)
    for workers in WORKER_COUNTS:
        with tempfile.TemporaryDirectory() as directory:
            config = Config(augment=True, num_workers=workers, max_epochs=1)
            run(config, Path(directory), crash=crash)
            state = torch.load(checkpoint_path(Path(directory), crash), weights_only=True)["callbacks"][
                "MidEpochResume"
            ]
        entry = state["ranks"][0]["workers"][0]
        total = io.BytesIO()
        torch.save(entry, total)
        whole = io.BytesIO()
        torch.save(state, whole)
        rows.append(
            {
                "num_workers": workers,
                "entry_bytes": total.tell(),
                "per_worker_bytes": total.tell() / workers,
                "state_bytes": whole.tell(),
            }
        )
    return rows


def run() -> dict[str, Any]:
    progress("workers: recording cost per batch in a worker")
    worker = worker_cost()
    progress("workers: main-process cost per batch")
    main = main_process_cost()
    progress("workers: checkpoint bytes per worker")
    sizes = checkpoint_bytes()
    markdown = "\n\n".join(
        [
            table(
                [
                    "dataset",
                    "recording per batch (in the worker)",
                    "of which the search for generators",
                    "loading + collating a batch of 32",
                    "ratio",
                    "slot bytes",
                ],
                [
                    [
                        row["dataset"],
                        f"{row['recording_s'] * 1e6:.1f} µs",
                        f"{row['search_s'] * 1e6:.1f} µs",
                        f"{row['batch_s'] * 1e6:.0f} µs",
                        f"{row['ratio']:.3f}",
                        f"{row['slot_bytes']:,}",
                    ]
                    for row in worker
                ],
            ),
            f"Main process, per batch: {main['without_s'] * 1e6:.2f} µs to draw an index list without the pass"
            f" numbering, {main['with_s'] * 1e6:.2f} µs with it ({main['added_s'] * 1e6:+.2f} µs).",
            table(
                ["num_workers", "worker entry in the checkpoint", "per worker", "whole MidEpochResume state"],
                [
                    [
                        row["num_workers"],
                        f"{row['entry_bytes']:,} B",
                        f"{row['per_worker_bytes']:,.0f} B",
                        f"{row['state_bytes']:,} B",
                    ]
                    for row in sizes
                ],
            ),
        ]
    )
    return {"json": {"worker": worker, "main_process": main, "checkpoint": sizes}, "markdown": {"workers": markdown}}


if __name__ == "__main__":
    outcome = run()
    print(outcome["markdown"]["workers"])
