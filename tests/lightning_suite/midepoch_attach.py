"""A pytest plugin that attaches ``MidEpochResume()`` to every ``lightning.pytorch.Trainer`` of a test session.

Used by ``make lightning-suite`` to run Lightning's own tests with the callback attached: put this folder on
``PYTHONPATH`` and load it with ``-p midepoch_attach``. ``MIDEPOCH_SUITE_ATTACH=0`` loads it without attaching
anything (the stock baseline, in exactly the same environment and command).

``Trainer.__init__`` is wrapped when pytest is configured (so before any test module is collected): the trainer's
``callbacks`` argument, ``None``, a single callback or a list, gets a ``MidEpochResume()`` appended, unless it
already holds one. Everything else the test passes reaches Lightning unchanged. Importing this module does nothing.
"""

from __future__ import annotations

import functools
import os
from typing import Any

#: Set to ``0`` to run without attaching the callback.
ATTACH_ENV = "MIDEPOCH_SUITE_ATTACH"


def attach_enabled(environ: Any = None) -> bool:
    """Whether the callback is to be attached (``MIDEPOCH_SUITE_ATTACH`` unset or anything but ``0``/``false``/``no``).

    >>> [attach_enabled(environ) for environ in ({}, {ATTACH_ENV: "0"}, {ATTACH_ENV: "1"})]
    [True, False, True]
    """
    value = (os.environ if environ is None else environ).get(ATTACH_ENV, "1")
    return value.strip().lower() not in ("0", "false", "no", "off")


def with_callback(callbacks: Any, make: Any, kind: type) -> Any:
    """``callbacks`` (``None``, one callback or an iterable of them) with ``make()`` appended unless one of ``kind``.

    >>> with_callback(None, lambda: 1, int), with_callback("a", lambda: 1, int), with_callback(["a", 2], lambda: 1, int)
    ([1], ['a', 1], ['a', 2])
    """
    if callbacks is None:
        listed: list[Any] = []
    elif isinstance(callbacks, (list, tuple)):
        listed = list(callbacks)
    else:  # Lightning accepts a single Callback
        listed = [callbacks]
    if any(isinstance(callback, kind) for callback in listed):
        return listed
    return [*listed, make()]


def install() -> Any:
    """Wrap ``lightning.pytorch.Trainer.__init__``; returns the original, for :func:`uninstall`."""
    from lightning.pytorch import Trainer

    from lightning_midepoch import MidEpochResume

    original = Trainer.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["callbacks"] = with_callback(kwargs.get("callbacks"), MidEpochResume, MidEpochResume)
        original(self, *args, **kwargs)

    __init__._midepoch_original = original  # type: ignore[attr-defined]
    Trainer.__init__ = __init__  # type: ignore[method-assign]
    return original


def uninstall() -> None:
    """Give ``Trainer`` its own ``__init__`` back (a no-op where :func:`install` did not run)."""
    from lightning.pytorch import Trainer

    original = getattr(Trainer.__init__, "_midepoch_original", None)
    if original is not None:
        Trainer.__init__ = original  # type: ignore[method-assign]


def pytest_configure(config: Any) -> None:
    """Install the wrapper (unless ``MIDEPOCH_SUITE_ATTACH=0``) before any test module is imported."""
    if attach_enabled():
        install()


def pytest_unconfigure(config: Any) -> None:
    """Remove the wrapper."""
    uninstall()


def pytest_itemcollected(item: Any) -> None:
    """Record each test's node id in the junit XML report (``compare.py`` matches the two runs by it)."""
    item.user_properties.append(("nodeid", item.nodeid))


def pytest_report_header(config: Any) -> str:
    """Say in the header whether the callback is attached and which copy of the package is used."""
    import lightning_midepoch

    mode = "attached to every Trainer" if attach_enabled() else "NOT attached (stock baseline)"
    return f"lightning-midepoch: MidEpochResume {mode}; package {lightning_midepoch.__file__}"
