"""Write mid-epoch checkpoints with one delivery of the feature, for the other to resume (cross-delivery checks).

``PYTHONPATH=tests python tests/upstream/write_checkpoints.py DIR`` runs, for each configuration of :data:`CONFIGS`,
the uninterrupted run and a run that writes a checkpoint after batch 3 of epoch 1 and stops, and writes into
``DIR/NAME/`` the checkpoint (``crash.ckpt``) and what both runs trained (``runs.pt``). The delivery is the
environment's (``MIDEPOCH_DELIVERY``): in .venv the MidEpochResume callback on stock Lightning writes them; in
.venv-upstream (``MIDEPOCH_DELIVERY=lightning``) the patched Lightning alone does. test_deliveries.py resumes them
with the other delivery.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import torch

from harness import Config, CrashPoint, checkpoint_path, run

#: name -> configuration: an order fixed without random states, and a shuffled one
CONFIGS = {"sequential": Config(loader="sequential"), "shuffle": Config(loader="shuffle")}
CRASH = CrashPoint("train_batch_end", epoch=1, batch=3)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    out = parser.parse_args(argv).out
    for name, config in CONFIGS.items():
        target = out / name
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as scratch, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            full = run(config, Path(scratch) / "full")
            interrupted = run(config, Path(scratch) / "interrupted", crash=CRASH)
            assert interrupted.crashed, name
            shutil.copy(checkpoint_path(Path(scratch) / "interrupted", CRASH), target / "crash.ckpt")
        torch.save({"full": full.seen, "interrupted": interrupted.seen}, target / "runs.pt")
        print(f"{name}: {target / 'crash.ckpt'}")


if __name__ == "__main__":
    main(sys.argv[1:])
