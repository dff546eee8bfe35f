"""The supported-Lightning check, and the one place private Lightning names are used."""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import re
import warnings
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning
import lightning.pytorch as pl_new
import pytest

from conftest import require
from lightning_midepoch import _compat, _fingerprints
from lightning_midepoch._mixin import OWN_ATTRIBUTE_PREFIX


def _trainer() -> pl_new.Trainer:
    return pl_new.Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False)


def test_installed_lightning_is_supported():
    _compat.check_supported(_trainer())


@pytest.mark.parametrize("version", ["2.4.0", "2.7.0", "3.0.0"])
def test_an_unsupported_version_runs_with_a_warning_naming_it(version, monkeypatch):
    monkeypatch.delenv(_compat.UNVERIFIED_ENV, raising=False)
    monkeypatch.setattr(lightning, "__version__", version)
    with pytest.warns(UserWarning, match=rf"supports lightning >=2.5.0,<2.7.0, but lightning {version} is installed"):
        assert _compat.check_supported(_trainer()) == ""


def test_missing_private_names_are_listed(monkeypatch):
    trainer = _trainer()
    stripped = SimpleNamespace(**{k: v for k, v in vars(trainer.fit_loop).items() if k != "_combined_loader"})
    stripped.epoch_loop = SimpleNamespace()
    monkeypatch.setattr(type(trainer), "fit_loop", property(lambda self: stripped), raising=False)
    aside = _compat.check_supported(trainer)
    assert re.search(r"lack fit_loop\._combined_loader, .*epoch_loop\._batches_that_stepped", aside)


def test_namespace():
    import pytorch_lightning

    assert _compat.namespace(_trainer()) == "lightning"
    assert _compat.namespace(pytorch_lightning.Trainer(logger=False, enable_progress_bar=False)) == "pytorch_lightning"
    assert _compat.namespace(object()) == "lightning"


def test_warn_once_per_set():
    seen: set[str] = set()
    trainer = _trainer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _compat.warn("hello", trainer, seen)
        _compat.warn("hello", trainer, seen)
    assert [str(w.message) for w in caught] == ["hello"]


