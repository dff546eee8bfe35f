import logging
import os
import random

import numpy as np
import pytest
import torch
from hypothesis import settings

# derandomized: the same examples on every run; no example database written into the repository
settings.register_profile("ci", max_examples=30, deadline=None, derandomize=True, database=None, print_blob=True)
# `make fuzz`: many random examples (the seed is printed; `make fuzz FUZZ_SEED=...` runs the same ones again)
settings.register_profile(
    "fuzz",
    max_examples=int(os.getenv("MIDEPOCH_FUZZ_EXAMPLES", "1000")),
    deadline=None,
    derandomize=False,
    database=None,
    print_blob=True,
)
settings.load_profile(os.getenv("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _quiet_lightning() -> None:
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)


@pytest.fixture(autouse=True)
def _reset_global_rng():
    """Every test starts from the same process-wide random states and leaves none behind."""
    torch_state, numpy_state, python_state = torch.get_rng_state(), np.random.get_state(), random.getstate()
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    yield
    torch.set_rng_state(torch_state)
    np.random.set_state(numpy_state)
    random.setstate(python_state)
