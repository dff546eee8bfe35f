"""Every private Lightning name this package relies on, and the check that the installed Lightning has them.

The loop and fetcher overrides in :mod:`lightning_midepoch._loops` and :mod:`lightning_midepoch._fetchers` are
written against the private attributes listed here. They are checked on the trainer's own objects when the callback
is set up, so that an unsupported Lightning fails with one clear message instead of an ``AttributeError`` deep inside
a training loop. Both namespaces (``lightning.pytorch`` and ``pytorch_lightning``) are served: whatever is needed is
looked up in the namespace the trainer comes from, never imported from one the user may not have installed.

A name that is still there can still mean something else: the stock methods the overrides replace, call or copy
(:data:`CHECKED_METHODS`) are also compared, by a fingerprint of their source, with those of every release in the
supported range (recorded in :mod:`lightning_midepoch._fingerprints` by ``tools/fingerprints.py``). A release that
changed one of them runs with a warning naming what differs (``LIGHTNING_MIDEPOCH_UNVERIFIED=1`` makes it an
informational message); a trainer that lacks a name the overrides use is left to Lightning (the callback steps aside
for that fit, with a warning). A fit is never refused.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import cache
from typing import TYPE_CHECKING, Any

from packaging.version import Version

from lightning_midepoch import _fingerprints

if TYPE_CHECKING:
    from lightning.pytorch import Trainer
    from lightning.pytorch.utilities.combined_loader import CombinedLoader

#: The Lightning releases the overrides are written and tested against.
SUPPORTED_MIN = Version("2.5.0")
SUPPORTED_BELOW = Version("2.7.0")
SUPPORTED_RANGE = f">={SUPPORTED_MIN},<{SUPPORTED_BELOW}"

#: Private attributes used, per object, checked on the live trainer before anything is installed.
REQUIRED_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "trainer": ("_checkpoint_connector", "_accelerator_connector", "_signal_connector"),
    "checkpoint_connector": ("_loaded_checkpoint",),
    "fit_loop": (
        "_data_fetcher",
        "_restarting",
        "_combined_loader",
        "_last_train_dl_reload_epoch",
        "epoch_progress",
        "restarted_mid_epoch",
        "restarted_on_epoch_end",
        "restarted_on_epoch_start",
        "update_restart_stage",
        "restarting",
        "setup_data",
        "load_state_dict",
        "on_advance_start",
        "on_advance_end",
        "reset",
    ),
    "epoch_loop": (
        "_batches_that_stepped",
        "_should_accumulate",
        "_num_ready_batches_reached",
        "_should_check_val_fx",
        "batch_progress",
        "restarted_on_train_batch_end",
        "reset_restart_stage",
        "val_loop",
        "on_run_start",
        "advance",
        "reset",
    ),
    "val_loop": ("increment_progress_to_evaluation_end",),
    # the override that defers the signal handlers it registers, and the handlers it recognises
    # (lightning_midepoch._preemption)
    "signal_connector": (
        "register_signal_handlers",
        "teardown",
        "trainer",
        "received_sigterm",
        "_slurm_sigusr_handler_fn",
        "_sigterm_notifier_fn",
    ),
}

#: The epoch loop's exchange of rank 0's SIGTERM flag at each training batch under DDP (Lightning 2.5.2 and later):
#: the pre-emption code stands in for it on one trainer (lightning_midepoch._preemption.SharedSignalCheck).
SIGTERM_EXCHANGE = "_broadcast_sigterm_tensor"

#: Private names of the fetchers and combined_loader modules (checked with the fetcher).
REQUIRED_MODULE_ATTRIBUTES = ("_DataLoaderIterDataFetcher", "_SUPPORTED_MODES")

#: Private names used on objects the checks above cannot reach before training (Lightning's, torch's and Python's).
OTHER_PRIVATE_NAMES = (
    "_DataFetcher",  # the base of the fetcher override (annotations only)
    "_FitLoop",  # the base of the fit loop override (annotations only)
    "_TrainingEpochLoop",  # the base of the epoch loop override (annotations only)
    "_iterator",  # the CombinedLoader's mode iterator, and a DataLoader's persistent-workers iterator
    "_idx",  # the CombinedLoader mode iterator's batch index
    "_reconstructor",  # copyreg's: how a stock loop object pickles
    "_ex_iterable",  # Hugging Face datasets' IterableDataset: its chain of example iterables (unsaved_buffer)
    "_get_iterator",  # torch's DataLoader: creates a new iterator (and its workers); persistent workers reuse theirs
    "_send_idx",  # torch's multi-process DataLoader iterator: the batches handed to the workers in this pass
    "_process_data",  # ... called with each batch it returns and the id of the worker that produced it
    "_starting_state_dict",  # ... the state it loaded, applied at every pass of its epoch (forget_restored_position)
    "_combined_loader_states_to_load",  # the fit loop's stateful loader states, until it loads them
    "_load_state_dicts",  # CombinedLoader: gives its stateful loaders their states (in order)
    "_fields",  # Python's named tuples: their field names (documented, despite the underscore; _batch_check)
    "_HandlersCompose",  # Lightning's composition of one signal's handlers (signal_handlers: its parts)
)

#: The module a Lightning that carries the upstream change (upstream/0001) has: it resumes mid-epoch itself.
NATIVE_RESUME_MODULE = "loops._mid_epoch"

#: torch's private names the worker recording relies on (listed in :data:`OTHER_PRIVATE_NAMES` too), checked on
#: torch's classes when the callback is set up: ``"module:Class"`` and the names each must define.
TORCH_PRIVATE_NAMES: dict[str, tuple[str, ...]] = {
    "torch.utils.data.dataloader:DataLoader": ("_get_iterator",),
    # `_reset` sets `_send_idx` (read where present: tasks_sent)
    "torch.utils.data.dataloader:_MultiProcessingDataLoaderIter": ("_process_data", "_reset"),
}

#: Private attributes of the train data fetcher (created inside ``setup_data``, checked when it is taken over) and of
#: the ``CombinedLoader`` it iterates.
REQUIRED_FETCHER_ATTRIBUTES = (
    "fetched",
    "iterator",
    "length",
    "done",
    "reset",
    "combined_loader",
)
#: Read where the fetcher has it: the batches a ``_PrefetchDataFetcher`` fetched ahead (other fetchers have none).
OPTIONAL_FETCHER_ATTRIBUTES = ("batches",)
REQUIRED_COMBINED_LOADER_ATTRIBUTES = ("_iterator", "_mode", "_limits", "flattened")

#: Set to ``1`` to take note of an unchecked Lightning release: its warning becomes an informational message.
UNVERIFIED_ENV = "LIGHTNING_MIDEPOCH_UNVERIFIED"

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

#: The warning stock Lightning gives when it resumes mid-epoch without a resumable loader; ours replaces it.
STOCK_NOT_RESUMABLE_WARNING = "You're resuming from a checkpoint that ended before the epoch ended"


def namespace(obj: object) -> str:
    """The Lightning package an object comes from: ``"lightning"`` or ``"pytorch_lightning"``."""
    root = type(obj).__module__.split(".")[0]
    return root if root in ("lightning", "pytorch_lightning") else "lightning"


def resumes_mid_epoch_itself(trainer: Trainer) -> bool:
    """Whether the trainer's Lightning carries the change this package delivers (the patch series in ``upstream/``).

    Such a Lightning resumes exactly from a mid-epoch checkpoint on its own: the callback then steps aside.

    Example:
        >>> import lightning as L
        >>> resumes_mid_epoch_itself(L.Trainer(logger=False))  # the stock release
        False

    """
    return importlib.util.find_spec(f"{_pytorch_module(trainer)}.{NATIVE_RESUME_MODULE}") is not None


def lightning_version(obj: object) -> str:
    """The version of the Lightning package the object (usually the trainer) comes from."""
    return str(importlib.import_module(namespace(obj)).__version__)


def check_supported(trainer: Trainer) -> str:
    """Check the trainer's Lightning and torch against what the overrides are written for; a fit is never refused.

    * A release outside the supported range, or one that changed a method the overrides rely on
      (:data:`CHECKED_METHODS`), runs with a warning naming what differs (an informational message instead with
      ``LIGHTNING_MIDEPOCH_UNVERIFIED=1``, for a user who has read it): the overrides call the release's own code, and
      a resume whose batch check fails (the last batch trained, loaded again, differs) is still warned before training.
    * A trainer or torch that lacks a private name the overrides use cannot run them at all: the reason is returned,
      and the callback steps aside for that fit (Lightning resumes as it does without it).

    Returns:
        Why the callback steps aside for this trainer, or ``""``.

    """
    package = namespace(trainer)
    installed = lightning_version(trainer)
    problem = ""
    if not SUPPORTED_MIN <= Version(installed) < SUPPORTED_BELOW:
        problem = f"lightning-midepoch supports {package} {SUPPORTED_RANGE}, but {package} {installed} is installed."
    else:
        changed = changed_methods(_pytorch_module(trainer))
        if changed:
            problem = (
                f"lightning-midepoch has not been checked against {package} {installed}: its {', '.join(changed)}"
                f" differ{'s' if len(changed) == 1 else ''} from the stock code of every release of the supported"
                f" range {package}{SUPPORTED_RANGE} that it was checked against."
            )
    if problem:
        message = (
            f"{problem} MidEpochResume runs anyway, calling that release's code; its resumes are not checked there"
            " (a resume whose last batch trained, loaded again, differs from the checkpoint's fingerprint of it is"
            " still warned before training). To be safe, install a checked release (`pip install"
            f" '{package}{SUPPORTED_RANGE}'`, {_fingerprints.CHECKED})."
        )
        if os.environ.get(UNVERIFIED_ENV) == "1":
            info(f"{message} ({UNVERIFIED_ENV}=1: said once, as information.)", trainer)
        else:
            warn(f"{message} Set {UNVERIFIED_ENV}=1 to take note of this without a warning.", trainer, set())
    missing_torch = missing_torch_names()
    if missing_torch:
        return (
            f"torch {torch_version()} lacks {', '.join(missing_torch)}, which the recording of DataLoader worker"
            " states relies on (torch 2.1 to 2.13 have it)"
        )
    objects = {
        "trainer": trainer,
        "checkpoint_connector": getattr(trainer, "_checkpoint_connector", None),
        "fit_loop": trainer.fit_loop,
        "epoch_loop": trainer.fit_loop.epoch_loop,
        "val_loop": getattr(trainer.fit_loop.epoch_loop, "val_loop", None),
        "signal_connector": getattr(trainer, "_signal_connector", None),
    }
    missing = [
        f"{name}.{attribute}"
        for name, attributes in REQUIRED_ATTRIBUTES.items()
        for attribute in attributes
        if not hasattr(objects[name], attribute)
    ]
    if missing:
        return (
            f"the trainer's loops lack {', '.join(missing)} ({package} {installed}; supported releases are"
            f" {package}{SUPPORTED_RANGE}; a fit loop of your own must keep Lightning's attributes)"
        )
    return ""


def missing_torch_names() -> list[str]:
    """The :data:`TORCH_PRIVATE_NAMES` the installed torch lacks.

    Example:
        >>> missing_torch_names()
        []

    """
    missing = []
    for path, names in TORCH_PRIVATE_NAMES.items():
        module_name, class_name = path.split(":")
        cls = getattr(importlib.import_module(module_name), class_name, None)
        missing += [f"{class_name}.{name}" for name in names if not hasattr(cls, name)]
    return missing


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


def check_fetcher(fetcher: object) -> None:
    """Fail clearly if the train data fetcher or its ``CombinedLoader`` lacks a private name the overrides use.

    Raises:
        RuntimeError: Naming what is missing.

    """
    missing = [f"fetcher.{name}" for name in REQUIRED_FETCHER_ATTRIBUTES if not hasattr(fetcher, name)]
    combined_loader = getattr(fetcher, "_combined_loader", None)
    if combined_loader is not None:
        missing += [
            f"combined_loader.{name}"
            for name in REQUIRED_COMBINED_LOADER_ATTRIBUTES
            if not hasattr(combined_loader, name)
        ]
        if not hasattr(sys.modules[type(combined_loader).__module__], "_SUPPORTED_MODES"):
            missing.append("combined_loader module._SUPPORTED_MODES")
    if not hasattr(sys.modules[type(fetcher).__module__], "_DataLoaderIterDataFetcher"):
        missing.append("fetchers module._DataLoaderIterDataFetcher")
    if missing:
        raise RuntimeError(
            f"lightning-midepoch cannot run with {namespace(fetcher)} {lightning_version(fetcher)}: its train data"
            f" fetcher lacks {', '.join(missing)}. Supported releases are {namespace(fetcher)}{SUPPORTED_RANGE}."
        )


def reload_every_n_epochs(trainer: Trainer) -> int:
    """``Trainer(reload_dataloaders_every_n_epochs=...)`` (set on the trainer by its data connector)."""
    return int(getattr(trainer, "reload_dataloaders_every_n_epochs", 0))


def combined_mode_iterator(combined_loader: CombinedLoader) -> Any:
    """Create the CombinedLoader's mode iterator without starting the loaders' iterators.

    Lets ``len(combined_loader)`` work while the first iterator of a resumed epoch is held back until the epoch loop
    has set the sampler epoch and knows where to resume.
    """
    module = sys.modules[type(combined_loader).__module__]
    modes = module._SUPPORTED_MODES
    iterator_cls = modes[combined_loader._mode]["iterator"]
    return iterator_cls(combined_loader.flattened, combined_loader._limits)


def set_batch_index(combined_loader: CombinedLoader, batch_idx: int) -> None:
    """Make the CombinedLoader number its next batch ``batch_idx`` (it restarts at 0 with every new iterator)."""
    iterator = combined_loader._iterator
    if iterator is not None:
        iterator._idx = batch_idx


def move_batch_progress(progress: Any, ready: int) -> None:
    """Set the epoch loop's batch progress of the current epoch to ``ready`` finished batches (totals shift along)."""
    delta = ready - progress.current.ready
    for tracker, value in ((progress.current, None), (progress.total, delta)):
        for name in ("ready", "started", "processed", "completed"):
            setattr(tracker, name, ready if value is None else getattr(tracker, name) + value)