def test_stock_warning_suppressed_only_that_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _compat.stock_warning_suppressed():
            warnings.warn(
                _compat.STOCK_NOT_RESUMABLE_WARNING + " and your dataloader is not resumable.",
                UserWarning,
                stacklevel=1,
            )
            warnings.warn("something else", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["something else"]


def test_importing_the_package_changes_no_lightning_class():
    """Lightning's classes stay untouched at import: compared attribute by attribute in a fresh interpreter."""
    import subprocess
    import sys

    script = (
        "import lightning.pytorch as pl, pytorch_lightning as ptl\n"
        "from lightning.pytorch.loops import fit_loop, training_epoch_loop, fetchers\n"
        "from pytorch_lightning.loops import fit_loop as pfit\n"
        "classes = [fit_loop._FitLoop, training_epoch_loop._TrainingEpochLoop, fetchers._DataFetcher,\n"
        "           fetchers._PrefetchDataFetcher, pl.Trainer, pl.Callback, pfit._FitLoop, ptl.Trainer]\n"
        "import torch.utils.data as data\n"
        "classes += [data.DataLoader, data.BatchSampler, data.RandomSampler, data.DistributedSampler]\n"
        "before = [dict(vars(c)) for c in classes]\n"
        "import lightning_midepoch\n"
        "assert [dict(vars(c)) for c in classes] == before\n"
        "print('untouched')\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert completed.stdout.strip() == "untouched", completed.stderr[-2000:]


def test_check_fetcher_names_what_is_missing():
    from lightning.pytorch.loops.fetchers import _PrefetchDataFetcher
    from lightning.pytorch.utilities import CombinedLoader

    fetcher = _PrefetchDataFetcher()
    fetcher.setup(CombinedLoader([[1, 2]]))
    _compat.check_fetcher(fetcher)
    del fetcher.fetched
    fetcher._combined_loader._limits = None
    del fetcher._combined_loader._limits
    with pytest.raises(RuntimeError, match=r"train data fetcher lacks fetcher\.fetched, combined_loader\._limits"):
        _compat.check_fetcher(fetcher)


# ---------------------------------------------------------------------------------------------- private names
ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((Path(_compat.__file__).parent).glob("*.py"))
MIXINS = ("_ResumableFitLoop", "_ResumableTrainingEpochLoop", "_ResumableDataFetcher")


def _listed() -> set[str]:
    names = {name for attributes in _compat.REQUIRED_ATTRIBUTES.values() for name in attributes}
    for group in (
        _compat.REQUIRED_FETCHER_ATTRIBUTES,
        _compat.OPTIONAL_FETCHER_ATTRIBUTES,
        _compat.REQUIRED_COMBINED_LOADER_ATTRIBUTES,
        _compat.REQUIRED_MODULE_ATTRIBUTES,
        _compat.OTHER_PRIVATE_NAMES,
    ):
        names.update(group)
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and not name.startswith(OWN_ATTRIBUTE_PREFIX)


def _defined_and_used(tree: ast.Module) -> tuple[set[str], dict[str, int]]:
    """Private names the module defines (functions, classes, constants, what ``__init__`` sets) and those it reads
    as attributes, imports from other packages, or names in ``getattr``/``hasattr``/``vars()[...]`` (with a line)."""
    defined: set[str] = set()
    used: dict[str, int] = {}

    def visit(node: ast.AST, scope: str, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if scope in MIXINS:  # a mixin's private method overrides Lightning's
                used.setdefault(node.name, node.lineno)
            else:
                defined.add(node.name)
            inner = node.name if isinstance(node, ast.ClassDef) else scope
            for child in ast.iter_child_nodes(node):
                visit(child, inner, node.name if not isinstance(node, ast.ClassDef) else "")
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            if scope in MIXINS and not function:  # a mixin's class attribute (a property, say) overrides Lightning's
                used.setdefault(node.id, node.lineno)
            else:
                defined.add(node.id)
        elif isinstance(node, ast.Attribute):
            if isinstance(node.ctx, ast.Store) and function == "__init__" and scope not in MIXINS:
                defined.add(node.attr)
            else:
                used.setdefault(node.attr, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (node.module or "").startswith("lightning_midepoch"):
                    defined.add(alias.asname or alias.name)
                else:
                    used.setdefault(alias.name, node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _NAMED_BY_STRING:
            if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                used.setdefault(node.args[1].value, node.lineno)
        elif isinstance(node, ast.Subscript) and _is_namespace(node.value) and isinstance(node.slice, ast.Constant):
            used.setdefault(str(node.slice.value), node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, scope, function)

    visit(tree, "", "")
    return {name for name in defined if _private(name)}, {k: v for k, v in used.items() if _private(k)}


_NAMED_BY_STRING = ("getattr", "hasattr", "setattr", "delattr")


def _is_namespace(node: ast.AST) -> bool:
    """``vars(obj)`` or ``obj.__dict__``: a subscript of it names an attribute."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id == "vars"
    return isinstance(node, ast.Attribute) and node.attr == "__dict__"


def _scan() -> tuple[set[str], dict[str, list[str]]]:
    trees = {path.name: ast.parse(path.read_text(encoding="utf-8")) for path in SOURCES}
    ours: set[str] = set()
    uses: dict[str, list[str]] = {}
    for name, tree in trees.items():
        defined, used = _defined_and_used(tree)
        ours |= defined
        for attribute, line in used.items():
            uses.setdefault(attribute, []).append(f"{name}:{line}")
    return ours, uses


def test_every_private_lightning_name_used_is_listed_in_compat():
    """A private name read from another package (Lightning, torch, Python) anywhere in src/ is listed in _compat."""
    ours, uses = _scan()
    unlisted = {name: where for name, where in uses.items() if name not in ours and name not in _listed()}
    assert not unlisted, f"private names used but not listed in _compat.py: {unlisted}"


def test_every_listed_private_name_is_used():
    """No stale entries: each private name _compat lists is read somewhere in src/ (a listing is not a use)."""
    _, uses = _scan()
    stale = sorted(name for name in _listed() if _private(name) and name not in uses)
    assert not stale, f"listed in _compat.py but not used: {stale}"


def test_the_scan_finds_a_private_lightning_name():
    """The scan itself: a read of a Lightning private attribute and a getattr by string are found; ours are not."""
    source = (
        "class Ours:\n"
        "    def __init__(self):\n"
        "        self._mine = 1\n"
        "    def _helper(self):\n"
        "        return self._mine\n"
        "def use(trainer):\n"
        "    trainer.fit_loop._some_private_thing\n"
        "    return getattr(trainer, '_another', None), vars(trainer)['_third']\n"
    )
    defined, used = _defined_and_used(ast.parse(source))
    assert {"_mine", "_helper"} <= defined
    assert {"_some_private_thing", "_another", "_third"} <= set(used) - defined


# ---------------------------------------------------------------------------------------------- stock methods
PACKAGES = ("lightning.pytorch", "pytorch_lightning")


@pytest.mark.parametrize("package", PACKAGES)
def test_installed_stock_methods_are_the_checked_ones(package):
    assert _compat.changed_methods(package) == []


@pytest.mark.parametrize("package", PACKAGES)
@pytest.mark.parametrize("path", _compat.CHECKED_METHODS)
def test_a_method_fingerprints_alike_imported_and_read_from_its_file(package, path):
    """What the check computes from the live class is what tools/fingerprints.py computes from a release's wheel."""
    module_name, qualname = path.split(":")
    module = importlib.import_module(f"{package}.{module_name}")
    assert _compat.live_fingerprint(module, qualname) == _compat.source_fingerprint(inspect.getsource(module), qualname)


def _changed_on_run_start(self, data_fetcher):
    """Like the stock method, plus one line: a release that changed it."""
    if self.trainer.current_epoch > 0 and not self.restarting:
        iter(data_fetcher)
    data_fetcher.fetched += self.batch_progress.current.ready + 1


def _replacements() -> dict[str, object]:
    namespace: dict[str, object] = {}
    exec("def on_run_start(self, data_fetcher):\n    pass\n", namespace)  # no source file to read
    return {
        "changed": _changed_on_run_start,
        "without source": namespace["on_run_start"],
        "not a function": functools.partial(_changed_on_run_start),
    }


@pytest.mark.parametrize("kind", ["changed", "without source", "not a function", "removed"])
def test_a_changed_stock_method_is_a_warning_naming_it(kind, monkeypatch):
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    monkeypatch.delenv(_compat.UNVERIFIED_ENV, raising=False)
    if kind == "removed":
        monkeypatch.delattr(_TrainingEpochLoop, "on_run_start")
    else:
        monkeypatch.setattr(_TrainingEpochLoop, "on_run_start", _replacements()[kind])
    with pytest.warns(UserWarning, match="has not been checked against") as warned:
        aside = _compat.check_supported(_trainer())
    # a method the overrides call that is gone altogether: the callback steps aside for the fit (its reason)
    assert ("epoch_loop.on_run_start" in aside) == (kind == "removed")
    assert aside == "" or kind == "removed"
    message = str(warned[0].message)
    assert f"has not been checked against lightning {lightning.__version__}" in message
    assert "`_TrainingEpochLoop.on_run_start` (lightning.pytorch.loops.training_epoch_loop) differs" in message
    assert "supported range lightning>=2.5.0,<2.7.0" in message
    assert f"pip install 'lightning>=2.5.0,<2.7.0'`, {_fingerprints.CHECKED}" in message
    assert "MidEpochResume runs anyway" in message


def test_every_changed_method_is_named(monkeypatch):
    from lightning.pytorch.loops.fetchers import _DataFetcher
    from lightning.pytorch.loops.fit_loop import _FitLoop

    monkeypatch.delenv(_compat.UNVERIFIED_ENV, raising=False)
    monkeypatch.setattr(_FitLoop, "setup_data", _changed_on_run_start)
    monkeypatch.setattr(_DataFetcher, "__iter__", _changed_on_run_start)
    with pytest.warns(UserWarning, match=r"its `_FitLoop.setup_data` \(.*\), `_DataFetcher.__iter__` \(.*\) differ "):
        _compat.check_supported(_trainer())


def test_an_unchecked_release_runs_with_a_warning_naming_what_differs(monkeypatch, tmp_path):
    """Issue 35's row of Lightning's next release: never refused; stock's run, and an exact resume, with a warning."""
    from lightning.pytorch.loops.fit_loop import _FitLoop

    from harness import Config, CrashPoint, assert_exact, interrupt_and_resume

    stock = _FitLoop.on_advance_end

    def on_advance_end(self: _FitLoop) -> None:  # the stock method in another release's words: it differs
        stock(self)

    monkeypatch.delenv(_compat.UNVERIFIED_ENV, raising=False)
    monkeypatch.setattr(_FitLoop, "on_advance_end", on_advance_end)
    with pytest.warns(UserWarning, match=r"`_FitLoop.on_advance_end` \(lightning.pytorch.loops.fit_loop\) differs"):
        # the uninterrupted run is compared with stock's, the resume with the uninterrupted run
        comparison = interrupt_and_resume(Config(max_epochs=2), CrashPoint("train_batch_end", 1, 3), tmp_path)
    assert_exact(comparison)


def test_a_trainer_without_a_name_the_overrides_use_is_left_to_lightning(monkeypatch, tmp_path):
    """The callback steps aside, with a warning: the fit is stock Lightning's, its resume too (with stock's warning)."""
    from harness import Config, CrashPoint, interrupt_and_resume

    monkeypatch.setitem(_compat.REQUIRED_ATTRIBUTES, "fit_loop", ("_no_such_attribute",))
    config = Config(max_epochs=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = interrupt_and_resume(config, CrashPoint("train_batch_end", 1, 3), tmp_path / "ours")
    stock = interrupt_and_resume(config, CrashPoint("train_batch_end", 1, 3), tmp_path / "stock", callback=False)
    messages = [str(warning.message) for warning in caught]
    aside = "MidEpochResume steps aside for this fit: the trainer's loops lack fit_loop._no_such"
    assert any(aside in message for message in messages)
    assert any("resuming from a checkpoint that ended before the epoch ended" in m for m in messages)
    assert ours.resumed.seen == stock.resumed.seen


@pytest.mark.parametrize("problem", ["changed method", "version"])
def test_the_note_turns_the_warning_into_information(problem, monkeypatch):
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    monkeypatch.setenv(_compat.UNVERIFIED_ENV, "1")
    if problem == "version":
        monkeypatch.setattr(lightning, "__version__", "2.7.0")
    else:
        monkeypatch.setattr(_TrainingEpochLoop, "on_run_start", _changed_on_run_start)
    told: list[str] = []
    monkeypatch.setattr(_compat, "info", lambda message, trainer: told.append(message))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _compat.check_supported(_trainer()) == ""
    assert len(told) == 1
    assert f"{_compat.UNVERIFIED_ENV}=1" in told[0]


def test_every_checked_method_has_recorded_fingerprints():
    """The checked methods and the generated fingerprints agree (re-run tools/fingerprints.py after a change)."""
    assert list(_fingerprints.FINGERPRINTS) == list(_compat.CHECKED_METHODS)


def test_the_tool_records_a_release_from_its_wheel(tmp_path):
    """tools/fingerprints.py over a wheel made of the installed release's files records its fingerprints."""
    tool = _load_tool()
    wheel = tmp_path / f"lightning-{lightning.__version__}-py3-none-any.whl"
    root = Path(lightning.__file__).parent
    with zipfile.ZipFile(wheel, "w") as archive:
        for path in {path.split(":")[0] for path in _compat.CHECKED_METHODS}:
            relative = Path("pytorch", *path.split(".")).with_suffix(".py")
            archive.write(root / relative, f"lightning/{relative.as_posix()}")
    older = tmp_path / "lightning-2.4.0-py3-none-any.whl"  # outside the range: skipped
    older.write_bytes(b"")
    output = tmp_path / "fingerprints.py"
    assert tool.main([str(wheel), str(older), "--output", str(output)]) == 0
    recorded: dict[str, object] = {}
    exec(output.read_text(), recorded)
    assert recorded["CHECKED"] == f"checked: {lightning.__version__}"
    for path in _compat.CHECKED_METHODS:
        module_name, qualname = path.split(":")
        live = _compat.live_fingerprint(importlib.import_module(f"lightning.pytorch.{module_name}"), qualname)
        assert recorded["FINGERPRINTS"][path] == {live: lightning.__version__}  # type: ignore[index]


def _load_tool() -> Any:
    spec = importlib.util.spec_from_file_location("fingerprints_tool", ROOT / "tools" / "fingerprints.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_unsaved_buffer_of_a_hugging_face_iterable_dataset():
    datasets = require("datasets")
    plain = datasets.Dataset.from_dict({"i": list(range(10))}).to_iterable_dataset(num_shards=2)
    assert _compat.unsaved_buffer(plain) is None
    assert _compat.unsaved_buffer(plain.shuffle(seed=1, buffer_size=4)) == "a shuffle buffer of 4 examples"
    mapped = plain.shuffle(seed=1, buffer_size=3).map(lambda row: {"j": row["i"] + 1})
    assert _compat.unsaved_buffer(mapped) == "a shuffle buffer of 3 examples"
    interleaved = datasets.interleave_datasets([plain, plain.shuffle(seed=1, buffer_size=5)])
    assert _compat.unsaved_buffer(interleaved) == "a shuffle buffer of 5 examples"


def test_a_missing_test_dependency_fails_under_make_test_and_is_skipped_elsewhere(monkeypatch):
    missing = "lightning_midepoch_no_such_library"
    monkeypatch.setenv("MIDEPOCH_REQUIRE_TEST_DEPS", "1")  # as `make test` sets it
    with pytest.raises(pytest.fail.Exception, match=rf"{missing} cannot be imported .* `make test` installs"):
        require(missing)
    assert require("json") is importlib.import_module("json")
    monkeypatch.delenv("MIDEPOCH_REQUIRE_TEST_DEPS")  # `make compat`: a library its environment lacks is skipped
    with pytest.raises(pytest.skip.Exception, match=missing):
        require(missing)


def test_a_torch_without_a_private_name_the_worker_recording_uses_is_left_to_lightning(monkeypatch):
    import lightning as L
    from torch.utils.data import dataloader

    monkeypatch.delattr(dataloader._MultiProcessingDataLoaderIter, "_process_data")
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert "lacks _MultiProcessingDataLoaderIter._process_data" in _compat.check_supported(trainer)
