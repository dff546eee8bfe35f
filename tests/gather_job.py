"""One rank of a real gloo process group that gathers a state with ``_saving.gather``, as a script.

``python tests/gather_job.py OUT RANK WORLD_SIZE`` builds this rank's state (tensors of several dtypes, shapes and
layouts, seeded by the rank), gathers it to rank 0 and writes ``OUT/rank{RANK}.pt`` with the state it sent and the
list ``gather`` returned.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from lightning_midepoch._saving import gather


def rank_state(rank: int) -> dict[str, Any]:
    """A state with what a rank's part of the checkpoint holds, each value depending on the rank."""
    generator = torch.Generator().manual_seed(100 + rank)
    weight = torch.randn(5, 7, generator=generator)
    return {
        "rng": {
            "torch": torch.get_rng_state(),  # a uint8 tensor
            "numpy": ("MT19937", [rank, 2, 3], 624, 0, 0.0),
            "python": (3, tuple(range(rank, rank + 5)), None),
        },
        "passes": [{"epoch": rank, "index": 0, "at_iter": {"global": {}, "objects": {}}, "at_first_next": None}],
        "generators": [None, {"loader.generator": torch.Generator().manual_seed(rank).get_state()}],
        "dataset_states": [None, "text", 1.5, True],
        "grads": {
            "weight": weight,
            "bfloat16": torch.randn(3, 4, generator=generator).to(torch.bfloat16),
            "float64": torch.randn(2, generator=generator, dtype=torch.float64),
            "int64": torch.randint(-(2**40), 2**40, (6,), generator=generator),
            "bool": torch.rand(9, generator=generator) > 0.5,
            "scalar": torch.tensor(rank + 0.25),
            "empty": torch.empty(0, 3),
            "transposed": weight.t(),  # not contiguous
            "nan": torch.tensor([float("nan"), -0.0, float("inf")]),
        },
    }


def main() -> None:
    out, rank, world_size = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    store = torch.distributed.FileStore(str(out / "store"), world_size)
    torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    state = rank_state(rank)
    gathered = gather(state, rank, world_size, own_only=False)
    torch.save({"sent": state, "gathered": gathered}, out / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
