"""Record uninterrupted runs, to compare stock Lightning with the patched one across environments.

A patched Lightning must leave a run that is never interrupted exactly as stock Lightning runs it, and one process
cannot hold both. So `make upstream-check` runs this script in the stock environment (.venv, default mode, no
callback attached): ``PYTHONPATH=tests python tests/upstream/record_run.py DIR`` writes one file per configuration
of :data:`CONFIGS` into DIR (``torch.save``); test_transparency.py then runs the same configurations on the patched
Lightning (.venv-upstream, ``MIDEPOCH_DELIVERY=lightning``) and requires every recorded value bitwise equal.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from harness import Config, _equal, run

#: name -> the configuration recorded (each trained once, uninterrupted, seed 1)
CONFIGS = {
    "shuffle-workers0": Config(loader="shuffle"),
    "shuffle-workers2": Config(loader="shuffle", num_workers=2),
    "combined-max_size_cycle": Config(combined="max_size_cycle"),
}


def record(config: Config, tmp_path: Path) -> dict[str, Any]:
    """What the uninterrupted run of ``config`` did and left: batches, validation, weights, optimizer, RNG states."""
    result = run(config, tmp_path, callback=False)
    assert not result.crashed
    return {
        "seen": result.seen,
        "validated": result.model.validated,
        "parameters": {name: value.detach().clone() for name, value in result.model.named_parameters()},
        "optimizer": result.trainer.optimizers[0].state_dict(),
        "global_step": result.trainer.global_step,
        "rng": result.rng,
    }


def differences(stock: dict[str, Any], patched: dict[str, Any]) -> list[str]:
    """The recorded values (by key; parameters by name) that are not bitwise equal."""
    found = [f"{key} (recorded on one side only)" for key in stock.keys() ^ patched.keys()]
    found += [key for key in (stock.keys() & patched.keys()) - {"parameters"} if not _equal(stock[key], patched[key])]
    stock_parameters, patched_parameters = stock.get("parameters", {}), patched.get("parameters", {})
    if stock_parameters.keys() != patched_parameters.keys():
        found.append(f"parameters (names: {sorted(stock_parameters)} vs {sorted(patched_parameters)})")
    else:
        found += [
            f"parameter {name}"
            for name in stock_parameters
            if not _equal(stock_parameters[name], patched_parameters[name])
        ]
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder to write NAME.pt into, one per configuration")
    args = parser.parse_args(argv)
    for logger in ("lightning", "lightning.pytorch", "lightning.fabric"):  # as tests/conftest.py: warnings only
        logging.getLogger(logger).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=FutureWarning)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        for name, config in CONFIGS.items():
            torch.save(record(config, Path(scratch) / name), args.out / f"{name}.pt")
            print(f"recorded {name} in {args.out / name}.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
