"""The check that Lightning's stock methods are the ones the overrides were written against: fingerprints of source.

A private name that is still there can still mean something else. The stock methods the overrides replace, call or
copy (:data:`CHECKED_METHODS`) are compared, by a fingerprint of their syntax tree (:func:`fingerprint`), with those of
every release of the supported range, recorded in :mod:`lightning_midepoch._fingerprints` by ``tools/fingerprints.py``
(which reads releases' wheels with :func:`source_fingerprint`). :func:`lightning_midepoch._compat.check_supported`
warns naming the methods that differ (:func:`changed_methods`).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
from functools import cache
from typing import Any

from lightning_midepoch import _fingerprints

#: The stock methods whose fingerprints are checked: ``"module:Class.method"`` or ``"module:function"`` under the
#: trainer package (``lightning.pytorch`` or ``pytorch_lightning``). Every method the overrides replace and call
#: through ``super()``, every one whose body they copy or complete (``on_run_start``, ``__iter__``,
#: ``CombinedLoader.__iter__``), and every one whose internals they rely on (the fetchers' ``next()`` of the
#: ``CombinedLoader``, the restart stages, the progress counters, when the loaded checkpoint is there).
CHECKED_METHODS = (
    "loops.loop:_Loop.load_state_dict",
    "loops.loop:_Loop.restarting",
    "loops.loop:_Loop.is_resuming",  # absent before 2.5.3; the stock on_run_start reads it from then on
    "loops.loop:_Loop.on_iteration_done",
    "loops.fit_loop:_FitLoop.setup_data",
    "loops.fit_loop:_FitLoop.reset",
    "loops.fit_loop:_FitLoop.done",
    "loops.fit_loop:_FitLoop.on_advance_start",
    "loops.fit_loop:_FitLoop.on_advance_end",
    "loops.fit_loop:_FitLoop.update_restart_stage",
    "loops.fit_loop:_FitLoop.restarted_mid_epoch",
    "loops.fit_loop:_FitLoop.restarted_on_epoch_end",
    "loops.fit_loop:_FitLoop.restarted_on_epoch_start",
    "loops.training_epoch_loop:_TrainingEpochLoop.reset",
    "loops.training_epoch_loop:_TrainingEpochLoop.on_run_start",
    "loops.training_epoch_loop:_TrainingEpochLoop.advance",
    "loops.training_epoch_loop:_TrainingEpochLoop.on_advance_end",
    "loops.training_epoch_loop:_TrainingEpochLoop.update_restart_stage",
    "loops.training_epoch_loop:_TrainingEpochLoop.reset_restart_stage",
    "loops.training_epoch_loop:_TrainingEpochLoop.restarted_on_train_batch_end",
    "loops.training_epoch_loop:_TrainingEpochLoop._should_accumulate",
    "loops.training_epoch_loop:_TrainingEpochLoop._num_ready_batches_reached",
    "loops.progress:_ReadyCompletedTracker.reset",
    "loops.progress:_StartedTracker.reset",
    "loops.progress:_ProcessedTracker.reset",
    "loops.progress:_Progress.increment_completed",
    "loops.fetchers:_DataFetcher.setup",
    "loops.fetchers:_DataFetcher.__iter__",
    "loops.fetchers:_DataFetcher.__next__",
    "loops.fetchers:_DataFetcher.reset",
    "loops.fetchers:_PrefetchDataFetcher.__iter__",
    "loops.fetchers:_PrefetchDataFetcher.__next__",
    "loops.fetchers:_DataLoaderIterDataFetcher.__iter__",
    "loops.fetchers:_DataFetcherWrapper.__next__",
    "utilities.combined_loader:CombinedLoader.__iter__",
    "utilities.combined_loader:CombinedLoader.__next__",
    "utilities.combined_loader:_ModeIterator.__init__",
    "trainer.connectors.checkpoint_connector:_CheckpointConnector.restore_loops",
    "trainer.connectors.checkpoint_connector:_CheckpointConnector.resume_end",
    # pre-emption: the handlers Lightning registers and how it composes them, the exchange stood in for
    "trainer.connectors.signal_connector:_SignalConnector.register_signal_handlers",
    "trainer.connectors.signal_connector:_SignalConnector.teardown",
    "trainer.connectors.signal_connector:_SignalConnector._slurm_sigusr_handler_fn",
    "trainer.connectors.signal_connector:_SignalConnector._sigterm_notifier_fn",
    "trainer.connectors.signal_connector:_HandlersCompose.__call__",
    "loops.training_epoch_loop:_TrainingEpochLoop._broadcast_sigterm_tensor",
    "loops.training_epoch_loop:_TrainingEpochLoop._should_check_val_fx",
)

#: The fingerprint of a method the release does not define (where that is one of the accepted versions).
ABSENT = "absent"


def changed_methods(package: str) -> list[str]:
    """The :data:`CHECKED_METHODS` of the trainer package ``package`` whose fingerprint is none of the accepted ones.

    Example:
        >>> changed_methods("lightning.pytorch")
        []

    """
    changed = []
    for path in CHECKED_METHODS:
        module_name, qualname = path.split(":")
        module = importlib.import_module(f"{package}.{module_name}")
        if live_fingerprint(module, qualname) not in _fingerprints.FINGERPRINTS.get(path, {}):
            changed.append(f"`{qualname}` ({package}.{module_name})")
    return changed


def live_fingerprint(module: object, qualname: str) -> str:
    """The fingerprint of method ``qualname`` (``"Class.method"``, or a function's name) in ``module`` now.

    A property's getter stands for the property. The method is read from the class itself (not inherited), so that
    a release that moves it shows as changed. :data:`ABSENT` if the class (or module) does not define it;
    ``"unreadable"`` if its source cannot be read.
    """
    owner, name = _split(qualname)
    attribute = vars(module if owner is None else getattr(module, owner, type)).get(name)
    if attribute is None:
        return ABSENT
    function: Any = attribute.fget if isinstance(attribute, property) else attribute
    try:
        filename = inspect.getsourcefile(function)
        first_line = inspect.getsourcelines(function)[1]
    except (TypeError, OSError):
        return "unreadable"
    for node in ast.walk(_parsed(filename or "")):
        if (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name == function.__name__
            and min([node.lineno] + [decorator.lineno for decorator in node.decorator_list]) == first_line
        ):
            return fingerprint(node)
    return "unreadable"


def source_fingerprint(source: str, qualname: str) -> str:
    r"""The fingerprint of method ``qualname`` (``"Class.method"``, or a function's ``"name"``) in a module's source.

    What :func:`live_fingerprint` finds once the module is imported; ``tools/fingerprints.py`` reads releases' wheels
    with it.

    Example:
        >>> source = "class A:\n @property\n def x(self):\n  return 1\n @x.setter\n def x(self, v): ..."
        >>> source_fingerprint(source, "A.x") == fingerprint(ast.parse(source).body[0].body[0])
        True
        >>> source_fingerprint(source, "A.y")
        'absent'
        >>> source_fingerprint("def f():\n return 1", "f") == fingerprint(ast.parse("def f(): return 1").body[0])
        True

    """
    owner, name = _split(qualname)
    body = ast.parse(source).body
    if owner is not None:
        classes = [node for node in body if isinstance(node, ast.ClassDef) and node.name == owner]
        body = classes[0].body if classes else []
    defs = [item for item in body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name]
    # a property's getter (its setter, defined later under the same name, does not replace it)
    getters = [
        item for item in defs if any(isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list)
    ]
    if defs:
        return fingerprint(getters[0] if getters else defs[-1])
    return ABSENT


def _split(qualname: str) -> tuple[str | None, str]:
    """``"Class.method"`` as ``("Class", "method")``, a module-level ``"function"`` as ``(None, "function")``."""
    owner, _, name = qualname.rpartition(".")
    return owner or None, name


@cache
def _parsed(filename: str) -> ast.Module:
    try:
        with open(filename, encoding="utf-8") as file:
            return ast.parse(file.read())
    except (OSError, SyntaxError, ValueError):
        return ast.Module(body=[], type_ignores=[])


def fingerprint(function: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    r"""A hash of a function's syntax tree: its code, not its docstring, comments, layout or Python's bytecode.

    The tree is written out by hand (names of nodes and fields, values of constants), leaving out what varies
    between Python versions without changing the code: empty or missing optional fields, load/store contexts,
    type comments and type parameters.

    Example:
        >>> def parse(source):
        ...     return ast.parse(source).body[0]
        >>> fingerprint(parse("def f(x):\n    'Doc.'\n    return x + 1  # one")) == fingerprint(
        ...     parse("def f(x):\n    return (x +\n            1)"))
        True
        >>> fingerprint(parse("def f(x):\n    return x + 1")) == fingerprint(parse("def f(x):\n    return x - 1"))
        False

    """
    body = function.body
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        body = body[1:]
    header = _canonical([function.name, function.args, function.decorator_list, function.returns])
    text = f"{type(function).__name__}({header},{_canonical(body)})"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _canonical(node: object) -> str:
    if isinstance(node, ast.AST):
        fields = [
            f"{name}={_canonical(value)}"
            for name, value in ast.iter_fields(node)
            if name not in ("ctx", "type_comment", "type_params", "kind") and value is not None and value != []
        ]
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return f"[{','.join(_canonical(item) for item in node)}]"
    return repr(node)
