"""One rank of a real 2-rank gloo process group running the ranks' agreements, as a script.

``python tests/collectives_job.py OUT RANK WORLD_SIZE`` joins the group (a file store under ``OUT``), runs each
check below in turn on this rank (every rank runs them in the same order: each makes the collectives its code makes)
and writes what it observed to ``OUT/rank{RANK}.json``: ``tests/test_collectives.py`` compares the ranks.

- The batch check (``_batch_check.BatchCheck`` with ``outcomes_of_ranks`` through Lightning's ``DDPStrategy.reduce``,
  as a trainer's session calls it): a batch that differs on one rank is reported on every rank.
- The signals' agreement (``_preemption.SharedSignalCheck``, standing in for Lightning's SIGTERM exchange): a signal
  one rank received is served on every rank at the same point, once; a SIGTERM on one rank stops every rank; the
  exchange's tensor outlives the collective (gloo's worker thread must not be the one to free it).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.plugins.environments import LightningEnvironment
from lightning.pytorch.strategies import DDPStrategy

from lightning_midepoch._batch_check import BatchCheck, Refetch, fingerprint, outcomes_of_ranks
from lightning_midepoch._preemption import SharedSignalCheck, SignalDeferral


def _strategy() -> DDPStrategy:
    return DDPStrategy(
        accelerator=CPUAccelerator(),
        parallel_devices=[torch.device("cpu")] * 2,
        cluster_environment=LightningEnvironment(),
        process_group_backend="gloo",
    )


def _refetch(saved_seed: int, loaded_seed: int) -> Refetch:
    """The entry of a batch drawn after ``saved_seed``, to be loaded again after ``loaded_seed``."""
    torch.manual_seed(saved_seed)
    saved = fingerprint({"x": torch.rand(2)})
    return Refetch(saved, lambda: torch.manual_seed(loaded_seed))


def batch_check(rank: int, world_size: int, verify: str, differs_on: int | None, entry_on: tuple[int, ...]) -> Any:
    """One resumed epoch's batch check on this rank: what it loaded again and what it reported."""
    strategy = _strategy()
    reports: list[tuple[str, bool]] = []
    check = BatchCheck(
        verify,  # type: ignore[arg-type]
        lambda message, fail: reports.append((message, fail)),
        lambda differs: outcomes_of_ranks(differs, rank, world_size, strategy),
    )
    fetched = []

    def fetch() -> dict[str, torch.Tensor]:
        fetched.append(1)
        return {"x": torch.rand(2)}

    entry = _refetch(3, 4 if rank == differs_on else 3) if rank in entry_on else None
    check.expect(entry, "batch_idx 4 of epoch 0")
    check.refetch(fetch)
    check.conclude()
    return {"fetched": len(fetched), "reports": reports}


def signal_served_on_every_rank(rank: int) -> Any:
    """Rank 1 receives SIGUSR2: every rank serves it at the next point; rank 0's own late delivery asks nothing."""
    calls: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))
    deferral = SignalDeferral()
    deferral.install({signal.SIGUSR2: signal.getsignal(signal.SIGUSR2)})
    deferral.exchanging = True
    trainer = SimpleNamespace(
        received_sigterm=False, num_val_batches=[], strategy=SimpleNamespace(root_device=torch.device("cpu"))
    )
    exchange = SharedSignalCheck(trainer, deferral)  # type: ignore[arg-type]
    if rank == 1:
        signal.raise_signal(signal.SIGUSR2)
    before = deferral.serve()  # under DDP only what the ranks agreed on is served
    exchange()
    served = deferral.serve()
    calls_at_point = len(calls)
    exchange()  # the next batch: nothing more is asked for
    again = deferral.serve()
    late = None
    if rank == 0:
        signal.raise_signal(signal.SIGUSR2)  # this rank's own delivery, a moment later: absorbed
        late = deferral.flags()
    exchange()
    after_late = deferral.serve()
    deferral.uninstall()
    signal.signal(signal.SIGUSR2, previous)
    return {
        "before": before,
        "served": served,
        "calls_at_point": calls_at_point,
        "again": again,
        "late_flags": late,
        "after_late": after_late,
        "calls": len(calls),
    }


def sigterm_stops_every_rank(rank: int) -> Any:
    """Rank 1's trainer was notified of SIGTERM: the exchange raises Lightning's SIGTERMException on every rank."""
    deferral = SignalDeferral()
    trainer = SimpleNamespace(
        received_sigterm=rank == 1, num_val_batches=[], strategy=SimpleNamespace(root_device=torch.device("cpu"))
    )
    try:
        SharedSignalCheck(trainer, deferral)()  # type: ignore[arg-type]
    except BaseException as error:  # (Lightning's SIGTERMException is a SystemExit)
        return type(error).__name__
    return None


def exchange_keeps_its_tensor(rank: int) -> Any:
    """Two exchanges over the real collective: whether each one's tensor is still referenced after the next."""
    all_reduce = torch.distributed.all_reduce
    exchanged: list[weakref.ref[torch.Tensor]] = []

    def watched(tensor: torch.Tensor, op: Any) -> Any:
        exchanged.append(weakref.ref(tensor))
        return all_reduce(tensor, op=op)

    trainer = SimpleNamespace(
        received_sigterm=False, num_val_batches=[], strategy=SimpleNamespace(root_device=torch.device("cpu"))
    )
    check = SharedSignalCheck(trainer, SignalDeferral())  # type: ignore[arg-type]
    torch.distributed.all_reduce = watched  # type: ignore[assignment]
    try:
        check()
        after_one = [ref() is not None for ref in exchanged]
        check()
        # gloo's worker thread lets go of the first collective in its own time: wait for it (bounded)
        deadline = time.monotonic() + 30
        while exchanged[0]() is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        after_two = [ref() is not None for ref in exchanged]
    finally:
        torch.distributed.all_reduce = all_reduce
    return {"after_one": after_one, "after_two": after_two}


def main() -> None:
    out, rank, world_size = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    os.environ["LOCAL_RANK"] = "0"  # one CPU device per process
    store = torch.distributed.FileStore(str(out / "store"), world_size)
    torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    observed = {
        "differs_on_rank_1": batch_check(rank, world_size, "raise", differs_on=1, entry_on=(0, 1)),
        "no_entry_on_rank_0": batch_check(rank, world_size, "warn", differs_on=1, entry_on=(1,)),
        "alike": batch_check(rank, world_size, "raise", differs_on=None, entry_on=(0, 1)),
        "signal": signal_served_on_every_rank(rank),
        "sigterm": sigterm_stops_every_rank(rank),
        "kept": exchange_keeps_its_tensor(rank),
    }
    (out / f"rank{rank}.json").write_text(json.dumps(observed))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
