"""The release artifacts' tests run only from ``make dist-check``, which builds dist/ first and names it in
``MIDEPOCH_DIST_DIR``; elsewhere (``make test``, a packager's test run from the sdist) this folder is not collected."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

DIST_DIR_VARIABLE = "MIDEPOCH_DIST_DIR"

collect_ignore_glob = [] if os.environ.get(DIST_DIR_VARIABLE) else ["*"]


@pytest.fixture(scope="session")
def dist_dir() -> Path:
    directory = Path(os.environ[DIST_DIR_VARIABLE]).resolve()
    if not directory.is_dir():
        pytest.fail(f"{DIST_DIR_VARIABLE}={directory}: no such directory; `make dist-check` builds it")
    return directory