def workers_started(loader: Any) -> bool:
    """Whether a ``DataLoader`` with persistent workers has started them (torch keeps them in ``_iterator``)."""
    return getattr(loader, "_iterator", None) is not None


class _IteratorCreation:
    """A DataLoader's ``_get_iterator`` while its worker states are recorded.

    A copy of the loader made during ``fit`` (pickled, deep-copied) is the user's own, as without the callback: it
    creates its iterators as stock does, and does not carry the recording, which reaches the trainer (Lightning's
    master keeps the process's signal handlers there, which do not pickle).
    """

    def __init__(self, loader: Any, wrapper: Callable[[Callable[[], Any]], Any]) -> None:
        self.loader, self.wrapper = loader, wrapper

    def __call__(self) -> Any:
        return self.wrapper(type(self.loader)._get_iterator.__get__(self.loader))

    def __reduce__(self) -> tuple[Any, ...]:
        return _StockIteratorCreation, (self.loader,)


class _StockIteratorCreation:
    """A copied loader's ``_get_iterator``: the stock one (see :class:`_IteratorCreation`)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __call__(self) -> Any:
        return type(self.loader)._get_iterator(self.loader)


def wrap_iterator_creation(loader: Any, wrapper: Callable[[Callable[[], Any]], Any]) -> None:
    """Create a DataLoader's new iterators (``iter()``, but not a persistent-workers reset) through ``wrapper``.

    ``wrapper(create)`` calls ``create()`` for the stock iterator, whose construction starts the workers.
    """
    if getattr(type(loader), "_get_iterator", None) is None:
        raise RuntimeError(
            f"lightning-midepoch cannot record the worker states of {type(loader).__name__}: torch {torch_version()}'s"
            " DataLoader has no `_get_iterator`. Use torch>=2.1, or num_workers=0."
        )
    object.__setattr__(loader, "_get_iterator", _IteratorCreation(loader, wrapper))


def torch_version() -> str:
    import torch

    return str(torch.__version__)


def tasks_sent(loader: Any) -> int | None:
    """How many batches a DataLoader's persistent workers were handed in the current pass (None: no iterator)."""
    iterator = getattr(loader, "_iterator", None)
    sent = getattr(iterator, "_send_idx", None)
    return sent if isinstance(sent, int) else None


