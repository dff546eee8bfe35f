"""The ranks' agreements over a real 2-rank gloo process group (one job, ``tests/collectives_job.py``, for every test).

The batch check's outcome and the deferred signals are agreed on with the collectives a DDP run makes: here they run
in two processes, each making them as a trainer's session does, and each rank's observations are compared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

JOB = Path(__file__).resolve().parent / "collectives_job.py"
WORLD_SIZE = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """What each rank observed (both ranks run every check, in one process group)."""
    out = tmp_path_factory.mktemp("collectives")
    path = os.pathsep.join(filter(None, [str(JOB.parent), os.environ.get("PYTHONPATH")]))
    jobs = [
        subprocess.Popen(
            [sys.executable, str(JOB), str(out), str(rank), str(WORLD_SIZE)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONPATH": path},
        )
        for rank in range(WORLD_SIZE)
    ]
    logs = [job.communicate(timeout=240)[0] for job in jobs]
    assert [job.returncode for job in jobs] == [0] * WORLD_SIZE, "\n".join(log[-3000:] for log in logs)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(WORLD_SIZE)]


def test_a_batch_that_differs_on_one_rank_is_reported_on_every_rank_naming_it(ranks):
    """Rank 0's batch is right, rank 1's is not: rank 0 raises too, naming rank 1 (no rank waits for another)."""
    for observed in ranks:
        check = observed["differs_on_rank_1"]
        assert check["fetched"] == 1
        ((message, fail),) = check["reports"]
        assert fail
        assert "batch_idx 4 of epoch 0" in message
        assert "on rank(s) 1" in message


def test_a_rank_without_an_entry_loads_nothing_and_still_takes_part(ranks):
    rank_0, rank_1 = (observed["no_entry_on_rank_0"] for observed in ranks)
    assert (rank_0["fetched"], rank_1["fetched"]) == (0, 1)
    for check in (rank_0, rank_1):
        ((message, fail),) = check["reports"]
        assert not fail  # verify_batch="warn"
        assert "on rank(s) 1" in message


def test_batches_alike_on_every_rank_are_not_reported(ranks):
    assert [observed["alike"] for observed in ranks] == [{"fetched": 1, "reports": []}] * WORLD_SIZE


def test_a_signal_one_rank_received_is_served_on_every_rank_at_the_same_point_once(ranks):
    rank_0, rank_1 = (observed["signal"] for observed in ranks)
    for observed in (rank_0, rank_1):
        assert observed["before"] is False  # not before the ranks agreed
        assert (observed["served"], observed["calls_at_point"]) == (True, 1)
        assert observed["again"] is False
        assert observed["after_late"] is False
        assert observed["calls"] == 1
    assert rank_0["late_flags"] == [0]  # its own delivery, after every rank served it: absorbed


def test_a_sigterm_on_one_rank_stops_every_rank(ranks):
    assert [observed["sigterm"] for observed in ranks] == ["SIGTERMException"] * WORLD_SIZE


def test_the_ranks_exchange_keeps_its_tensor_after_the_collective(ranks):
    """gloo's worker thread lets go of a collective's tensors after the call returns. Were its reference the last, it
    would free the tensor there, which takes the GIL, and a thread that asks for the GIL while the interpreter exits
    is ended inside C++: the process aborts ("terminate called without an active exception", pytorch/pytorch#190489).
    The exchange's tensor stays referenced until the next exchange, and only the last one is kept."""
    for observed in ranks:
        assert observed["kept"] == {"after_one": [True], "after_two": [False, True]}
