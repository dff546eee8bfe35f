"""A run that is never interrupted is the same on the patched Lightning as on stock Lightning, bit for bit.

`make upstream-check` records the runs of record_run.CONFIGS on stock Lightning (its own environment, .venv) into a
folder and passes it here as ``MIDEPOCH_STOCK_RECORDS``; this module runs them again on the patched Lightning and
compares the batches, validations, weights, optimizer state, step and process-wide random states. Without that
folder the comparison cannot run: with ``MIDEPOCH_DELIVERY=lightning`` that is a failure, never a skip. In the
default mode (the callback; stock Lightning in the process) the module is skipped: ``harness.assert_transparent``
checks the callback's transparency in-process.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest
import torch

from harness import DELIVERY

RECORDS_VARIABLE = "MIDEPOCH_STOCK_RECORDS"

if DELIVERY == "callback":
    pytest.skip(
        "transparency of the patched Lightning (MIDEPOCH_DELIVERY=lightning, `make upstream-check`); the callback's "
        "is checked in-process by harness.assert_transparent",
        allow_module_level=True,
    )


def _record_run() -> ModuleType:
    """tests/upstream/record_run.py (beside this file, not on sys.path)."""
    path = Path(__file__).with_name("record_run.py")
    spec = importlib.util.spec_from_file_location("upstream_record_run", path)
    assert spec is not None, path
    assert spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECORD_RUN = _record_run()


@pytest.mark.parametrize("name", list(RECORD_RUN.CONFIGS))
def test_uninterrupted_run_is_stock_lightnings(name, tmp_path):
    folder = os.environ.get(RECORDS_VARIABLE, "").strip()
    if not folder:
        pytest.fail(
            f"{RECORDS_VARIABLE} is not set: run this module through `make upstream-check`, which records the stock "
            "runs (tests/upstream/record_run.py in .venv) and passes their folder here",
            pytrace=False,
        )
    stock_file = Path(folder) / f"{name}.pt"
    if not stock_file.is_file():
        pytest.fail(f"{stock_file} is missing: `make upstream-check` records it (tests/upstream/record_run.py)")
    stock = torch.load(stock_file, weights_only=False)  # written by record_run.py in this same check
    patched = RECORD_RUN.record(RECORD_RUN.CONFIGS[name], tmp_path)
    differing = RECORD_RUN.differences(stock, patched)
    assert not differing, f"{name}: the patched Lightning's uninterrupted run differs from stock in {differing}"
