"""tests/upstream: the upstream patch series' checks (`make upstream-check`; see test_core.py).

With ``MIDEPOCH_DELIVERY=lightning`` the feature must come from the patched Lightning alone: an environment in which
lightning_midepoch can be imported is refused before any test runs. tests/conftest.py applies here too (its fixtures
reset the process-wide random states around every test); it needs pytest and hypothesis, not lightning_midepoch.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

if os.environ.get("MIDEPOCH_DELIVERY") == "lightning":
    # the comparisons are harness.assert_exact's: show what differs (only here, where nothing imported harness yet)
    pytest.register_assert_rewrite("harness")


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("MIDEPOCH_DELIVERY") == "lightning" and importlib.util.find_spec("lightning_midepoch"):
        raise pytest.UsageError(
            "MIDEPOCH_DELIVERY=lightning tests a patched Lightning without lightning_midepoch, but this environment "
            "can import it: run `make upstream-check` (its own .venv-upstream)"
        )
