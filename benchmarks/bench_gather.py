"""Host memory of a DDP checkpoint written inside a gradient accumulation group, with and without the callback.

Two CPU processes (gloo) train one ``nn.Linear(10_000, 10_000)`` (100M float32 parameters, 400 MB of gradients) with
``accumulate_grad_batches=2`` and call ``trainer.save_checkpoint`` after the first batch of a group, so that each rank's
part of the callback's state holds its partial gradients. Each rank reports its resident set just before the call and
its high-water mark during it (the kernel's ``VmHWM``, reset just before). The checkpoint is streamed by ``torch.save``
into a sink that only counts bytes, so the disk plays no part.

Variants: ``stock`` (no callback), ``callback`` (rank 0 receives one rank at a time, each tensor straight into its own
memory) and ``gather_object`` (the callback with its earlier exchange, reproduced below: every tensor copied to bytes
and sent through ``torch.distributed.gather_object``), for comparison.

Usage: ``make bench-gather``, or ``python benchmarks/bench_gather.py [--features 10000]`` in the project's
environment. Peak memory is that of the whole process; on a shared machine, run it alone.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins import CheckpointIO
from torch import nn
from torch.utils.data import DataLoader

from lightning_midepoch import MidEpochResume, _saving

VARIANTS = ("stock", "callback", "gather_object")
MIB = 2**20


def _status(field: str) -> int:
    """A field of /proc/self/status in bytes (VmRSS: resident now; VmHWM: the high-water mark)."""
    match = re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text())
    assert match, f"no {field} in /proc/self/status: this benchmark needs Linux"
    return int(match.group(1)) * 1024


class Wide(L.LightningModule):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.features = features
        self.layer = nn.Linear(features, features)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-6)

    def train_dataloader(self) -> DataLoader[torch.Tensor]:
        return DataLoader(torch.randn(16, self.features), batch_size=2)  # type: ignore[arg-type]


class _Sink:
    """A file that keeps nothing: counts what torch.save writes."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: Any) -> int:
        self.written += len(memoryview(data).cast("B"))
        return len(memoryview(data).cast("B"))

    def flush(self) -> None:
        pass


class CountingIO(CheckpointIO):
    """Streams the checkpoint through torch.save into a sink (Lightning calls it on rank 0 only)."""

    def __init__(self) -> None:
        self.written = 0

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        sink = _Sink()
        torch.save(checkpoint, sink)
        self.written = sink.written

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: Any = None) -> dict[str, Any]:
        raise NotImplementedError

    def remove_checkpoint(self, path: Any) -> None:
        pass


class SaveInsideGroup(L.Callback):
    """After the first batch of an accumulation group: measure ``trainer.save_checkpoint`` on this rank."""

    def __init__(self, out: Path, io: CountingIO) -> None:
        self.out, self.io = out, io

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.fit_loop.epoch_loop.batch_idx != 0:
            return
        grads = sum(p.grad.nbytes for p in pl_module.parameters() if p.grad is not None)
        gc.collect()
        before = _status("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident set
        trainer.save_checkpoint(self.out / "unused.ckpt")
        peak = _status("VmHWM")
        result = {"rank": trainer.global_rank, "before": before, "peak": peak, "grads": grads}
        result["checkpoint"] = self.io.written if trainer.global_rank == 0 else 0
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(result))


# ------------------------------------------------------------------------------------ the earlier exchange
@dataclass(frozen=True)
class _BytesTensor:
    data: bytes
    dtype: str
    shape: tuple[int, ...]


def _to_bytes(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        tensor = obj.detach().cpu().contiguous()
        raw = tensor.reshape(-1).view(torch.uint8) if tensor.numel() else tensor.new_empty(0, dtype=torch.uint8)
        return _BytesTensor(raw.numpy().tobytes(), str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))
    if isinstance(obj, dict):
        return {key: _to_bytes(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_bytes(value) for value in obj)
    return obj


def _from_bytes(obj: Any) -> Any:
    if isinstance(obj, _BytesTensor):
        dtype = getattr(torch, obj.dtype)
        if not obj.data:
            return torch.empty(obj.shape, dtype=dtype)
        return torch.frombuffer(bytearray(obj.data), dtype=torch.uint8).view(dtype).reshape(obj.shape)
    if isinstance(obj, dict):
        return {key: _from_bytes(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_from_bytes(value) for value in obj)
    return obj


def gather_object_exchange(
    rank_state: dict[str, Any], rank: int, world_size: int, own_only: bool
) -> list[dict[str, Any] | None]:
    """The earlier ``_saving.gather``: every tensor copied to bytes, pickled, gathered, unpickled, copied back."""
    states: list[dict[str, Any] | None] = [None] * world_size
    states[rank] = rank_state
    received: list[Any] | None = [None] * world_size if rank == 0 else None
    torch.distributed.gather_object(_to_bytes(rank_state), received, dst=0)
    if received is None:
        return states
    return [_from_bytes(state) for state in received]


# --------------------------------------------------------------------------------------------------- one job
def job(variant: str, out: Path, features: int) -> None:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    if variant == "gather_object":
        _saving.gather = gather_object_exchange  # type: ignore[assignment]
    L.seed_everything(0, verbose=False)
    io = CountingIO()
    callbacks: list[L.Callback] = [SaveInsideGroup(out, io)]
    if variant != "stock":
        callbacks.insert(0, MidEpochResume())
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        plugins=[io],
        accumulate_grad_batches=2,
        limit_train_batches=2,
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=callbacks,
        default_root_dir=out,
    )
    trainer.fit(Wide(features))


def measure(features: int) -> dict[str, list[dict[str, Any]]]:
    results: dict[str, list[dict[str, Any]]] = {}
    for variant in VARIANTS:
        with tempfile.TemporaryDirectory(prefix="bench-gather-") as directory:
            command = [sys.executable, __file__, "--job", variant, "--out", directory, "--features", str(features)]
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            completed = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
            if completed.returncode != 0:
                raise RuntimeError(f"{variant}: {completed.stdout[-2000:]}{completed.stderr[-3000:]}")
            results[variant] = [json.loads((Path(directory) / f"rank{r}.json").read_text()) for r in range(2)]
        print(f"measured {variant}", file=sys.stderr, flush=True)
    return results


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        "| variant | rank | RSS before (MiB) | peak during checkpoint (MiB) | delta (MiB) | gradients (MiB) |"
        " checkpoint written (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for variant, ranks in results.items():
        for row in ranks:
            cells = [row["before"], row["peak"], row["peak"] - row["before"], row["grads"], row["checkpoint"]]
            lines.append(f"| {variant} | {row['rank']} | " + " | ".join(f"{cell / MIB:,.0f}" for cell in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--features", type=int, default=10_000, help="the Linear layer's width (width**2 weights)")
    parser.add_argument("--job", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        job(args.job, args.out, args.features)
        return
    params = args.features**2 + args.features
    print(f"{params / 1e6:.1f}M float32 parameters, 2 ranks (gloo, CPU), checkpoint inside an accumulation group\n")
    print(table(measure(args.features)))


if __name__ == "__main__":
    main()