def report_batch_workers(iterator: Any, report: Callable[[int], None]) -> bool:
    """Call ``report(worker_id)`` for every batch a multi-process DataLoader iterator returns, as it returns it.

    Returns:
        False where the iterator does not name the worker of a batch (then nothing is reported).

    """
    stock = getattr(iterator, "_process_data", None)
    if stock is None:
        return False
    try:
        parameters = inspect.signature(stock).parameters
    except (TypeError, ValueError):
        return False
    if len(parameters) != 2:  # an older torch passes no worker id
        return False

    def process_data(data: Any, worker_id: int) -> Any:
        report(worker_id)
        return stock(data, worker_id)

    iterator._process_data = process_data
    return True


def unwrap_iterator_creation(loader: Any) -> None:
    """Undo :func:`wrap_iterator_creation`."""
    vars(loader).pop("_get_iterator", None)


def has_callback(trainer: Trainer, name: str) -> bool:
    """Whether one of the trainer's callbacks is (a subclass of) Lightning's public callback ``name``."""
    stock = getattr(importlib.import_module(f"{_pytorch_module(trainer)}.callbacks"), name)
    return any(isinstance(callback, stock) for callback in getattr(trainer, "callbacks", ()))


def shards_parameters(trainer: Trainer) -> bool:
    """Whether the trainer's strategy shards the parameters across ranks (FSDP, ``ModelParallelStrategy``)."""
    strategies = importlib.import_module(f"{_pytorch_module(trainer)}.strategies")
    kinds = tuple(
        getattr(strategies, name) for name in ("FSDPStrategy", "ModelParallelStrategy") if hasattr(strategies, name)
    )
    return isinstance(getattr(trainer, "strategy", None), kinds)


