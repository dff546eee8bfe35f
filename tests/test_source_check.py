"""The fingerprints of Lightning's stock methods: the check computes what tools/fingerprints.py records."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import zipfile
from pathlib import Path
from typing import Any

import lightning
import pytest

from lightning_midepoch import _fingerprints, _source_check

ROOT = Path(__file__).resolve().parents[1]

PACKAGES = ("lightning.pytorch", "pytorch_lightning")


@pytest.mark.parametrize("package", PACKAGES)
def test_installed_stock_methods_are_the_checked_ones(package):
    assert _source_check.changed_methods(package) == []


@pytest.mark.parametrize("package", PACKAGES)
@pytest.mark.parametrize("path", _source_check.CHECKED_METHODS)
def test_a_method_fingerprints_alike_imported_and_read_from_its_file(package, path):
    """What the check computes from the live class is what tools/fingerprints.py computes from a release's wheel."""
    module_name, qualname = path.split(":")
    module = importlib.import_module(f"{package}.{module_name}")
    assert _source_check.live_fingerprint(module, qualname) == _source_check.source_fingerprint(
        inspect.getsource(module), qualname
    )


def test_every_checked_method_has_recorded_fingerprints():
    """The checked methods and the generated fingerprints agree (re-run tools/fingerprints.py after a change)."""
    assert list(_fingerprints.FINGERPRINTS) == list(_source_check.CHECKED_METHODS)


def test_the_tool_records_a_release_from_its_wheel(tmp_path):
    """tools/fingerprints.py over a wheel made of the installed release's files records its fingerprints."""
    tool = _load_tool()
    wheel = tmp_path / f"lightning-{lightning.__version__}-py3-none-any.whl"
    root = Path(lightning.__file__).parent
    with zipfile.ZipFile(wheel, "w") as archive:
        for path in {path.split(":")[0] for path in _source_check.CHECKED_METHODS}:
            relative = Path("pytorch", *path.split(".")).with_suffix(".py")
            archive.write(root / relative, f"lightning/{relative.as_posix()}")
    older = tmp_path / "lightning-2.4.0-py3-none-any.whl"  # outside the range: skipped
    older.write_bytes(b"")
    output = tmp_path / "fingerprints.py"
    assert tool.main([str(wheel), str(older), "--output", str(output)]) == 0
    recorded: dict[str, object] = {}
    exec(output.read_text(), recorded)
    assert recorded["CHECKED"] == f"checked: {lightning.__version__}"
    for path in _source_check.CHECKED_METHODS:
        module_name, qualname = path.split(":")
        live = _source_check.live_fingerprint(importlib.import_module(f"lightning.pytorch.{module_name}"), qualname)
        assert recorded["FINGERPRINTS"][path] == {live: lightning.__version__}  # type: ignore[index]


def _load_tool() -> Any:
    spec = importlib.util.spec_from_file_location("fingerprints_tool", ROOT / "tools" / "fingerprints.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
