"""Accessors for the private names of Lightning and torch, and the check that the installed Lightning has them.

The loop and fetcher overrides in :mod:`lightning_midepoch._loops` and :mod:`lightning_midepoch._fetchers` reach
Lightning's private attributes through the functions here. The names are listed in :mod:`lightning_midepoch._private`
and checked on the trainer's own objects when the callback is set up (:func:`check_supported`), so that an unsupported
Lightning fails with one clear message instead of an ``AttributeError`` deep inside a training loop. Both namespaces
(``lightning.pytorch`` and ``pytorch_lightning``) are served: whatever is needed is looked up in the namespace the
trainer comes from, never imported from one the user may not have installed.

A release that changed a stock method the overrides rely on (:mod:`lightning_midepoch._source_check`) runs with a
warning naming what differs (``LIGHTNING_MIDEPOCH_UNVERIFIED=1`` makes it an informational message); a trainer that
lacks a name the overrides use is left to Lightning (the callback steps aside for that fit, with a warning). A fit is
never refused.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from packaging.version import Version

from lightning_midepoch import _fingerprints
from lightning_midepoch._private import (
    REQUIRED_ATTRIBUTES,
    REQUIRED_COMBINED_LOADER_ATTRIBUTES,
    REQUIRED_FETCHER_ATTRIBUTES,
    SIGTERM_EXCHANGE,
    TORCH_PRIVATE_NAMES,
)
from lightning_midepoch._source_check import changed_methods

if TYPE_CHECKING:
    from lightning.pytorch import Trainer
    from lightning.pytorch.utilities.combined_loader import CombinedLoader

#: The Lightning releases the overrides are written and tested against.
SUPPORTED_MIN = Version("2.5.0")
SUPPORTED_BELOW = Version("2.7.0")
SUPPORTED_RANGE = f">={SUPPORTED_MIN},<{SUPPORTED_BELOW}"

#: The module a Lightning that carries the upstream change (upstream/0001) has: it resumes mid-epoch itself.
NATIVE_RESUME_MODULE = "loops._mid_epoch"

#: Set to ``1`` to take note of an unchecked Lightning release: its warning becomes an informational message.
UNVERIFIED_ENV = "LIGHTNING_MIDEPOCH_UNVERIFIED"

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
      (:data:`~lightning_midepoch._source_check.CHECKED_METHODS`), runs with a warning naming what differs (an
      informational message instead with ``LIGHTNING_MIDEPOCH_UNVERIFIED=1``, for a user who has read it): the
      overrides call the release's own code, and a resume whose batch check fails (the last batch trained, loaded
      again, differs) is still warned before training.
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


def batch_end_hooks_kept(trainer: Trainer, objects: list[Any]) -> list[str]:
    """Of the LightningModule and callbacks given, those whose ``on_train_batch_end`` changes what checkpoints hold.

    As far as can be known without running it: the module's, if overridden (its weights are in every checkpoint); a
    callback's, if overridden and the callback keeps checkpoint state (``state_dict`` or ``on_save_checkpoint``), other
    than Lightning's checkpoint callbacks (they write files, and Lightning runs them after every other callback).
    Each is named ``Class.on_train_batch_end``.
    """
    package = _pytorch_module(trainer)
    is_overridden = importlib.import_module(f"{package}.utilities.model_helpers").is_overridden
    checkpoint = importlib.import_module(f"{package}.callbacks").Checkpoint
    module = importlib.import_module(package).LightningModule
    kept = []
    for obj in objects:
        if not is_overridden("on_train_batch_end", obj):
            continue
        if isinstance(obj, module) or (
            not isinstance(obj, checkpoint)
            and (is_overridden("state_dict", obj) or is_overridden("on_save_checkpoint", obj))
        ):
            kept.append(f"{type(obj).__name__}.on_train_batch_end")
    return kept


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


def pending_loader_states(fit_loop: Any) -> list[Any]:
    """The stateful train loaders' states the fit loop restored but has not given them (an empty list once it has).

    Lightning gives them their states only when it resumes inside an epoch (its fit loop is restarting).
    """
    return list(getattr(fit_loop, "_combined_loader_states_to_load", None) or [])


def load_loader_states(fit_loop: Any, combined_loader: CombinedLoader) -> None:
    """Give the stateful train loaders the states the fit loop restored, as Lightning does on a mid-epoch resume."""
    combined_loader._load_state_dicts(fit_loop._combined_loader_states_to_load)
    fit_loop._combined_loader_states_to_load = []


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
