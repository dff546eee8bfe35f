"""Every private name of another package used in src/ is listed in ``_private``, and each listed name exists.

The scan reads each module's syntax tree. A private attribute is the package's own only where it is read on
``self``/``cls`` of a class of ours that defines it, on one of our modules (``_compat.warn``), or on another object
when one of our classes defines it and no module of another package that src/ imports mentions it: a name both
define (``cloud_io._load`` beside ``_inspect``'s own ``_load``) is another package's, and must be listed.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

from conftest import require
from lightning_midepoch import _private
from lightning_midepoch._mixin import OWN_ATTRIBUTE_PREFIX

PACKAGE = Path(_private.__file__).parent
SOURCES = sorted(PACKAGE.glob("*.py"))
OWN_PREFIX = OWN_ATTRIBUTE_PREFIX  # the attributes the package gives the objects it mixes into
#: Bases of ours that stand for another package's class (the mixins: ``_FitLoopBase`` is ``_FitLoop`` to mypy).
_NEUTRAL_BASES = {"object", "Generic", "Protocol", "Exception", "RuntimeError", "ValueError", "NamedTuple"}
_NAMED_BY_STRING = ("getattr", "hasattr", "setattr", "delattr")


def _private_name(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and not name.startswith(OWN_PREFIX)


@dataclass
class _Module:
    """What one source module defines and uses."""

    name: str
    tree: ast.Module
    aliases: set[str] = field(default_factory=set)  # names bound to modules of this package
    foreign_imports: set[str] = field(default_factory=set)  # modules of other packages imported from
    classes: dict[str, tuple[set[str], list[str]]] = field(default_factory=dict)  # name -> (attributes, bases)


def _read(name: str, source: str) -> _Module:
    module = _Module(name, ast.parse(source))
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if source.startswith("lightning_midepoch") or node.level:
                module.aliases.update(alias.asname or alias.name for alias in node.names)
            else:
                module.foreign_imports.add(source)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("lightning_midepoch") and alias.asname:
                    module.aliases.add(alias.asname)
        elif isinstance(node, ast.ClassDef):
            module.classes[node.name] = (_class_attributes(node), [ast.unparse(base) for base in node.bases])
    return module


def _class_attributes(node: ast.ClassDef) -> set[str]:
    """What a class defines: its body's functions and assignments, and what its methods set on ``self``."""
    names: set[str] = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(item.name)
        elif isinstance(item, ast.Assign):
            names.update(target.id for target in item.targets if isinstance(target, ast.Name))
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
    for inner in ast.walk(node):
        if isinstance(inner, ast.Attribute) and isinstance(inner.ctx, ast.Store) and _is_self(inner.value):
            names.add(inner.attr)
    return names


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


@cache
def _mentioned_by(module_name: str) -> frozenset[str]:
    """The private identifiers a module of another package mentions anywhere in its source."""
    try:  # read from its file, without importing it (importing `datasets` alone takes seconds)
        spec = importlib.util.find_spec(module_name)
        source = Path(spec.origin).read_text(encoding="utf-8") if spec is not None and spec.origin else ""
    except (ImportError, OSError, ValueError):
        return frozenset()
    return frozenset(re.findall(r"\b_[A-Za-z]\w*", source))


def _listed_modules() -> set[str]:
    return {owner.split(":")[0] for owner in _private.PRIVATE_NAMES}


def _foreign_uses(modules: list[_Module], extra_foreign: frozenset[str] = frozenset()) -> dict[str, list[str]]:
    """Each private name of another package the modules use, and where (``module:line``)."""
    own_classes = {name: info for module in modules for name, info in module.classes.items()}
    own_attributes = {name for attributes, _ in own_classes.values() for name in attributes}
    foreign: set[str] = set(extra_foreign)
    for module in modules:
        for source in module.foreign_imports | _listed_modules():
            foreign |= _mentioned_by(source)
    uses: dict[str, list[str]] = {}

    def use(name: str, module: _Module, node: ast.AST) -> None:
        if _private_name(name):
            uses.setdefault(name, []).append(f"{module.name}:{getattr(node, 'lineno', 0)}")

    def class_defines(cls: str | None, name: str) -> bool:
        seen: set[str] = set()
        pending = [cls] if cls else []
        while pending:
            current = pending.pop()
            if current in seen or current not in own_classes:
                continue
            seen.add(current)
            attributes, bases = own_classes[current]
            if name in attributes:
                return True
            pending += bases
        return False

    def receiver(node: ast.AST, name: str, module: _Module, cls: str | None, at: ast.AST) -> None:
        if isinstance(node, ast.Name) and node.id in module.aliases:
            return  # one of our modules
        if _is_self(node):
            if not class_defines(cls, name):
                use(name, module, at)
            return
        if name not in own_attributes or name in foreign:
            use(name, module, at)

    def visit(node: ast.AST, module: _Module, cls: str | None) -> None:
        if isinstance(node, ast.ClassDef):
            _, bases = own_classes[node.name]
            stands_for_foreign = any(base not in own_classes and base not in _NEUTRAL_BASES for base in bases)
            for item in node.body:
                defined = []
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    defined = [item.name]
                elif isinstance(item, ast.Assign):
                    defined = [target.id for target in item.targets if isinstance(target, ast.Name)]
                # a private method of a class standing for another package's overrides that package's name
                for name in defined:
                    if stands_for_foreign and name in foreign:
                        use(name, module, item)
            for child in ast.iter_child_nodes(node):
                visit(child, module, node.name)
            return
        if isinstance(node, ast.Attribute):
            receiver(node.value, node.attr, module, cls, node)
        elif isinstance(node, ast.ImportFrom) and not (node.module or "").startswith("lightning_midepoch"):
            if not node.level:
                for alias in node.names:
                    use(alias.name, module, node)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _NAMED_BY_STRING:
            if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                receiver(node.args[0], node.args[1].value, module, cls, node)
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            owner = _namespace_of(node.value)
            if owner is not None and isinstance(node.slice.value, str):
                receiver(owner, node.slice.value, module, cls, node)
        for child in ast.iter_child_nodes(node):
            visit(child, module, cls)

    for module in modules:
        visit(module.tree, module, None)
    return uses