def _pytorch_module(obj: object) -> str:
    """Where the object's Lightning keeps its trainer package: ``lightning.pytorch`` or ``pytorch_lightning``."""
    return "lightning.pytorch" if namespace(obj) == "lightning" else "pytorch_lightning"


def restoring_checkpoint(trainer: Trainer) -> bool:
    """Whether the trainer is restoring a checkpoint it loaded (not loop states a tuner copied)."""
    return bool(trainer._checkpoint_connector._loaded_checkpoint)


def drop_workers(loader: Any) -> None:
    """Let a ``DataLoader``'s persistent workers go: its next ``iter()`` starts new ones.

    torch keeps their iterator in ``_iterator``, and shuts them down when nothing holds it.
    """
    if getattr(loader, "_iterator", None) is not None:
        loader._iterator = None


def steps_pull_batches(fetcher: object) -> bool:
    """Whether ``training_step`` takes ``dataloader_iter`` and pulls its batches itself (as many as it likes)."""
    stock = getattr(sys.modules[type(fetcher).__module__], "_DataLoaderIterDataFetcher", None)
    return stock is not None and isinstance(fetcher, stock)


def held_batches(fetcher: object) -> list[Any]:
    """The batches a prefetching train data fetcher fetched ahead and has not returned yet (Lightning's ``batches``).

    Each is what the ``CombinedLoader`` returned: ``(batch, batch_idx, dataloader_idx)``. Lightning fetches ahead only
    for loaders without a length.
    """
    return list(getattr(fetcher, "batches", None) or ())


