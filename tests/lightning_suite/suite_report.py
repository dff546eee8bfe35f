"""A pytest plugin for ``make upstream-suite``: which ``lightning`` the run imports, and each test's node id.

Put this folder on ``PYTHONPATH`` and load it with ``-p suite_report``. The report's header names the ``lightning``
package the tests import (its version and file: the source tree's ``src/`` must come first on ``PYTHONPATH``), and
every test's node id is recorded in the junit XML report, where ``compare.py`` matches two runs by it (as
``midepoch_attach`` does for ``make lightning-suite``). Nothing else changes: no callback is attached.
"""

from __future__ import annotations

from typing import Any


def pytest_itemcollected(item: Any) -> None:
    """Record the test's node id in the junit XML report."""
    item.user_properties.append(("nodeid", item.nodeid))


def pytest_report_header(config: Any) -> str:
    """Name the ``lightning`` package that the tests import."""
    import lightning

    return f"upstream-suite: lightning {lightning.__version__} from {lightning.__file__}"
