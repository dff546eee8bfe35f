"""Every private Lightning name this package relies on, and the check that the installed Lightning has them.

The loop and fetcher overrides in :mod:`lightning_midepoch._loops` and :mod:`lightning_midepoch._fetchers` are
written against the private attributes listed here. They are checked on the trainer's own objects when the callback
is set up, so that an unsupported Lightning fails with one clear message instead of an ``AttributeError`` deep inside
a training loop. Both namespaces (``lightning.pytorch`` and ``pytorch_lightning``) are served: whatever is needed is
looked up in the namespace the trainer comes from, never imported from one the user may not have installed.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from packaging.version import Version

if TYPE_CHECKING:
    from lightning.pytorch import Trainer
    from lightning.pytorch.utilities.combined_loader import CombinedLoader

#: The Lightning releases the overrides are written and tested against.
SUPPORTED_MIN = Version("2.5.0")
SUPPORTED_BELOW = Version("2.7.0")
SUPPORTED_RANGE = f">={SUPPORTED_MIN},<{SUPPORTED_BELOW}"

#: Private attributes used, per object, checked on the live trainer before anything is installed.
REQUIRED_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "trainer": ("_checkpoint_connector",),
    "checkpoint_connector": ("_loaded_checkpoint",),
    "fit_loop": (
        "_data_fetcher",
        "_combined_loader",
        "_last_train_dl_reload_epoch",
        "_loaded_from_state_dict",
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
        "_on_before_fetch",
        "_on_after_fetch",
        "_should_accumulate",
        "_num_ready_batches_reached",
        "batch_progress",
        "restarted_on_train_batch_end",
        "reset_restart_stage",
        "val_loop",
        "on_run_start",
        "advance",
        "reset",
    ),
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
    "_start_profiler",
    "_stop_profiler",
)
REQUIRED_COMBINED_LOADER_ATTRIBUTES = ("_iterator", "_mode", "_limits", "flattened")

#: The warning stock Lightning gives when it resumes mid-epoch without a resumable loader; ours replaces it.
STOCK_NOT_RESUMABLE_WARNING = "You're resuming from a checkpoint that ended before the epoch ended"


def namespace(obj: object) -> str:
    """The Lightning package an object comes from: ``"lightning"`` or ``"pytorch_lightning"``."""
    root = type(obj).__module__.split(".")[0]
    return root if root in ("lightning", "pytorch_lightning") else "lightning"


def lightning_version(obj: object) -> str:
    """The version of the Lightning package the object (usually the trainer) comes from."""
    return str(importlib.import_module(namespace(obj)).__version__)


def check_supported(trainer: Trainer) -> None:
    """Fail clearly if the trainer's Lightning is outside the supported range or lacks a private name we use.

    Raises:
        RuntimeError: Naming the installed version, the supported range and anything missing.

    """
    package = namespace(trainer)
    installed = lightning_version(trainer)
    if not SUPPORTED_MIN <= Version(installed) < SUPPORTED_BELOW:
        raise RuntimeError(
            f"lightning-midepoch supports {package} {SUPPORTED_RANGE}, but {package} {installed} is installed."
            f" Install a supported release (`pip install '{package}{SUPPORTED_RANGE}'`) or remove the"
            " MidEpochResume callback."
        )
    objects = {
        "trainer": trainer,
        "checkpoint_connector": getattr(trainer, "_checkpoint_connector", None),
        "fit_loop": trainer.fit_loop,
        "epoch_loop": trainer.fit_loop.epoch_loop,
    }
    missing = [
        f"{name}.{attribute}"
        for name, attributes in REQUIRED_ATTRIBUTES.items()
        for attribute in attributes
        if not hasattr(objects[name], attribute)
    ]
    if missing:
        raise RuntimeError(
            f"lightning-midepoch cannot run with {package} {installed}: the trainer's loops lack {', '.join(missing)}."
            f" Supported releases are {package}{SUPPORTED_RANGE}. If you replaced the fit loop with your own, keep"
            " Lightning's attributes on it."
        )


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


def has_callback(trainer: Trainer, name: str) -> bool:
    """Whether one of the trainer's callbacks is (a subclass of) Lightning's public callback ``name``."""
    stock = getattr(importlib.import_module(f"{_pytorch_module(trainer)}.callbacks"), name)
    return any(isinstance(callback, stock) for callback in getattr(trainer, "callbacks", ()))


def _pytorch_module(obj: object) -> str:
    """Where the object's Lightning keeps its trainer package: ``lightning.pytorch`` or ``pytorch_lightning``."""
    return "lightning.pytorch" if namespace(obj) == "lightning" else "pytorch_lightning"


def is_resuming(trainer: Trainer) -> bool:
    """The fit loop's ``is_resuming`` (Lightning 2.6; 2.5 lacks it and re-creates the iterator, which 2.6 fixed)."""
    return bool(getattr(trainer.fit_loop, "is_resuming", False))


def restoring_checkpoint(trainer: Trainer) -> bool:
    """Whether the trainer is restoring a checkpoint it loaded (not loop states a tuner copied)."""
    return bool(trainer._checkpoint_connector._loaded_checkpoint)


def steps_pull_batches(fetcher: object) -> bool:
    """Whether ``training_step`` takes ``dataloader_iter`` and pulls its batches itself (as many as it likes)."""
    stock = getattr(sys.modules[type(fetcher).__module__], "_DataLoaderIterDataFetcher", None)
    return stock is not None and isinstance(fetcher, stock)


def all_batches_reached(epoch_loop: Any) -> bool:
    """Whether the training epoch loop has run every batch its epoch has (not stopped early)."""
    return bool(epoch_loop._num_ready_batches_reached())


def epoch_finished(progress: Any) -> bool:
    """Whether the fit loop's epoch progress counts its current epoch as finished (or none started)."""
    current = progress.current
    return bool(current.ready == current.started == current.processed == current.completed)


def start_batch_progress_afresh(progress: Any) -> None:
    """Count no batch of the current epoch yet (the epoch loop's batch progress, totals kept)."""
    progress.current.reset()
    progress.is_last_batch = False


def reopen_epoch(progress: Any, epoch: int) -> None:
    """Count epoch ``epoch`` of the fit loop's epoch progress as started but not finished (resumed mid-epoch)."""
    for tracker in (progress.current, progress.total):
        if tracker.started == epoch + 1:
            tracker.processed = tracker.completed = epoch


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