def all_batches_reached(epoch_loop: Any) -> bool:
    """Whether the training epoch loop has run every batch its epoch has (not stopped early)."""
    return bool(epoch_loop._num_ready_batches_reached())


def epoch_finished(progress: Any) -> bool:
    """Whether the fit loop's epoch progress counts its current epoch as finished (or none started)."""
    current = progress.current
    return bool(current.ready == current.started == current.processed == current.completed)


def restored_on_batch_end(progress: Any) -> bool:
    """Whether the epoch loop's restored batch progress was saved in ``on_train_batch_end`` (Lightning's test)."""
    total = progress.total
    return bool(total.ready == total.started == total.processed == total.completed + 1)


def epoch_trained(progress: Any) -> bool:
    """Whether the fit loop's epoch progress counts every batch of its current epoch as run (or none started)."""
    current = progress.current
    return bool(current.ready == current.started == current.processed)


def stop_restarting(fit_loop: Any) -> None:
    """Count the fit loop and the loops under it as not restarting.

    The fit loop's own setter keeps it restarting whenever ``max_steps`` is set; the epoch loop's passes the value on
    to the validation loop.
    """
    fit_loop._restarting = False
    fit_loop.epoch_loop.restarting = False


def start_batch_progress_afresh(progress: Any) -> None:
    """Count no batch of the current epoch yet (the epoch loop's batch progress, totals kept)."""
    progress.current.reset()
    progress.is_last_batch = False


