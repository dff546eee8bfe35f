"""Benchmark 3: the bytes the callback adds to a checkpoint, and the memory a resume takes.

* **Size**: ``checkpoint["callbacks"]["MidEpochResume"]`` serialized with ``torch.save``, from a real checkpoint
  written after the first batch of an epoch, for datasets of 10^3, 10^5 and 10^7 samples and each sampler.
* **Memory**: for a 10^7-sample ``RandomSampler`` epoch, peak memory from starting each action to the first batch
  (the first ``training_step`` for ``fit``), each in a fresh process: the sampler alone starting an epoch (what the
  sampler itself allocates), ``fast_forward`` to 90% of the epoch, a fresh ``fit`` (no checkpoint), and resumes with
  ``MidEpochResume`` at k = 0 and k = 90%. Two numbers per action: the growth of the peak resident set (everything,
  torch tensors included) and the peak of Python allocations traced by ``tracemalloc`` (Python objects such as the
  lists of indices; torch's tensor storage is allocated outside it), each from its own process.

Run alone: ``python benchmarks/bench_size_memory.py``.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _common import (
    BATCH_SIZE,
    CALLBACK_KEY,
    SAMPLERS,
    FitResume,
    StartAt,
    checkpoints_for,
    make_loader,
    progress,
    table,
    write_real_checkpoints,
)
from torch.utils.data import DataLoader

from lightning_midepoch import fast_forward

STATE_SIZES = (10**3, 10**5, 10**7)
MEMORY_SIZE = 10**7
MEMORY_KIND = "RandomSampler"
LATE = int(0.9 * -(-MEMORY_SIZE // BATCH_SIZE))
ACTIONS = {
    "sampler": "sampler alone: first batch of a new epoch (stock iteration)",
    "fast_forward": "`fast_forward` to 90% of the epoch: first batch",
    "fresh_fit": "fresh `fit()` (no checkpoint): to the first `training_step`",
    "resume_start": "`fit(ckpt_path)` with MidEpochResume, k = 0",
    "resume_late": f"`fit(ckpt_path)` with MidEpochResume, k = 90% ({LATE:,})",
}
TRACED = ("fast_forward", "fresh_fit", "resume_late")  # see the notes in markdown()
STATE_PARTS = {
    "rng": "process-wide random states at the checkpoint (torch, numpy, python)",
    "passes": "random states the epoch's order was drawn from (per loader)",
    "generators": "the loaders' own generators at the checkpoint",
    "dataset_states": "iterable datasets' own positions",
    "grads": "partial gradients (inside an accumulation group only)",
}


def _tensor_bytes(value: Any) -> int:
    """Bytes of tensor data in a nested structure of dicts and lists."""
    if isinstance(value, torch.Tensor):
        return value.nbytes
    if isinstance(value, dict):
        return sum(_tensor_bytes(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(item) for item in value)
    return 0


def state_bytes(checkpoint_path: Path) -> dict[str, Any]:
    """Bytes of the callback's entry serialized alone with ``torch.save``, of the whole checkpoint file, and of the
    tensor data in each part of the entry's first rank."""
    checkpoint = torch.load(checkpoint_path, weights_only=False)
    state = checkpoint["callbacks"][CALLBACK_KEY]
    buffer = io.BytesIO()
    torch.save(state, buffer)
    rank = state["ranks"][0]
    return {
        "state_bytes": len(buffer.getvalue()),
        "checkpoint_bytes": checkpoint_path.stat().st_size,
        "tensor_bytes_by_part": {part: _tensor_bytes(rank.get(part)) for part in STATE_PARTS},
    }


def sizes(workdir: Path) -> list[dict[str, Any]]:
    """The callback's checkpoint entry for every dataset size and sampler."""
    rows = []
    for size in STATE_SIZES:
        for kind in SAMPLERS:
            progress(f"size: {kind}, {size:,} samples")
            _, after_first = write_real_checkpoints(size, kind, workdir)
            rows.append({"sampler": kind, "dataset_samples": size, **state_bytes(after_first)})
    return rows


