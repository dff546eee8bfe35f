"""Benchmark 5: what serving pre-emption signals at consistent points costs a run that receives none.

``MidEpochResume`` notes the signals that ask for a checkpoint and serves them at the next consistent point (the end
of a training batch, of a validation run, of an epoch). Its cost per training step has two parts:

* **One process**: at every training batch end the callback's ``_serve_signals`` runs; with nothing pending it is a
  few attribute checks. Timed with ``timeit`` in the thread's CPU time, inside a real ``fit`` (in
  ``on_train_batch_end`` of a batch after the first, with the state ``fit`` gave the callback, world size 1), against
  an empty Python method of a ``Callback`` called the same way. Reported in ns per call, the median of interleaved
  repeats.
* **DDP**: at the start of every training batch Lightning broadcasts rank 0's SIGTERM flag
  (``_TrainingEpochLoop._broadcast_sigterm_tensor``, Lightning 2.5.2+: create, broadcast, read). On a trainer with
  the callback, ``SharedSignalCheck`` stands in for that exchange: the same moment, one ``all_reduce`` (MAX) that
  carries the SIGTERM flag, the validation's length and a flag per deferred signal. Inside a validation whose length
  every rank agreed on, each validation batch end exchanges the deferred signals' flags too (stock: nothing). Two CPU
  processes (gloo on 127.0.0.1) time, per iteration, nothing (the baseline: an empty call), Lightning's broadcast,
  the real ``SharedSignalCheck`` at a training batch's start, the same at a validation batch's end, and, for
  comparison, an all-reduce of one element; the order rotates from iteration to iteration. Wall clock, since a
  collective waits for the other rank. Reported: median and 95th percentile per call on each rank, and what the
  check adds per training step over Lightning's broadcast, which it replaces.

Run alone: ``python benchmarks/bench_preemption.py``.
"""

from __future__ import annotations

import json
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch
from _common import RESULTS_DIR, collect_garbage, make_trainer, median, progress, table
from bench_lockstep import REFERENCE_STEP_S
from bench_overhead import MLP, Setting

from lightning_midepoch import MidEpochResume
from lightning_midepoch._preemption import SharedSignalCheck, SignalDeferral, candidate_signals

#: One process: calls per timed repeat, and the repeats of each arm (interleaved)
CALLS_PER_REPEAT = 50_000
REPEATS = 15
#: The batch in whose ``on_train_batch_end`` the calls are timed (after the first: the state is the steady one)
TIMED_BATCH = 2
SERVE, EMPTY = "MidEpochResume._serve_signals(trainer)", "empty method of a Callback"
MICRO_ARMS = (EMPTY, SERVE)
#: DDP: processes, warm-up and timed iterations (each iteration times every arm once)
WORLD_SIZE = 2
WARMUP_ITERATIONS = 200
ITERATIONS = 2000
#: The deferred signals of the check timed: those of a fit with a SLURM ``requeue_signal`` (SIGHUP), and SIGTERM
AGREED_SIGNALS = candidate_signals(signal.SIGHUP)
NOTHING, BROADCAST, SHARED, VALIDATION, SINGLE = (
    "nothing (baseline)",
    "Lightning's broadcast (1 element), each training batch",
    f"SharedSignalCheck: all_reduce MAX ({3 + len(AGREED_SIGNALS)} x int64), each training batch, in its place",
    f"SharedSignalCheck at a validation batch end: all_reduce MAX ({len(AGREED_SIGNALS)} x int64)",
    "all_reduce MAX (1 x int64), for comparison",
)
DDP_ARMS = (NOTHING, BROADCAST, SHARED, VALIDATION, SINGLE)
#: The arms' names in the plot
SHORT = {
    NOTHING: "nothing",
    BROADCAST: "broadcast\n(Lightning)",
    SHARED: "training batch\n(ours)",
    VALIDATION: "validation batch\n(ours)",
    SINGLE: "all_reduce 1",
}
#: The validation of the stand-in trainer: its batches (a map-style loader, known before it starts)
VALIDATION_BATCHES = 6
PLOT = "preemption.png"


# ---------------------------------------------------------------------------------------------- one process, micro
class _Empty(L.Callback):
    """The baseline: a Callback method without arguments, as ``_serve_signals``, that does nothing."""

    def noop(self) -> None:
        return None


