"""One behaviour, two deliveries: a mid-epoch checkpoint written by one delivery, resumed by the other.

Neither delivery reads the other's state: the patched Lightning keeps its own in the fit loop's state
(``train_order``), the package in its callback's (``MidEpochResume``). A checkpoint of the other delivery is resumed
as one of stock Lightning is. The package continues an order fixed without random states (``shuffle=False``, a
``DistributedSampler``) with a warning that the random states were not saved; the patched Lightning draws every order
anew, with a warning saying so (it keeps one mechanism: the order it recorded itself). `make upstream-check` writes
the checkpoints with each delivery (write_checkpoints.py) into
``MIDEPOCH_CROSS_CHECKPOINTS`` and runs this module with the other one:

- ``MIDEPOCH_DELIVERY=lightning`` (.venv-upstream): the package's checkpoints (``callback/``) on the patched Lightning;
- the default delivery (.venv: stock Lightning and the package): the patched Lightning's (``lightning/``).
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from harness import DELIVERY, run

VARIABLE = "MIDEPOCH_CROSS_CHECKPOINTS"
#: the delivery that wrote the checkpoints this delivery resumes
WRITER = "callback" if DELIVERY == "lightning" else "lightning"
#: per configuration: the warning the resume gives, and whether the rest of the epoch is the same batches
EXPECTED = {
    "lightning": {  # the patched Lightning resuming the package's checkpoint: no order of its own, a new one drawn
        "sequential": ("it does not hold the order of that epoch", False),
        "shuffle": ("it does not hold the order of that epoch", False),
    },
    "callback": {  # the package on stock Lightning resuming the patched Lightning's checkpoint
        "sequential": ("no MidEpochResume state", True),
        "shuffle": ("cannot be recovered", False),
    },
}


def _write_checkpoints() -> ModuleType:
    """tests/upstream/write_checkpoints.py (beside this file)."""
    path = Path(__file__).with_name("write_checkpoints.py")
    spec = importlib.util.spec_from_file_location("upstream_write_checkpoints", path)
    assert spec is not None, path
    assert spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _written(name: str) -> tuple[Path, dict[str, Any]]:
    folder = os.environ.get(VARIABLE)
    if not folder:
        pytest.fail(f"{VARIABLE} is not set: run this module through `make upstream-check` (it writes the checkpoints)")
    target = Path(folder) / WRITER / name
    return target / "crash.ckpt", torch.load(target / "runs.pt", weights_only=False)


@pytest.mark.parametrize("name", ["sequential", "shuffle"])
def test_a_checkpoint_of_the_other_delivery_resumes_as_a_stock_one(name, tmp_path):
    module = _write_checkpoints()
    config, crash = module.CONFIGS[name], module.CRASH
    ckpt, runs = _written(name)
    # what the other delivery wrote is what this one would have: the runs up to the checkpoint are the same
    assert runs["full"] == run(config, tmp_path / "full").seen
    message, exact = EXPECTED[DELIVERY][name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = run(config, tmp_path / "resumed", ckpt_path=ckpt, seed=2)
    assert any(message in str(warning.message) for warning in caught), [str(w.message) for w in caught]
    done = len(runs["interrupted"])
    if exact:
        assert runs["interrupted"] + resumed.seen == runs["full"]
    else:  # the rest of the epoch: the right number of batches, on a newly drawn order
        remaining = [batch_idx for epoch, batch_idx, _ in resumed.seen if epoch == crash.epoch]
        assert remaining == list(range(crash.batch + 1, config.batches_per_epoch))
        assert resumed.seen != runs["full"][done:]