def _namespace_of(node: ast.AST) -> ast.AST | None:
    """``obj`` of ``vars(obj)`` or ``obj.__dict__``: a subscript of either names one of its attributes."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "vars" and node.args:
        return node.args[0]
    if isinstance(node, ast.Attribute) and node.attr == "__dict__":
        return node.value
    return None


def _registered() -> set[str]:
    return {name for names in _private.PRIVATE_NAMES.values() for name in names}


def _checked_names() -> set[str]:
    """The names the runtime checks look up by string (:func:`_compat.check_supported`, ``check_fetcher``)."""
    names = {name for attributes in _private.REQUIRED_ATTRIBUTES.values() for name in attributes}
    names |= {name for attributes in _private.TORCH_PRIVATE_NAMES.values() for name in attributes}
    names |= set(_private.REQUIRED_FETCHER_ATTRIBUTES) | set(_private.REQUIRED_COMBINED_LOADER_ATTRIBUTES)
    names.add(_private.SIGTERM_EXCHANGE)
    return {name for name in names if _private_name(name)}


@cache
def _package_uses() -> dict[str, list[str]]:
    return _foreign_uses([_read(path.name, path.read_text(encoding="utf-8")) for path in SOURCES])


def test_every_private_name_of_another_package_used_in_src_is_listed():
    unlisted = {name: where for name, where in _package_uses().items() if name not in _registered()}
    assert not unlisted, f"private names of other packages used in src/ but not listed in _private.py: {unlisted}"


def test_every_listed_private_name_is_used():
    """No stale entries: each name is used in src/ or looked up by one of the runtime checks."""
    stale = sorted(_registered() - set(_package_uses()) - _checked_names())
    assert not stale, f"listed in _private.py but not used: {stale}"


def test_every_name_the_runtime_checks_look_up_is_listed():
    assert _checked_names() <= _registered()


def _owner_source(owner: str) -> str:
    module_name, _, qualname = owner.partition(":")
    if module_name.split(".")[0] == "datasets":
        require("datasets")
    module = importlib.import_module(module_name)
    if not qualname:
        return inspect.getsource(module)
    return "\n".join(_source_or_empty(base) for base in getattr(module, qualname).__mro__)


def _source_or_empty(cls: type) -> str:
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):  # a builtin, or a base of the standard library without a readable source
        return ""


@pytest.mark.parametrize("owner", sorted(_private.PRIVATE_NAMES))
def test_each_listed_name_is_where_it_is_listed(owner):
    """The installed release defines (or sets) each name in the class or module it is listed under."""
    source = _owner_source(owner)
    missing = [name for name in _private.PRIVATE_NAMES[owner] if not re.search(rf"\b{re.escape(name)}\b", source)]
    assert not missing, f"{owner} does not mention {missing}"


def _uses_of(source: str, foreign: frozenset[str] = frozenset()) -> dict[str, list[str]]:
    return _foreign_uses([_read("example.py", source)], extra_foreign=foreign)


def test_the_scan_is_not_fooled_by_a_name_the_package_also_defines():
    """A module-level ``_load`` of ours does not hide another package's ``cloud_io._load`` (``_inspect`` has both)."""
    source = (
        "from lightning.fabric.utilities import cloud_io\n"
        "from lightning_midepoch import _compat\n"
        "def _load(path):\n"
        "    return cloud_io._load(path)\n"
        "class Ours:\n"
        "    def __init__(self):\n"
        "        self._mine = 1\n"
        "    def _helper(self):\n"
        "        return self._mine, self._inherited, _compat._pytorch_module(self)\n"
        "def use(trainer, ours):\n"
        "    trainer.fit_loop._some_private_thing\n"
        "    ours._helper()\n"
        "    return getattr(trainer, '_another', None), vars(trainer)['_third']\n"
    )
    used = set(_uses_of(source))
    assert used == {"_load", "_inherited", "_some_private_thing", "_another", "_third"}


def test_a_name_of_ours_that_another_package_also_defines_counts_as_theirs():
    source = (
        "class Ours:\n"
        "    def __init__(self):\n"
        "        self._ours_and_theirs = None\n"
        "def use(loader):\n"
        "    return loader._ours_and_theirs\n"
    )
    assert set(_uses_of(source)) == set()
    assert set(_uses_of(source, foreign=frozenset({"_ours_and_theirs"}))) == {"_ours_and_theirs"}


def test_inspect_uses_fabrics_private_load():
    assert any(where.startswith("_inspect.py:") for where in _package_uses()["_load"])