class _Timer(L.Callback):
    """In ``on_train_batch_end`` of batch :data:`TIMED_BATCH`: time both arms, interleaved, then stop the fit."""

    def __init__(self, ours: MidEpochResume) -> None:
        self.ours = ours
        self.result: dict[str, Any] | None = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.global_step < TIMED_BATCH:
            return
        deferral = self.ours._deferral
        if deferral is None:
            raise RuntimeError("MidEpochResume has no signal deferral in fit: nothing to time")
        timers = {
            SERVE: timeit.Timer("call()", globals={"call": self.ours._serve_signals}, timer=time.thread_time),
            EMPTY: timeit.Timer("call()", globals={"call": _Empty().noop}, timer=time.thread_time),
        }
        for arm_timer in timers.values():  # warm-up
            arm_timer.timeit(CALLS_PER_REPEAT // 10)
        per_call: dict[str, list[float]] = {arm: [] for arm in MICRO_ARMS}
        for _ in range(REPEATS):
            for arm in MICRO_ARMS:
                per_call[arm].append(timers[arm].timeit(CALLS_PER_REPEAT) / CALLS_PER_REPEAT)
        self.result = {
            "world_size": trainer.world_size,
            "deferred_signals": sorted(signal.Signals(signum).name for signum in deferral.handlers),
            "deferred_handlers": sorted({type(handler).__qualname__ for handler in deferral.handlers.values()}),
            "per_call_s": per_call,
        }
        trainer.should_stop = True


def micro() -> dict[str, Any]:
    """``_serve_signals`` with nothing pending, world size 1, timed inside a real fit."""
    collect_garbage()
    L.seed_everything(0, verbose=False)
    ours = MidEpochResume()
    timer = _Timer(ours)
    trainer = make_trainer([ours, timer], max_steps=TIMED_BATCH + 1)
    trainer.fit(MLP(Setting((8, 8), num_workers=0, measured_steps=TIMED_BATCH + 1)))
    if timer.result is None:
        raise RuntimeError("the fit ended before the timed batch")
    result = timer.result
    medians = {arm: median(values) for arm, values in result["per_call_s"].items()}
    result.update(
        calls_per_repeat=CALLS_PER_REPEAT,
        repeats=REPEATS,
        median_s=medians,
        added_s=medians[SERVE] - medians[EMPTY],
    )
    return result


# ------------------------------------------------------------------------------------------------- DDP, 2 processes
class _ValidatingModule(torch.nn.Module):
    """What ``validation_batches`` reads of the LightningModule: a ``validation_step`` that takes batches."""

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        return None


def _stand_in_trainer(device: torch.device) -> Any:
    """What ``SharedSignalCheck`` reads of the trainer at each training batch (a fit's, after its sanity check)."""
    from types import SimpleNamespace

    loader = torch.utils.data.DataLoader(list(range(VALIDATION_BATCHES)), batch_size=1)
    return SimpleNamespace(
        received_sigterm=False,
        strategy=SimpleNamespace(root_device=device),
        num_val_batches=[VALIDATION_BATCHES],
        reload_dataloaders_every_n_epochs=0,
        val_dataloaders=loader,
        lightning_module=_ValidatingModule(),
    )


def _ddp_arms() -> dict[str, Callable[[], Any]]:
    """Each arm's work at one point: the start of a training batch, or the end of a validation batch."""
    import torch.distributed as dist

    device = torch.device("cpu")
    deferral = SignalDeferral()
    deferral.install({signum: signal.default_int_handler for signum in AGREED_SIGNALS})  # (nothing is delivered)
    deferral.exchanging = True
    training = SharedSignalCheck(_stand_in_trainer(device), deferral)
    validating = SharedSignalCheck(_stand_in_trainer(device), deferral)
    validating.in_validation = True

    def nothing() -> None:
        return None

    def broadcast() -> None:  # Lightning's _TrainingEpochLoop._broadcast_sigterm_tensor, without its error handling
        tensor = torch.tensor([0], device=device)
        dist.broadcast(tensor, src=0)
        tensor.item()

    def single() -> None:  # the same collective on one element: what the tensor's length costs
        flags = torch.tensor([0], dtype=torch.int64, device=device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        flags.tolist()

    return {
        NOTHING: nothing,
        BROADCAST: broadcast,
        SHARED: training,
        VALIDATION: validating.validation_batch_end,
        SINGLE: single,
    }


def ddp_rank(rank: int, port: int, out: Path) -> None:
    """One rank of the DDP measurement (in a process of its own); writes every arm's per-call times to ``out``."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD_SIZE,
        timeout=timedelta(seconds=60),
    )
    try:
        arms = _ddp_arms()
        names = list(arms)
        for _ in range(WARMUP_ITERATIONS):
            for call in arms.values():
                call()
        collect_garbage()
        dist.barrier()
        times: dict[str, list[float]] = {name: [] for name in names}
        clock = time.perf_counter
        for iteration in range(ITERATIONS):
            shift = iteration % len(names)
            for name in names[shift:] + names[:shift]:  # the same order on every rank: the collectives match
                call = arms[name]
                start = clock()
                call()
                times[name].append(clock() - start)
        dist.barrier()
        out.write_text(json.dumps({"rank": rank, "backend": dist.get_backend(), "times_s": times}))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _quantile(values: list[float], q: float) -> float:
    return float(statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1])


def ddp() -> dict[str, Any]:
    """The DDP arms in :data:`WORLD_SIZE` fresh processes; per rank and arm, the median and 95th percentile."""
    with tempfile.TemporaryDirectory() as directory:
        port = _free_port()
        outs = [Path(directory) / f"rank{rank}.json" for rank in range(WORLD_SIZE)]
        processes = [
            subprocess.Popen(
                [sys.executable, __file__, "--ddp-rank", str(rank), str(port), str(out)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for rank, out in enumerate(outs)
        ]
        failures = []
        for rank, process in enumerate(processes):
            try:
                output, _ = process.communicate(timeout=180)
            except subprocess.TimeoutExpired:
                for other in processes:
                    other.kill()
                raise
            if process.returncode != 0:
                failures.append(f"rank {rank} exited with {process.returncode}:\n{output}")
        if failures:
            raise RuntimeError("\n".join(failures))
        ranks = [json.loads(out.read_text()) for out in outs]
    per_rank = []
    for entry in ranks:
        times = entry["times_s"]
        stats = {arm: {"median_s": median(times[arm]), "p95_s": _quantile(times[arm], 0.95)} for arm in DDP_ARMS}
        # per training step: the check in place of Lightning's broadcast; per validation batch: all of its exchange
        added = stats[SHARED]["median_s"] - stats[BROADCAST]["median_s"]
        per_rank.append(
            {
                "rank": entry["rank"],
                "backend": entry["backend"],
                "arms": stats,
                "training_added_s": added,
                "training_share_of_reference_step": added / REFERENCE_STEP_S,
                "validation_added_s": stats[VALIDATION]["median_s"] - stats[NOTHING]["median_s"],
                "times_s": times,
            }
        )
    return {
        "world_size": WORLD_SIZE,
        "warmup_iterations": WARMUP_ITERATIONS,
        "iterations": ITERATIONS,
        "deferred_signals": len(AGREED_SIGNALS),
        "reference_step_s": REFERENCE_STEP_S,
        "ranks": per_rank,
    }


# ---------------------------------------------------------------------------------------------------- the report
def _us(value: float) -> str:
    return f"{value * 1e6:.1f} µs"


def markdown(micro_result: dict[str, Any], ddp_result: dict[str, Any]) -> str:
    micro_rows = [
        [
            arm,
            f"{micro_result['median_s'][arm] * 1e9:.0f} ns",
            f"{min(micro_result['per_call_s'][arm]) * 1e9:.0f} … {max(micro_result['per_call_s'][arm]) * 1e9:.0f} ns",
        ]
        for arm in MICRO_ARMS
    ]
    ranks = ddp_result["ranks"]
    ddp_rows = []
    for arm in DDP_ARMS:
        row = [arm]
        for rank in ranks:
            stats = rank["arms"][arm]
            row += [_us(stats["median_s"]), _us(stats["p95_s"])]
        base = [rank["arms"][NOTHING]["median_s"] for rank in ranks]
        added = [rank["arms"][arm]["median_s"] - zero for rank, zero in zip(ranks, base, strict=True)]
        row += [
            " / ".join(f"{value * 1e6:+.1f}" for value in added) + " µs",
            " / ".join(f"{value / REFERENCE_STEP_S:.3%}" for value in added),
        ]
        ddp_rows.append(row)
    ddp_header = ["per step", *(f"rank {r['rank']}: {q}" for r in ranks for q in ("median", "p95"))]
    ddp_header += [
        "added to nothing, median (" + " / ".join(f"rank {r['rank']}" for r in ranks) + ")",
        f"share of a {REFERENCE_STEP_S * 1e3:.0f} ms step",
    ]
    deferred = ", ".join(micro_result["deferred_signals"]) or "none"
    handlers = ", ".join(micro_result["deferred_handlers"]) or "none"
    return (
        "One process: `_serve_signals` with nothing pending, timed inside a real `fit` (world size "
        f"{micro_result['world_size']}, in `on_train_batch_end` of batch {TIMED_BATCH}) with `timeit`, "
        f"{micro_result['calls_per_repeat']:,} calls per repeat, {micro_result['repeats']} interleaved repeats per "
        "arm, the thread's CPU time; the baseline is an empty method of a `Callback` called the same way. "
        f"The signals the fit's deferral held: {deferred} (handlers: {handlers}).\n\n"
        + table(["call", "median per call", "range over repeats"], micro_rows)
        + f"\n\n`_serve_signals` adds {micro_result['added_s'] * 1e9:+.0f} ns per call to an empty method "
        f"({micro_result['added_s'] / REFERENCE_STEP_S:.5%} of a {REFERENCE_STEP_S * 1e3:.0f} ms step).\n\n"
        f"DDP: {ddp_result['world_size']} CPU processes, gloo on 127.0.0.1, {ddp_result['warmup_iterations']} "
        f"warm-up and {ddp_result['iterations']:,} timed iterations of every arm, the order rotating from iteration "
        "to iteration, wall clock per call. Lightning's broadcast is what its epoch loop does at the start of every "
        "training batch under DDP (create a one-element tensor, broadcast it from rank 0, read it); on a trainer "
        "with the callback `SharedSignalCheck` takes its place: it reads the validation's length, creates an int64 "
        f"tensor (the SIGTERM flag, the length twice, a flag per deferred signal: {ddp_result['deferred_signals']}), "
        "all-reduces it (MAX) and reads it. At a validation batch end, inside a validation whose length every rank "
        "agreed on, it all-reduces the deferred signals' flags (stock Lightning exchanges nothing there). The last "
        "row, an all-reduce of a single element, shows what the tensor's length costs.\n\n"
        + table(ddp_header, ddp_rows)
        + "\n\n"
        + verdict(micro_result, ddp_result)
    )


def verdict(micro_result: dict[str, Any], ddp_result: dict[str, Any]) -> str:
    """One line for the headline."""
    ranks = ddp_result["ranks"]
    added = max(rank["training_added_s"] for rank in ranks)
    validation = max(rank["validation_added_s"] for rank in ranks)
    broadcast = max(rank["arms"][BROADCAST]["median_s"] - rank["arms"][NOTHING]["median_s"] for rank in ranks)
    return (
        f"Pre-emption: with nothing pending, `_serve_signals` takes {micro_result['median_s'][SERVE] * 1e9:.0f} ns per "
        f"call in one process (an empty method: {micro_result['median_s'][EMPTY] * 1e9:.0f} ns); under DDP "
        f"({ddp_result['world_size']} CPU processes, gloo) the ranks' signal check in place of Lightning's per-step "
        f"broadcast ({broadcast * 1e6:.1f} µs) adds {added * 1e6:+.1f} µs per training step "
        f"({added / REFERENCE_STEP_S:.3%} of a {REFERENCE_STEP_S * 1e3:.0f} ms step), and {validation * 1e6:.1f} µs "
        "per validation batch (the slower rank)."
    )


def plot(ddp_result: dict[str, Any], directory: Path) -> Path:
    """Box plots of the per-call times of every DDP arm, per rank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = directory / PLOT
    ranks = ddp_result["ranks"]
    figure, all_axes = plt.subplots(1, len(ranks), figsize=(11, 3.6), dpi=90, sharey=True)
    for axes, rank in zip(all_axes, ranks, strict=True):
        axes.boxplot(
            [[value * 1e6 for value in rank["times_s"][arm]] for arm in DDP_ARMS],
            whis=(5, 95),
            showfliers=False,
        )
        axes.set_xticks(range(1, len(DDP_ARMS) + 1), [SHORT[arm] for arm in DDP_ARMS], fontsize=8)
        axes.set_yscale("log")
        axes.set_ylabel("µs per call (whiskers: 5th, 95th percentile)", fontsize=8)
        axes.set_title(f"rank {rank['rank']}", fontsize=9)
        axes.grid(True, axis="y", alpha=0.3)
    figure.suptitle(
        f"Per-step collectives under DDP ({ddp_result['world_size']} CPU processes, gloo), "
        f"{ddp_result['iterations']:,} calls each",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path


def run() -> dict[str, Any]:
    progress("preemption: _serve_signals per call in one process")
    micro_result = micro()
    progress(f"preemption: per-step collectives under DDP, {WORLD_SIZE} gloo processes")
    ddp_result = ddp()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    plots = [plot(ddp_result, RESULTS_DIR)]
    for rank in ddp_result["ranks"]:  # every call's time is in the plot; results.json keeps the statistics
        del rank["times_s"]
    return {
        "markdown": {"preemption": markdown(micro_result, ddp_result)},
        "json": {"one_process": micro_result, "ddp": ddp_result},
        "plots": plots,
    }


if __name__ == "__main__":
    from _common import setup_process

    setup_process()
    if sys.argv[1:2] == ["--ddp-rank"]:  # one rank of :func:`ddp`
        ddp_rank(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
    else:
        print(run()["markdown"]["preemption"])