def reopen_epoch(progress: Any, epoch: int) -> None:
    """Count epoch ``epoch`` of the fit loop's epoch progress as started but not finished (resumed mid-epoch)."""
    for tracker in (progress.current, progress.total):
        if tracker.started == epoch + 1:
            tracker.processed = tracker.completed = epoch


def count_epoch_ready(progress: Any) -> None:
    """Count the fit loop's current epoch as ready again, as the totals of its epoch progress already do."""
    progress.current.ready = progress.current.completed + 1


def cluster_environment(trainer: Trainer) -> object:
    """The trainer's cluster environment (a ``SLURMEnvironment`` carries the signal its auto-requeue listens to).

    Lightning reads it from the same place when it registers its signal handlers.
    """
    return trainer._accelerator_connector.cluster_environment


def signal_connector(trainer: Trainer) -> object:
    """The trainer's signal connector, which registers Lightning's signal handlers as ``fit`` starts."""
    return trainer._signal_connector


def connector_trainer(connector: Any) -> Trainer:
    """The trainer a signal connector belongs to."""
    return connector.trainer  # type: ignore[no-any-return]


def lightning_signal_handlers(connector: Any) -> dict[str, object]:
    """The handlers Lightning's signal connector registers: SLURM's auto-requeue and the SIGTERM notifier."""
    return {"requeue": connector._slurm_sigusr_handler_fn, "sigterm": connector._sigterm_notifier_fn}


def composed_handlers(handler: object, connector: object) -> list[object]:
    """The parts of a signal's handler: those Lightning composed into one (``_HandlersCompose``), or the handler.

    ``connector`` is the signal connector that registered it (its module defines the composition).
    """
    compose = importlib.import_module(type(connector).__module__)._HandlersCompose
    if isinstance(handler, compose):
        return list(handler.signal_handlers)
    return [handler]


def has_sigterm_exchange(trainer: Trainer) -> bool:
    """Whether the epoch loop exchanges rank 0's SIGTERM flag at each training batch (Lightning 2.5.2 and later)."""
    return hasattr(trainer.fit_loop.epoch_loop, SIGTERM_EXCHANGE)


def replace_sigterm_exchange(trainer: Trainer, exchange: Callable[[], None]) -> None:
    """Make ``exchange`` this trainer's epoch loop's SIGTERM exchange (an attribute of the instance, not the class)."""
    setattr(trainer.fit_loop.epoch_loop, SIGTERM_EXCHANGE, exchange)


def restore_sigterm_exchange(trainer: Trainer) -> None:
    """Give this trainer's epoch loop Lightning's SIGTERM exchange back."""
    if SIGTERM_EXCHANGE in vars(trainer.fit_loop.epoch_loop):
        delattr(trainer.fit_loop.epoch_loop, SIGTERM_EXCHANGE)


def torch_checkpoint_io(trainer: Trainer) -> type:
    """Lightning's default checkpoint plugin, ``TorchCheckpointIO``, of the trainer's namespace."""
    return importlib.import_module(f"{_pytorch_module(trainer)}.plugins").TorchCheckpointIO  # type: ignore[no-any-return]


