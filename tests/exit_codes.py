"""How often an uninterrupted 2-process gloo job ends with a non-zero exit code, with the callback and without it.

``python tests/exit_codes.py --jobs 100 [--parallel 2]`` (``make exit-codes``, not in CI) runs ``tests/ddp_job.py`` as a
two-node job (one process per node, ``--num-nodes 2``, as ``tests/test_distributed.py`` does) ``--jobs`` times with
``MidEpochResume`` and as many times without it (``--stock``), alternating, ``--parallel`` jobs at once, and prints
each mode's count of jobs in which a rank did not exit 0, with the last lines of those ranks' output. Core dumps are
enabled for the ranks (written to their working directory, ``--out``): the last CI on record failed once on a rank 0
that aborted after ``fit`` returned ("terminate called without an active exception", issue 37), and a core is what
says whose thread that was.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_distributed import DATASET, _command, _free_port  # the two-node job as tests/test_distributed.py runs it

CONFIG = {"dataset_size": DATASET, "hook_draws": False}  # test_two_nodes_resume_exactly_...'s uninterrupted job


def _with_cores() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def one_job(stock: bool, out: Path) -> tuple[list[int], str]:
    """One uninterrupted two-node job: each rank's exit code, and the output of the ranks that did not exit 0."""
    folder = Path(tempfile.mkdtemp(dir=out))
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "PYTHONFAULTHANDLER": "1"}
    command = _command(folder, 1, CONFIG, stock=stock, extra=("--num-nodes", "2"))
    ranks = [
        subprocess.Popen(
            command,
            env={**env, "NODE_RANK": str(node)},
            cwd=folder,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=_with_cores,
        )
        for node in (0, 1)
    ]
    outputs = [rank.communicate(timeout=600)[0].decode(errors="replace") for rank in ranks]
    codes = [rank.returncode for rank in ranks]
    failed = "\n".join(
        f"[{folder} rank {rank}, exit {code}]\n{output[-1500:]}"
        for rank, (code, output) in enumerate(zip(codes, outputs, strict=True))
        if code
    )
    return codes, failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100, help="jobs per mode (with the callback, and stock)")
    parser.add_argument("--parallel", type=int, default=2, help="jobs at once (each is two processes)")
    parser.add_argument("--out", default="exit-codes-output")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    modes = [stock for _ in range(args.jobs) for stock in (False, True)]
    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(lambda stock: one_job(stock, out), modes))
    for stock in (False, True):
        mine = [result for mode, result in zip(modes, results, strict=True) if mode == stock]
        failed = [text for codes, text in mine if codes != [0, 0]]
        name = "stock" if stock else "with MidEpochResume"
        print(f"{name}: {len(failed)} of {len(mine)} jobs had a rank that did not exit 0")
        for text in failed:
            print(text)


if __name__ == "__main__":
    main()
