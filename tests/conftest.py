from __future__ import annotations

import importlib
import logging
import os
import random
from collections.abc import Sequence
from types import ModuleType
from typing import Any

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


# ---------------------------------------------------------------- optional test dependencies
#: set by `make test`, whose virtual environment installs every data library the tests use: a missing one fails
REQUIRE_TEST_DEPS_VARIABLE = "MIDEPOCH_REQUIRE_TEST_DEPS"
#: how each library that `make test` installs gets there (its top-level module -> the install command)
INSTALLED_BY_MAKE_TEST = {
    "datasets": "pip install -r requirements/ci.txt",
    "torchdata": "pip install -r requirements/ci.txt",
    "litdata": "pip install --no-deps -r requirements/ci-no-deps.txt",
}


def require(module_name: str) -> ModuleType:
    """Import ``module_name`` for a test that needs it; without it, skip the test, or fail it under `make test`.

    `make test` installs every data library the tests use (requirements/ci.txt, ci-no-deps.txt) and sets
    ``MIDEPOCH_REQUIRE_TEST_DEPS=1``: there a missing library is a failure, never a skip that nobody reads. Elsewhere
    (`make compat`, whose environment lacks some of them, or a packager's run) the test is skipped as with
    ``pytest.importorskip``.
    """
    __tracebackhide__ = True  # a skip or failure is reported at the test's line that called this
    if os.environ.get(REQUIRE_TEST_DEPS_VARIABLE) != "1":
        return pytest.importorskip(module_name)
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        reason = f"{type(error).__name__}: {error}"
    top = module_name.partition(".")[0]
    install = INSTALLED_BY_MAKE_TEST.get(top, "pip install -r requirements/ci.txt")
    pytest.fail(
        f"{module_name} cannot be imported ({reason}). `make test` installs {top} and requires it "
        f"({REQUIRE_TEST_DEPS_VARIABLE}=1): run `make venv`, or `{install}` in this environment; "
        f"unset {REQUIRE_TEST_DEPS_VARIABLE} to skip such tests instead.",
        pytrace=False,
    )


# ---------------------------------------------------------------- the workers matrix's sample
#: how many `workers_matrix` cases to keep (the others deselected); unset or empty: every collected one
WORKERS_SAMPLE_VARIABLE = "MIDEPOCH_WORKERS_SAMPLE"
#: the seed that chooses them; unset: a random one, printed in the header
WORKERS_SEED_VARIABLE = "MIDEPOCH_WORKERS_SEED"
WORKERS_MATRIX_MARKER = "workers_matrix"


def sample_of_matrix(node_ids: Sequence[str], size: int, seed: int) -> list[str]:
    """The ``size`` node ids (all if fewer) that ``seed`` chooses, whatever the order ``node_ids`` come in.

    Every pytest-xdist worker collects the same ids and so keeps the same ones.
    """
    ordered = sorted(set(node_ids))
    return sorted(random.Random(seed).sample(ordered, min(size, len(ordered))))


def _workers_sample_size() -> int | None:
    return _sample_size(WORKERS_SAMPLE_VARIABLE)


def _workers_seed(config: pytest.Config) -> int:
    return _seed(config, WORKERS_SEED_VARIABLE, "midepoch_workers_seed")


_SAMPLE_KEY = pytest.StashKey[int | None]()
_SEED_KEY = pytest.StashKey[int]()

# ---------------------------------------------------------------- the corpus's sample (tests/corpus)
#: how many corpus projects `make test` runs (MIDEPOCH_CORPUS_SAMPLE=3), chosen by MIDEPOCH_CORPUS_SEED among those
#: not marked `corpus_pending`; unset or empty: every project (`make corpus`)
CORPUS_SAMPLE_VARIABLE = "MIDEPOCH_CORPUS_SAMPLE"
CORPUS_SEED_VARIABLE = "MIDEPOCH_CORPUS_SEED"
_CORPUS_SAMPLE_KEY = pytest.StashKey[int | None]()
_CORPUS_SEED_KEY = pytest.StashKey[int]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_SAMPLE_KEY] = _workers_sample_size()
    config.stash[_SEED_KEY] = _workers_seed(config)
    config.stash[_CORPUS_SAMPLE_KEY] = _sample_size(CORPUS_SAMPLE_VARIABLE)
    config.stash[_CORPUS_SEED_KEY] = _seed(config, CORPUS_SEED_VARIABLE, "midepoch_corpus_seed")


def _sample_size(variable: str) -> int | None:
    value = os.environ.get(variable, "").strip()
    if not value:
        return None
    if not value.isdigit():
        raise pytest.UsageError(f"{variable}={value!r}: expected a number of cases (0 or more)")
    return int(value)


def _seed(config: pytest.Config, variable: str, worker_key: str) -> int:
    """The controller's seed: the environment's, else a random one; an xdist worker gets its controller's."""
    worker_input: dict[str, Any] | None = getattr(config, "workerinput", None)
    if worker_input is not None and worker_key in worker_input:
        return int(worker_input[worker_key])
    value = os.environ.get(variable, "").strip()
    if not value:
        return int.from_bytes(os.urandom(4), "little")
    try:
        return int(value)
    except ValueError:
        raise pytest.UsageError(f"{variable}={value!r}: expected an integer seed") from None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist: each worker samples with the controller's seeds, drawn once."""
    node.workerinput["midepoch_workers_seed"] = node.config.stash[_SEED_KEY]
    node.workerinput["midepoch_corpus_seed"] = node.config.stash[_CORPUS_SEED_KEY]


def pytest_report_header(config: pytest.Config) -> list[str]:
    samples = (
        (
            _SAMPLE_KEY,
            _SEED_KEY,
            f"workers matrix sample: {{}} of the {WORKERS_MATRIX_MARKER} cases",
            WORKERS_SEED_VARIABLE,
            "make test-workers",
        ),
        (
            _CORPUS_SAMPLE_KEY,
            _CORPUS_SEED_KEY,
            "corpus sample: {} of the projects in tests/corpus/projects",
            CORPUS_SEED_VARIABLE,
            "make corpus",
        ),
    )
    lines = []
    for size_key, seed_key, what, variable, target in samples:
        size, seed = config.stash[size_key], config.stash[seed_key]
        if size is not None:
            lines.append(f"{what.format(size)}, seed {seed} ({variable}={seed} repeats it; `{target}` runs them all)")
    return lines


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``MIDEPOCH_WORKERS_SAMPLE=K``: keep K of the collected `workers_matrix` cases, deselect the others.

    With ``MIDEPOCH_CORPUS_SAMPLE=K``: keep K of the corpus's projects that are not `corpus_pending`.
    """
    _keep_corpus_sample(config, items)
    size = config.stash[_SAMPLE_KEY]
    if size is None:
        return
    matrix = [item.nodeid for item in items if item.get_closest_marker(WORKERS_MATRIX_MARKER) is not None]
    dropped = set(matrix) - set(sample_of_matrix(matrix, size, config.stash[_SEED_KEY]))
    if dropped:
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid in dropped])
        items[:] = [item for item in items if item.nodeid not in dropped]


def _keep_corpus_sample(config: pytest.Config, items: list[pytest.Item]) -> None:
    size = config.stash[_CORPUS_SAMPLE_KEY]
    if size is None:
        return
    projects = [item for item in items if item.get_closest_marker("corpus") is not None]
    eligible = [item.nodeid for item in projects if item.get_closest_marker("corpus_pending") is None]
    kept = set(sample_of_matrix(eligible, size, config.stash[_CORPUS_SEED_KEY]))
    dropped = [item for item in projects if item.nodeid not in kept]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]