def stopped_inside_validation(epoch_loop: Any) -> bool:
    """Whether the restored loops stopped inside a validation of the training (its progress counters tell).

    Written at a validation batch's end, that batch is not completed yet; written as Lightning's SIGTERM exception
    left the validation, the batch is completed but was not its last. Restored before the epoch loop's reset.
    """
    current = epoch_loop.val_loop.batch_progress.current
    return bool(
        current.ready > current.completed
        or (current.ready > 0 and not epoch_loop.val_loop.batch_progress.is_last_batch)
    )


def validation_follows(trainer: Trainer, fetcher: Any) -> bool:
    """Whether the training loop runs a validation right after the current batch (asked in ``on_train_batch_end``)."""
    return bool(trainer.fit_loop.epoch_loop._should_check_val_fx(fetcher))


def sigterm_exception(trainer: Trainer) -> type[BaseException]:
    """Lightning's ``SIGTERMException``, which its loops raise at a boundary once the SIGTERM notifier ran."""
    exceptions = importlib.import_module(f"{_pytorch_module(trainer)}.utilities.exceptions")
    return exceptions.SIGTERMException  # type: ignore[no-any-return]


def interrupted(trainer: Trainer) -> bool:
    """Whether the trainer is handling an exception (Lightning sets its status before calling ``on_exception``)."""
    return str(getattr(trainer.state.status, "value", trainer.state.status)) == "interrupted"


def info(message: str, trainer: object) -> None:
    """Log an informational message on rank zero through Lightning's channel."""
    rank_zero = importlib.import_module(f"{_pytorch_module(trainer)}.utilities.rank_zero")
    rank_zero.rank_zero_info(message)


def combined_mode(combined_loader: CombinedLoader) -> str:
    """The CombinedLoader's mode (``"max_size_cycle"`` for the loader Lightning builds around a plain one)."""
    return str(combined_loader._mode)


def hold_combined_iterator(combined_loader: CombinedLoader) -> None:
    """Give the CombinedLoader a mode iterator whose loaders have not been started."""
    combined_loader._iterator = combined_mode_iterator(combined_loader)


def warn(message: str, trainer: object, seen: set[str]) -> None:
    """Warn once per message and per ``seen`` set through Lightning's channel (rank zero, ``PossibleUserWarning``)."""
    if message in seen:
        return
    seen.add(message)
    rank_zero = importlib.import_module(f"{_pytorch_module(trainer)}.utilities.rank_zero")
    rank_zero.rank_zero_warn(message, category=_possible_user_warning(namespace(trainer)))


def _possible_user_warning(package: str) -> type[Warning]:
    module = importlib.import_module(
        "lightning.fabric.utilities.warnings" if package == "lightning" else "lightning_fabric.utilities.warnings"
    )
    return module.PossibleUserWarning  # type: ignore[no-any-return]


