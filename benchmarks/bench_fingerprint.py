"""Benchmark 6: what the resume's self-check costs (the fingerprint of the last batch trained).

A checkpoint written after a finished batch fingerprints the batch the training loop was last handed, and the resumed
run fingerprints that batch loaded again: once per checkpoint and once per resume, never per step. Timed here:

* **One fingerprint** of an image batch of 64 x 3 x 224 x 224 float32 (37 MiB) with its 64 labels, and of the demo's
  batch of 32 samples of 16 floats, against baselines measured in the same run on the same batch: copying it once
  (``clone``), hashing its bytes once with SHA-256 alone, and ``torch.save`` of it into memory (what writing that much
  data into a checkpoint costs).

Times are wall-clock medians of single calls (the work is one thread's: SHA-256 and memory copies). Run alone:
``python benchmarks/bench_fingerprint.py``.
"""

from __future__ import annotations

import hashlib
import io
import time
from collections.abc import Callable
from typing import Any

import torch
from _common import RESULTS_DIR, median, progress, table

from lightning_midepoch._batch_check import fingerprint

REPEATS = 9
PLOT = "fingerprint.png"


def _timed(action: Callable[[], Any], repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return median(times)


def _save(batch: Any) -> None:
    torch.save(batch, io.BytesIO())


def measure(name: str, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, Any]:
    images = batch[0]
    data = images.reshape(-1).view(torch.uint8).numpy()
    return {
        "batch": name,
        "bytes": images.numel() * images.element_size() + batch[1].numel() * batch[1].element_size(),
        "fingerprint_s": _timed(lambda: fingerprint(batch)),
        "clone_s": _timed(lambda: [part.clone() for part in batch]),
        "sha256_s": _timed(lambda: hashlib.sha256(data).digest()),
        "torch_save_s": _timed(lambda: _save(batch)),
    }


def _plot(rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    row = rows[0]
    labels = ["fingerprint", "clone", "SHA-256 of the bytes", "torch.save to memory"]
    values = [row[key] * 1e3 for key in ("fingerprint_s", "clone_s", "sha256_s", "torch_save_s")]
    figure, axis = plt.subplots(figsize=(6, 3))
    axis.barh(labels, values, color=["tab:blue", "tab:gray", "tab:gray", "tab:gray"])
    axis.set_xlabel("ms per call (median)")
    axis.set_title(f"{row['batch']}: once per checkpoint and per resume")
    figure.tight_layout()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    figure.savefig(RESULTS_DIR / PLOT, dpi=100)
    plt.close(figure)


def run() -> dict[str, Any]:
    progress("fingerprint: one fingerprint of an image batch and of the demo's batch, and baselines")
    generator = torch.Generator().manual_seed(0)
    images = (torch.rand(64, 3, 224, 224, generator=generator), torch.randint(1000, (64,), generator=generator))
    demo = (torch.rand(32, 16, generator=generator), torch.arange(32))
    rows = [measure("64 x 3 x 224 x 224 float32 + 64 labels", images), measure("32 x 16 float32 + 32 ids", demo)]
    _plot(rows)
    markdown = table(
        ["batch", "bytes", "fingerprint", "clone (a copy)", "SHA-256 of the bytes", "torch.save to memory", "ratio"],
        [
            [
                row["batch"],
                f"{row['bytes']:,}",
                f"{row['fingerprint_s'] * 1e3:.2f} ms",
                f"{row['clone_s'] * 1e3:.2f} ms",
                f"{row['sha256_s'] * 1e3:.2f} ms",
                f"{row['torch_save_s'] * 1e3:.2f} ms",
                f"{row['fingerprint_s'] / row['torch_save_s']:.2f}x torch.save",
            ]
            for row in rows
        ],
    )
    return {"json": {"fingerprint": rows}, "markdown": {"fingerprint": markdown}}


if __name__ == "__main__":
    print(run()["markdown"]["fingerprint"])
