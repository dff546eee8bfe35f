"""What the project says about itself, read from its files (for tests/test_packaging.py and tests/packaging/)."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path
from typing import Any

from packaging.markers import Marker

ROOT = Path(__file__).resolve().parents[1]


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def version() -> str:
    """``__version__`` of src/lightning_midepoch/__about__.py, read without importing the package."""
    about = (ROOT / "src" / "lightning_midepoch" / "__about__.py").read_text(encoding="utf-8")
    match = re.search(r'^__version__ = "([^"]+)"$', about, re.MULTILINE)
    assert match, "src/lightning_midepoch/__about__.py sets no __version__"
    return match.group(1)


def readme_install_section() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"^## Install\n(.*?)(?=^## )", readme, re.MULTILINE | re.DOTALL)
    assert match, "README.md has no '## Install' section"
    return match.group(1)


def readme_extras() -> set[str]:
    """The extras the README's install section names, as in ``pip install "lightning-midepoch[lightning]"``."""
    names = re.findall(r"lightning-midepoch\[([^\]]+)\]", readme_install_section())
    return {extra.strip() for group in names for extra in group.split(",")}


def makefile_pythons() -> list[str]:
    """The Pythons ``make pythons`` tests (the Makefile's ``PYTHONS ?= ...``)."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    match = re.search(r"^PYTHONS \?= (.+)$", makefile, re.MULTILINE)
    assert match, "the Makefile sets no PYTHONS"
    return match.group(1).split()


def pinned(requirements_file: str, python: str | None = None) -> dict[str, str]:
    """``name -> version`` of the exact pins (``name==version``) in requirements/FILE, extras dropped.

    A pin with an environment marker (``numpy==2.2.6; python_version < "3.11"``) counts where its marker holds for
    ``python`` ("3.X"; the running interpreter's version by default), as pip reads it there.
    """
    python = python or f"{sys.version_info.major}.{sys.version_info.minor}"
    environment = {"python_version": python, "python_full_version": f"{python}.0"}
    pins = {}
    for line in (ROOT / "requirements" / requirements_file).read_text(encoding="utf-8").splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^\s#;]+)\s*(?:;([^#]*))?", line.strip())
        if match and (match.group(3) is None or Marker(match.group(3).strip()).evaluate(environment)):
            pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return pins