# ---------------------------------------------------------------------------------------------- in the child process
def _reset_peak_rss() -> bool:
    """Reset the kernel's resident-set high-water mark (Linux); False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _peak_rss_bytes(reset: bool) -> int:
    if reset:
        match = re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text())
        if match:
            return int(match.group(1)) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


def _action(name: str, checkpoints: dict[str, str]) -> Callable[[], object]:
    """The action to measure; everything it needs beforehand (imports, objects) is made here."""
    if name in ("sampler", "fast_forward"):
        loader = make_loader(MEMORY_SIZE, MEMORY_KIND)
        start = 0 if name == "sampler" else LATE

        def first_batch() -> object:
            iterator = iter(
                DataLoader(loader.dataset, batch_sampler=StartAt(loader.batch_sampler, start, fast_forward))
            )
            return next(iterator), iterator

        return first_batch
    checkpoint = {"fresh_fit": None, "resume_start": checkpoints["0"], "resume_late": checkpoints[str(LATE)]}[name]
    return lambda: FitResume(MEMORY_SIZE, MEMORY_KIND, Path(checkpoint) if checkpoint else None, with_callback=True)


def child(name: str, mode: str, checkpoints: dict[str, str]) -> dict[str, Any]:
    """Measure one action in this process: peak RSS growth (``mode="rss"``) or the tracemalloc peak."""
    import psutil
    from _common import setup_process

    setup_process()
    warm = _action("fast_forward", checkpoints)  # the fast paths' one-time check, and first-call allocations
    warm()
    action = _action(name, checkpoints)
    if mode == "tracemalloc":
        tracemalloc.start()
        result = action()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        del result
        return {"tracemalloc_peak_bytes": peak}
    baseline = psutil.Process().memory_info().rss
    reset = _reset_peak_rss()
    result = action()
    peak = _peak_rss_bytes(reset)
    del result
    return {"rss_before_bytes": baseline, "rss_peak_bytes": peak, "rss_growth_bytes": peak - baseline}


# ---------------------------------------------------------------------------------------------- in the parent process
def memory(workdir: Path) -> dict[str, dict[str, Any]]:
    """Every action in fresh processes (one for the resident set, one for tracemalloc)."""
    progress(f"memory: {MEMORY_KIND}, {MEMORY_SIZE:,} samples: checkpoints")
    paths = checkpoints_for(MEMORY_SIZE, MEMORY_KIND, (0, LATE), workdir)
    checkpoints = json.dumps({str(k): str(path) for k, path in paths.items()})
    results: dict[str, dict[str, Any]] = {}
    for name in ACTIONS:
        results[name] = {}
        for mode in ("rss", "tracemalloc") if name in TRACED else ("rss",):
            command = [sys.executable, __file__, "--child", name, "--mode", mode, "--checkpoints", checkpoints]
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            results[name].update(json.loads(output.strip().splitlines()[-1]))
        progress(f"memory: {name}: {results[name]}")
    return results


def _mb(value: int) -> str:
    return f"{value / 2**20:,.1f} MiB"


def markdown(size_rows: list[dict[str, Any]], memory_results: dict[str, dict[str, Any]]) -> str:
    size_table = table(
        ["sampler", *(f"{size:,} samples" for size in STATE_SIZES)],
        [
            [kind]
            + [
                f"{row['state_bytes']:,} B"
                for size in STATE_SIZES
                for row in size_rows
                if row["sampler"] == kind and row["dataset_samples"] == size
            ]
            for kind in SAMPLERS
        ],
    )
    largest = max(size_rows, key=lambda row: (row["state_bytes"], row["dataset_samples"]))
    parts_table = table(
        ["part of the entry", f"tensor data ({largest['sampler']}, {largest['dataset_samples']:,} samples)"],
        [[label, f"{largest['tensor_bytes_by_part'][part]:,} B"] for part, label in STATE_PARTS.items()],
    )
    memory_table = table(
        ["action (10^7 samples, RandomSampler)", "peak RSS growth", "tracemalloc peak"],
        [
            [
                label,
                _mb(memory_results[name]["rss_growth_bytes"]),
                _mb(memory_results[name]["tracemalloc_peak_bytes"]) if name in TRACED else "not traced (as fresh fit)",
            ]
            for name, label in ACTIONS.items()
        ],
    )
    smallest = min(row["state_bytes"] for row in size_rows)
    return (
        '**Checkpoint size.** Bytes of `checkpoint["callbacks"]["MidEpochResume"]` serialized alone with '
        "`torch.save`, from a real checkpoint written after the first batch of an epoch (batch size 32): from "
        f"{smallest:,} to {largest['state_bytes']:,} B, the same for every dataset size.\n\n"
        + size_table
        + "\n\nAlmost all of it is random-number-generator state: torch's CPU generator state is 5,056 B, numpy's "
        "and python's Mersenne Twisters about 2.5 KB each; the rest is a few facts per loader and the archive's "
        "own overhead. A loader with its own generator (the `RandomSampler` here) adds that generator's state, "
        "twice (where its pass started, and now).\n\n"
        + parts_table
        + "\n\n**Memory during a resume.** Each action in a fresh process, one run each (memory is far less noisy "
        "than time). Peak RSS growth: the process's resident-set high-water mark during the action (reset just "
        "before it) minus its resident set just before; it includes torch's tensors, such as the 80 MB int64 "
        "permutation of 10^7 indices, which tracemalloc does not see. tracemalloc peak: Python allocations only, "
        "such as the list of remaining indices the sampler iterates over (about 36 bytes per index); tracing 10^7 "
        "allocations takes about 20 s, so it is not repeated for the two actions that iterate exactly as the fresh "
        "fit does. The sampler alone is what torch's `RandomSampler` allocates at any epoch start.\n\n" + memory_table
    )


def run() -> dict[str, Any]:
    """Both measurements; returns the markdown section and the JSON results."""
    with tempfile.TemporaryDirectory() as directory:
        workdir = Path(directory)
        size_rows = sizes(workdir)
        memory_results = memory(workdir)
    return {
        "markdown": {"size_memory": markdown(size_rows, memory_results)},
        "json": {"state_size": size_rows, "memory": memory_results},
        "plots": [],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", choices=list(ACTIONS), help="measure one action in this process (internal)")
    parser.add_argument("--mode", choices=("rss", "tracemalloc"), default="rss")
    parser.add_argument("--checkpoints", default="{}", help="JSON {position: checkpoint path} (internal)")
    args = parser.parse_args()
    if args.child:
        start = time.perf_counter()
        result = child(args.child, args.mode, json.loads(args.checkpoints))
        print(json.dumps({**result, "child_seconds": time.perf_counter() - start}))
        return
    from _common import setup_process

    setup_process()
    print(run()["markdown"]["size_memory"])


if __name__ == "__main__":
    main()