@contextmanager
def stock_warning_suppressed() -> Iterator[None]:
    """Silence stock Lightning's "dataloader is not resumable" warning: with the callback, this path is supported."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=STOCK_NOT_RESUMABLE_WARNING)
        yield


@contextmanager
def evaluation_skip_wrapped(val_loop: Any, wrap: Callable[[], AbstractContextManager[None]]) -> Iterator[None]:
    """Run the validation loop's ``increment_progress_to_evaluation_end`` inside the context manager ``wrap()``.

    The stock epoch loop calls it on a restart whose last batch was due a validation (one the checkpoint already
    holds): it sets up the validation loader and starts its iterator, only to skip over it.
    """
    stock = val_loop.increment_progress_to_evaluation_end

    def wrapped() -> None:
        with wrap():
            stock()

    val_loop.increment_progress_to_evaluation_end = wrapped  # this instance only, for the block
    try:
        yield
    finally:
        del val_loop.increment_progress_to_evaluation_end


def unsaved_buffer(dataset: object) -> str | None:
    """What an iterable dataset holds that its own ``state_dict()`` leaves out, if known: a shuffle buffer.

    Hugging Face's ``datasets.IterableDataset.shuffle(buffer_size=...)`` draws from a buffer of examples that its
    state does not hold: a restored dataset refills it, so examples of the interrupted epoch are lost and others are
    seen twice. The buffer is an example iterable with a ``buffer_size`` along the dataset's chain of them
    (``_ex_iterable``, then ``ex_iterable``/``ex_iterables``; read from ``datasets`` 5.2.0, duck-typed).

    Example:
        >>> unsaved_buffer(range(3)) is None
        True

    """
    pending = [getattr(dataset, "_ex_iterable", None)]
    for _ in range(64):  # a chain of example iterables (mapped, filtered, interleaved, ...), bounded
        if not pending:
            break
        node = pending.pop()
        size = getattr(node, "buffer_size", None)
        if isinstance(size, int):
            return f"a shuffle buffer of {size} examples"
        pending.append(getattr(node, "ex_iterable", None))
        children = getattr(node, "ex_iterables", None)
        pending += list(children) if isinstance(children, (list, tuple)) else []
        pending = [child for child in pending if child is not None]
    return None


def pending_loader_states(fit_loop: Any) -> list[Any]:
    """The stateful train loaders' states the fit loop restored but has not given them (an empty list once it has).

    Lightning gives them their states only when it resumes inside an epoch (its fit loop is restarting).
    """
    return list(getattr(fit_loop, "_combined_loader_states_to_load", None) or [])


def load_loader_states(fit_loop: Any, combined_loader: CombinedLoader) -> None:
    """Give the stateful train loaders the states the fit loop restored, as Lightning does on a mid-epoch resume."""
    combined_loader._load_state_dicts(fit_loop._combined_loader_states_to_load)
    fit_loop._combined_loader_states_to_load = []


def forget_restored_position(obj: object) -> None:
    """Let a dataset or loader that was given a saved position start its next pass afresh, as it does when not resumed.

    Two libraries keep a loaded position beyond the pass it was for:

    * Hugging Face's ``datasets.IterableDataset.load_state_dict`` keeps the state (``_starting_state_dict``) and applies
      it at every pass whose epoch is the state's; Lightning never moves that epoch (it calls ``set_epoch`` on
      samplers only), so every later pass would start at the restored position.
    * litdata's ``StreamingDataLoader`` stays in its ``restore`` mode until an iterator runs to its very end, which
      Lightning's loop never asks of a sized loader (it stops after ``len(loader)`` batches): its next pass would replay
      the restored position instead of starting its next epoch.

    Read from ``datasets`` 5.2.0 and ``litdata`` 0.2.76; anything else is left alone.

    Example:
        >>> class Restored:
        ...     _starting_state_dict = {"epoch": 0}
        >>> dataset = Restored()
        >>> forget_restored_position(dataset)
        >>> dataset._starting_state_dict is None
        True

    """
    if isinstance(getattr(obj, "_starting_state_dict", None), dict):
        obj._starting_state_dict = None  # type: ignore[attr-defined]
    if type(obj).__module__.split(".")[0] == "litdata" and getattr(obj, "restore", None) is True:
        obj.restore = False  # type: ignore[attr-defined]


def replace_loader_states(checkpoint: dict[str, Any], states: list[Any]) -> None:
    """Put the given states of the stateful train loaders into a checkpoint Lightning is writing, where not ``None``.

    Lightning keeps them, in the order of the loaders, under the fit loop's ``combined_loader`` key.

    Example:
        >>> checkpoint = {"loops": {"fit_loop": {"state_dict": {"combined_loader": [{"at": 5}, {"at": 3}]}}}}
        >>> replace_loader_states(checkpoint, [{"at": 4}, None])
        >>> checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]
        [{'at': 4}, {'at': 3}]

    """
    saved = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {}).get("combined_loader")
    if not isinstance(saved, list) or len(saved) != len(states):
        return
    for index, state in enumerate(states):
        if state is not None:
            saved[index] = state


def lags_a_pass(dataset: object) -> bool:
    """Whether a dataset's ``state_dict()`` still describes its previous pass until a new pass fetches.

    Hugging Face's ``datasets.IterableDataset`` sets up a pass's state at the pass's first example (read from
    ``datasets`` 5.2.0: the loaded state it keeps, ``_starting_state_dict``, marks it).

    Example:
        >>> lags_a_pass(range(3))
        False

    """
    return hasattr(dataset, "_starting_state_dict")
