"""``lightning-midepoch inspect``: say where a checkpoint will resume, and how exactly, before resuming it.

The checkpoint is read with Lightning's own loader (local paths and every fsspec URL Lightning accepts), weights-only
unless the user trusts the file, and never written to. :func:`analyse` turns the loaded dict into a :class:`Report`
without touching anything else, and :func:`render_text` / :func:`render_json` print it.

Where the resumed run continues is :func:`lightning_midepoch._restart.checkpoint_point`: the model of a restart that
the runtime's restart decisions share, read from Lightning's progress counters (see :mod:`lightning_midepoch._restart`),
assuming the resumed ``Trainer`` has :class:`~lightning_midepoch.MidEpochResume` attached.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import json
import os
import pickle
import warnings
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from packaging.version import Version

from lightning_midepoch import _compat, _restart, _validate
from lightning_midepoch import _state as S
from lightning_midepoch.__about__ import __version__
from lightning_midepoch._restart import (
    BATCH_END,
    BETWEEN_EPOCHS,
    EPOCH_END,
    EPOCH_START,
    IN_BATCH,
    STOPPED,
    UNKNOWN,
    Counts,
    ResumePoint,
    _get,
    _is_int,
)

#: The version of the ``--json`` document; bumped only when a key is removed or changes meaning.
JSON_SCHEMA_VERSION = 1
#: Where Lightning stores the callback's state: its default ``state_key``, the class name.
STATE_KEY = "MidEpochResume"

EXACT = "exact"
CAVEATS = "caveats"
NOT_POSSIBLE = "not_possible"
#: The exit status of ``inspect`` for each verdict; bad input (and a bad command line) exits with ``EXIT_BAD_INPUT``.
EXIT_CODES = {EXACT: 0, CAVEATS: 1, NOT_POSSIBLE: 2}
EXIT_BAD_INPUT = 3

# how a train dataloader continues (``LoaderReport.continues``)
EXACTLY = "exactly"
FRESH_ORDER = "from_fresh_order"
EPOCH_RESTART = "from_epoch_start"
NEW_EPOCH = "new_epoch"

_RNG_KEYS = ("torch", "numpy", "python")
_WITHOUT_CALLBACK = (
    "resume without MidEpochResume: Lightning then ignores its state and continues as stock Lightning does (a"
    " freshly drawn order for the rest of the epoch, fresh random states)"
)
_ON_MISMATCH = 'MidEpochResume(on_mismatch="restart_epoch")'


class InspectError(Exception):
    """The input cannot be inspected (missing, unreadable, not a Lightning checkpoint); the message is one line."""


# ---------------------------------------------------------------------------------------------- report
@dataclass
class LoaderReport:
    """One train dataloader as MidEpochResume recorded it, and how it continues (see ``docs/inspect.md``)."""

    index: int
    kind: str
    dataset_length: int | None
    batch_size: int | None
    drop_last: bool
    num_batches: int | None
    order: str
    seed_determined: bool
    pass_index: int | None
    batches_consumed: int | None
    samples_consumed: int | None
    snapshot_present: bool | None
    continues: str
    num_workers: int | None = None  # the DataLoader worker processes whose states were recorded (None: none)
    worker_states: int | None = None  # worker states the checkpoint holds, over all ranks
    worker_states_expected: int | None = None  # ... and how many a resume continues (num_workers on each rank)


@dataclass
class StateInfo:
    """The MidEpochResume entry of the checkpoint."""

    present: bool
    version: Any = None
    bytes: int | None = None
    mode: str | None = None


@dataclass
class RngInfo:
    """Which ranks' process-wide random states the checkpoint holds."""

    ranks_present: list[int] = field(default_factory=list)
    ranks_missing: list[int] = field(default_factory=list)
    all_present: bool = False
    cuda: bool = False


@dataclass
class LastBatchInfo:
    """Whether the checkpoint carries the batch check's entry: the last batch trained, which a resumed run compares."""

    ranks_present: list[int] = field(default_factory=list)
    parts: int | None = None  # the parts of rank 0's batch described one by one
    why_absent: str | None = None


@dataclass
class Blocker:
    """Why a resume is not possible, and what to do instead."""

    reason: str
    opt_out: str


@dataclass
class Report:
    """Everything ``inspect`` says about one checkpoint; :meth:`to_json` is the ``--json`` document."""

    path: str
    written_by: dict[str, str | None]
    installed: dict[str, str]
    resume: ResumePoint
    global_step: int
    world_size: int | None
    state: StateInfo
    rng: RngInfo = field(default_factory=RngInfo)
    last_batch: LastBatchInfo = field(default_factory=LastBatchInfo)
    loaders: list[LoaderReport] | None = None
    verdict: str = EXACT
    blockers: list[Blocker] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)
    conditions: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """The command's exit status for this report's verdict."""
        return EXIT_CODES[self.verdict]

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document (schema version :data:`JSON_SCHEMA_VERSION`)."""
        return {"schema_version": JSON_SCHEMA_VERSION, **asdict(self), "exit_code": self.exit_code}


def _str_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def _installed_lightning() -> tuple[str, str]:
    """The Lightning package importable here (``lightning`` first) and its version."""
    name = "lightning" if importlib.util.find_spec("lightning") is not None else "pytorch_lightning"
    return name, str(importlib.import_module(name).__version__)


def _state_bytes(state: object) -> int:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.tell()


def _state_problem(state: Mapping[str, Any], epoch: int) -> str | None:
    """What makes an intact MidEpochResume state unusable with this checkpoint, or ``None``."""
    if not S.records_position(state):
        return None  # written before the trainer trained with the callback: nothing in progress
    # written once training stopped early: Lightning may already count the stopped epoch as finished, the state not
    expected = (epoch - 1, epoch) if state[S.KEY_STOPPED] is True else (epoch,)
    if state[S.KEY_EPOCH] not in expected:
        return f"its epoch ({state[S.KEY_EPOCH]!r}) is not the checkpoint's ({epoch})"
    return None


def _rank_entry(ranks: Sequence[Mapping[str, Any] | None], rank: int, key: str, index: int | None = None) -> object:
    """``ranks[rank][key]`` (``[index]``), or ``None`` where the checkpoint holds nothing for that rank."""
    entry = _get(ranks[rank], key) if rank < len(ranks) else None
    if index is None:
        return entry
    return entry[index] if isinstance(entry, list) and index < len(entry) else None


def _rng_of(ranks: Sequence[Mapping[str, Any] | None], rank: int) -> Mapping[str, Any] | None:
    """The process-wide random states saved for ``rank``, if complete."""
    rng = _rank_entry(ranks, rank, S.KEY_RNG)
    return rng if isinstance(rng, Mapping) and all(key in rng for key in _RNG_KEYS) else None


def _samples(batches: int, batch_size: int | None, dataset_length: int | None) -> int | None:
    if batch_size is None:
        return None
    return batches * batch_size if dataset_length is None else min(batches * batch_size, dataset_length)


def _consumed(
    point: ResumePoint, mode: str, facts: Mapping[str, Any], recorded_pass: int | None = None
) -> tuple[int | None, int | None, int | None]:
    """The pass a loader is in (a cycling loader restarts within the epoch), its batches and samples consumed."""
    if point.batch is None:
        return None, None, None
    num_batches, batch_size, length = facts.get("num_batches"), facts.get("batch_size"), facts.get("dataset_length")
    if num_batches is None:  # an iterable loader without a length: one pass
        return 0, point.batch, _samples(point.batch, batch_size, length)
    pass_index, into_pass = S.loader_position(mode, point.batch, num_batches, recorded_pass)
    per_pass, in_pass = _samples(num_batches, batch_size, length), _samples(into_pass, batch_size, length)
    samples = None if per_pass is None or in_pass is None else pass_index * per_pass + in_pass
    return pass_index, pass_index * num_batches + into_pass, samples


def _loader_report(
    index: int, facts: Mapping[str, Any], point: ResumePoint, state: Mapping[str, Any], loader_state_saved: bool
) -> LoaderReport:
    """How train dataloader ``index`` continues, from the facts and records of a valid MidEpochResume state."""
    kind = facts["kind"]
    ranks, world_size = state[S.KEY_RANKS], state[S.KEY_WORLD_SIZE]
    records = [_rank_entry(ranks, rank, S.KEY_PASSES, index) for rank in range(world_size)]
    # a cycling loader written inside the batch that started its next pass is in that pass (as the resume sees it)
    first = _get(records[0], "index")
    recorded_pass = first if isinstance(first, int) and _get(records[0], "epoch") == point.epoch else None
    pass_index, batches, samples = _consumed(point, state[S.KEY_MODE], facts, recorded_pass)
    seed_determined = facts.get("seed_determined") is True
    if kind == S.KIND_MAP:
        # the order of the pass the loader is in, for the epoch the run continues, on every rank
        present = all(_get(r, "epoch") == point.epoch and _get(r, "index") == pass_index for r in records)
        fallback = EXACTLY if seed_determined else FRESH_ORDER
    elif kind == S.KIND_ITERABLE:
        present = all(_rank_entry(ranks, rank, S.KEY_DATASET_STATES, index) is not None for rank in range(world_size))
        # read in workers: each worker's copy saved its own position with the worker's states
        present = present or _worker_states_complete(ranks, world_size, index)
        fallback = EPOCH_RESTART
    else:
        present, fallback = loader_state_saved, EPOCH_RESTART
    if point.saved_at == UNKNOWN:
        continues = UNKNOWN
    elif point.continues_epoch:
        continues = EXACTLY if present else fallback
    else:
        continues = NEW_EPOCH
    workers = [_rank_entry(ranks, rank, S.KEY_WORKERS, index) for rank in range(world_size)]
    recorded = [entry for entry in workers if isinstance(entry, Mapping)]
    num_workers = recorded[0].get("num_workers") if recorded else None
    worker_states = (
        sum(1 for entry in recorded for worker in entry.get("workers", []) if _get(worker, "state") is not None)
        if recorded
        else None
    )
    return LoaderReport(
        num_workers=num_workers if _is_int(num_workers) else None,
        worker_states=worker_states,
        worker_states_expected=num_workers * world_size if _is_int(num_workers) else None,
        index=index,
        kind=kind,
        dataset_length=facts.get("dataset_length"),
        batch_size=facts.get("batch_size"),
        drop_last=bool(facts.get("drop_last")),
        num_batches=facts.get("num_batches"),
        order=facts["order"],
        seed_determined=seed_determined,
        pass_index=pass_index,
        batches_consumed=batches,
        samples_consumed=samples,
        snapshot_present=None if continues == NEW_EPOCH else present,
        continues=continues,
    )


def _worker_states_complete(ranks: Sequence[Mapping[str, Any] | None], world_size: int, index: int) -> bool:
    entries = [_rank_entry(ranks, rank, S.KEY_WORKERS, index) for rank in range(world_size)]
    return all(
        isinstance(entry, Mapping) and all(_get(worker, "state", "dataset") is not None for worker in entry["workers"])
        for entry in entries
    )


def _loader_caveat(loader: LoaderReport, epoch: int) -> str | None:
    where = f"Train dataloader {loader.index} ({loader.order})"
    if loader.continues == FRESH_ORDER:
        return (
            f"{where} recorded no order for epoch {epoch} and its order is not determined by a seed: the rest of the"
            " epoch is drawn from a fresh order, so some of its samples are seen twice and others not at all."
        )
    if loader.continues == EPOCH_RESTART and loader.kind == S.KIND_ITERABLE:
        return (
            f"{where} iterates over an IterableDataset that saved no state of its own: its iteration restarts from"
            f" the beginning for the rest of epoch {epoch}. Give the dataset state_dict()/load_state_dict() (read"
            " in the main process or in each worker), or use torchdata's StatefulDataLoader, to resume it exactly."
        )
    if loader.continues == EPOCH_RESTART:
        return f"{where} is a stateful loader but the checkpoint holds no loader state for it: it restarts its epoch."
    return None


def _workers_caveat(loader: LoaderReport) -> str | None:
    expected, held = loader.worker_states_expected, loader.worker_states
    if expected is None or held is None or held >= expected:
        return None
    return (
        f"Train dataloader {loader.index} holds the random states of {held} of its {expected} DataLoader workers:"
        " the others start afresh, so what the dataset draws in them (augmentation) differs after the resume."
    )


def _workers_condition(loader: LoaderReport) -> str | None:
    if loader.num_workers is None:
        return None
    return (
        f"Train dataloader {loader.index} read its batches in {loader.num_workers} worker process(es), whose random"
        f" states the checkpoint holds ({loader.worker_states} recorded): their augmentation continues exactly with"
        f" num_workers={loader.num_workers}; with another number the resumed run warns and draws it afresh."
    )


def analyse(checkpoint: Mapping[str, Any], path: str) -> Report:
    """Say where and how exactly a loaded Lightning checkpoint resumes (reads ``checkpoint`` only).

    Args:
        checkpoint: The loaded checkpoint, with ``epoch``, ``global_step`` and ``state_dict`` (see
            :func:`load_checkpoint`).
        path: The path or URL it was read from, for the report.

    """
    raw_state = _get(checkpoint, "callbacks", STATE_KEY)
    installed = _installed_lightning()
    point = _restart.checkpoint_point(checkpoint, STATE_KEY)
    report = Report(
        path=path,
        written_by={
            "lightning": _str_or_none(checkpoint.get("pytorch-lightning_version")),
            "lightning_midepoch": _str_or_none(_get(raw_state, S.KEY_PACKAGE_VERSION)),
            "torch": _str_or_none(_get(raw_state, S.KEY_TORCH_VERSION)),
        },
        installed={
            "lightning": installed[1],
            "lightning_package": installed[0],
            "lightning_midepoch": __version__,
            "torch": str(torch.__version__),
        },
        resume=point,
        global_step=checkpoint["global_step"],
        world_size=None,
        state=StateInfo(present=raw_state is not None),
    )
    # (the metadata of a sharded checkpoint has neither model nor optimizer states: they are in its shards)
    sharded = "state_dict" not in checkpoint and "lr_schedulers" in checkpoint
    if not sharded and ("optimizer_states" not in checkpoint or "lr_schedulers" not in checkpoint):
        report.blockers.append(
            Blocker(
                "The checkpoint holds only the model (no optimizer or scheduler states, as"
                " ModelCheckpoint(save_weights_only=True) writes): trainer.fit(ckpt_path=...) cannot resume training"
                " from it.",
                "Load the weights with YourModule.load_from_checkpoint(...) and start a new fit, or resume from a"
                " full checkpoint.",
            )
        )
    if not _compat.SUPPORTED_MIN <= Version(installed[1]) < _compat.SUPPORTED_BELOW:
        package, version = installed
        report.blockers.append(
            Blocker(
                f"MidEpochResume supports {package}{_compat.SUPPORTED_RANGE}, but {package} {version} is installed"
                " here: the callback stops when the resumed fit starts.",
                f"Resume where a supported release is installed (pip install '{package}{_compat.SUPPORTED_RANGE}'),"
                f" or {_WITHOUT_CALLBACK}.",
            )
        )
    batch, trained = point.batch, point.batches_trained
    if batch is None or trained is None:
        report.caveats.append(_unknown_position_caveat(checkpoint))
    elif batch != trained:
        report.caveats.append(_drift_caveat(point.epoch, batch, trained))
    report.conditions.append("Attach MidEpochResume() to the resumed Trainer (this report assumes it).")
    if raw_state is None:
        _analyse_stock(report, point)
    else:
        _analyse_state(report, checkpoint, raw_state)
    report.verdict = NOT_POSSIBLE if report.blockers else CAVEATS if report.caveats else EXACT
    return report


def _unknown_position_caveat(checkpoint: Mapping[str, Any]) -> str:
    fit_loop = _get(checkpoint, "loops", "fit_loop")
    epochs = Counts.parse(_get(fit_loop, "epoch_progress", "total"))
    batches = Counts.parse(_get(fit_loop, "epoch_loop.batch_progress", "current"))
    if epochs is None or batches is None:
        found = "the checkpoint has no loop progress"
    else:
        found = f"epochs: {epochs}; batches of the epoch: {batches}"
    return (
        f"inspect cannot tell where the resumed run continues ({found}): it matches none of the points Lightning"
        " writes checkpoints at."
    )


def _drift_caveat(epoch: int, batch: int, trained: int) -> str:
    first, last = sorted((batch, trained))
    batches = f"batch_idx {first}" if last - first == 1 else f"batch_idx {first} to {last - 1}"
    what = f"{batches} of epoch {epoch} {'is' if last - first == 1 else 'are'}"
    what += " trained twice" if batch < trained else " skipped"
    return (
        "Lightning's total batch counters disagree with this epoch's (as an earlier resume from inside a batch"
        f" leaves them): it continues with batch_idx {batch} although the checkpoint was trained on {trained}"
        f" batches of the epoch, so {what}."
    )


def _analyse_stock(report: Report, point: ResumePoint) -> None:
    """A checkpoint written without MidEpochResume: say what is missing and what a resume will do."""
    report.caveats.append(
        "The checkpoint was written without MidEpochResume and holds no random states: the resumed run draws its"
        " data order (shuffle) and the random numbers of dropout and augmentation from fresh states, so its random"
        " draws differ from the uninterrupted run's."
    )
    if point.continues_epoch:
        report.caveats.append(
            f"It was written in the middle of epoch {point.epoch} and does not record how the train dataloaders draw"
            f" their order. The epoch continues at batch_idx {point.batch} exactly only where the order is fixed or"
            " determined by a seed and the epoch (SequentialSampler, DistributedSampler); a random order"
            " (shuffle=True) is drawn afresh for the remaining batches, so some samples of the epoch are seen twice"
            " and others not at all. inspect cannot tell which from a checkpoint written without MidEpochResume."
        )


def _state_blocker(problem: str) -> Blocker:
    return Blocker(
        f"The checkpoint's MidEpochResume state is malformed ({problem}): MidEpochResume cannot resume from it.",
        f"Resume from an intact copy of the checkpoint, or {_WITHOUT_CALLBACK}.",
    )


def _damage_blocker(error: _validate.DamagedStateError) -> Blocker:
    return Blocker(
        f"The checkpoint's MidEpochResume state is damaged: {error.problem} MidEpochResume stops with a"
        " MidEpochResumeError naming that field when the resumed fit starts.",
        f"Resume from an earlier checkpoint, use {_ON_MISMATCH} to resume without the callback's state, or"
        f" {_WITHOUT_CALLBACK}.",
    )


def _analyse_state(report: Report, checkpoint: Mapping[str, Any], raw_state: object) -> None:
    """A checkpoint with a MidEpochResume state: check it and say how each rank and loader continues."""
    if not isinstance(raw_state, Mapping):
        report.blockers.append(_state_blocker(f"it is a {type(raw_state).__name__}, not a dict"))
        return
    report.state.version = raw_state.get(S.KEY_VERSION)
    report.state.bytes = _state_bytes(raw_state)
    try:
        state = _validate.checked(raw_state)
    except _validate.DamagedStateError as error:
        report.blockers.append(_damage_blocker(error))
        return
    except S.MidEpochResumeError as error:
        report.blockers.append(Blocker(str(error), f"Upgrade lightning-midepoch, or {_WITHOUT_CALLBACK}."))
        return
    problem = _state_problem(state, checkpoint["epoch"])
    if problem is not None:
        report.blockers.append(_state_blocker(problem))
        return
    ranks: list[Mapping[str, Any] | None] = state[S.KEY_RANKS]
    if not ranks:
        report.loaders = []
        report.caveats.append(
            "The MidEpochResume state was written before the trainer trained with the callback (e.g. by"
            " trainer.save_checkpoint before fit) and holds no random states: the resumed run draws them afresh."
        )
        return
    world_size: int = state[S.KEY_WORLD_SIZE]
    report.world_size = world_size
    report.state.mode = state[S.KEY_MODE]
    states = [_rng_of(ranks, rank) for rank in range(world_size)]
    present = [rank for rank, rng in enumerate(states) if rng is not None]
    missing = [rank for rank, rng in enumerate(states) if rng is None]
    cuda = any(rng is not None and "cuda" in rng for rng in states)
    report.rng = RngInfo(present, missing, not missing, cuda)
    if missing:
        report.caveats.append(
            f"No random states for rank(s) {', '.join(map(str, missing))} of {world_size}: there, dropout,"
            " augmentation and the orders of later epochs draw from fresh states."
        )
    report.last_batch = _last_batch_info(ranks, world_size, report.resume)
    loader_states = _get(checkpoint, "loops", "fit_loop", "state_dict", "combined_loader")
    stateful_saved = isinstance(loader_states, list) and len(loader_states) > 0
    point = report.resume
    report.loaders = [
        _loader_report(index, facts, point, state, stateful_saved) for index, facts in enumerate(state[S.KEY_LOADERS])
    ]
    report.caveats += [caveat for loader in report.loaders if (caveat := _loader_caveat(loader, point.epoch))]
    report.caveats += [caveat for loader in report.loaders if (caveat := _workers_caveat(loader))]
    report.conditions += [condition for loader in report.loaders if (condition := _workers_condition(loader))]
    if point.continues_epoch:
        report.conditions.append(
            f"The verdict assumes the resumed run has {world_size} device(s) and the same"
            f" {len(report.loaders)} train dataloader(s) (dataset lengths, batch sizes, drop_last and samplers as"
            " listed). Where the dataloaders differ, MidEpochResume stops with a MidEpochResumeError saying what"
            f" differs; {_ON_MISMATCH} continues the epoch from a fresh order instead."
        )
        report.conditions.append(_elastic_condition(state[S.KEY_LOADERS], world_size))
    if point.saved_at == IN_BATCH:
        report.conditions.append(
            "It was written inside a batch: Lightning runs that batch again, from the random states (torch, numpy,"
            " Python) it started with. Not exact where training_step takes dataloader_iter (a step that pulls its own"
            " batches: the resumed run warns) or after a backward pass whose gradients an optimizer step had not"
            " used yet (they are added again: a warning said so when the checkpoint was written)."
        )
    grads = [rank.get(S.KEY_GRADS) for rank in state[S.KEY_RANKS] if isinstance(rank, Mapping)]
    if any(grads):
        report.conditions.append(
            "It holds gradients not yet used by an optimizer step (inside a gradient accumulation group, or between"
            " manual optimization's backward passes and its step): they are saved and restored on the same number"
            f" of devices ({world_size}); on another number they are dropped and the group restarts."
        )


def _last_batch_info(ranks: Sequence[Mapping[str, Any] | None], world_size: int, point: ResumePoint) -> LastBatchInfo:
    entries = [_rank_entry(ranks, rank, S.KEY_LAST_BATCH) for rank in range(world_size)]
    present = [rank for rank, entry in enumerate(entries) if isinstance(entry, Mapping)]
    if present:
        leaves = _get(entries[present[0]], "fingerprint", "leaves")
        return LastBatchInfo(present, len(leaves) if isinstance(leaves, Mapping) else None)
    if point.saved_at == IN_BATCH:
        why = "written inside a batch: the resumed run runs that batch again, with nothing to compare it with"
    elif not point.continues_epoch:
        why = "written at an epoch's end: the resumed run starts the next epoch"
    else:
        why = (
            "the last batch trained cannot be loaded again as it was: training_step(dataloader_iter), train loaders"
            " that keep their own position or are left to Lightning, an iterable without a position of its own (it"
            " restarts), a loader without a length read in the main process, or"
            ' MidEpochResume(verify_batch="off") or an earlier release'
        )
    return LastBatchInfo(why_absent=why)


def _elastic_condition(loaders: Sequence[Mapping[str, Any]], world_size: int) -> str:
    """Whether the interrupted epoch could also be finished on another number of devices (elastic resume)."""
    try:
        S.check_elastic(loaders, world_size, world_size + 1, _ON_MISMATCH)
    except S.MidEpochResumeError as error:
        reason = str(error).split("cannot be re-sharded: ", 1)[-1].split(". Resume on", 1)[0]
        return (
            f"On another number of devices this epoch cannot be finished exactly ({reason}): resume on {world_size}"
            f" device(s), or use {_ON_MISMATCH}."
        )
    return (
        "On another number of devices the interrupted epoch is finished elastically: every sample it had not"
        " consumed is trained once across the new devices (see the docs' page 'Distributed and elastic resume')."
    )


# ---------------------------------------------------------------------------------------------- loading
def _cloud_io() -> Any:
    """Lightning's ``cloud_io`` module (its loader accepts local paths and fsspec URLs), from either namespace."""
    try:
        return importlib.import_module("lightning.fabric.utilities.cloud_io")
    except ImportError:  # only pytorch-lightning (and lightning-fabric) is installed
        return importlib.import_module("lightning_fabric.utilities.cloud_io")


def one_line(error: BaseException) -> str:
    """An exception as one line: its type and its message with whitespace collapsed."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _weights_only_reason(error: BaseException) -> str:
    """The reason torch gives for refusing a weights-only load, shortened to its first sentence."""
    text = str(error)
    marker = "WeightsUnpickler error:"
    reason = text.split(marker, 1)[1] if marker in text else text
    reason = " ".join(reason.split())
    return reason.split(". ", 1)[0].rstrip(".")


#: The file of a sharded checkpoint (a directory: FSDP's ``state_dict_type="sharded"``, ``ModelParallelStrategy``)
#: that holds everything but the model and optimizer shards, the callbacks' states included (Lightning's name).
SHARDED_METADATA = "meta.pt"


def _check_exists(path: str, cloud_io: Any) -> bool:
    """Raise if ``path`` is no checkpoint; return whether it is a sharded checkpoint's directory."""
    if path.startswith("http"):  # Lightning downloads these with torch.hub, not fsspec
        return False
    try:
        filesystem = cloud_io.get_filesystem(path)
        exists, is_dir = filesystem.exists(path), filesystem.isdir(path)
        sharded = is_dir and filesystem.isfile(f"{path.rstrip('/')}/{SHARDED_METADATA}")
    except Exception as error:  # an unknown protocol, a missing fsspec backend, no access
        raise InspectError(f"cannot open {path}: {one_line(error)}") from None
    if not exists:
        raise InspectError(f"{path}: no such file")
    if is_dir and not sharded:
        raise InspectError(f"{path} is a directory, not a checkpoint file")
    return bool(sharded)


def _load(path: str, trust: bool, load: Callable[..., Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's notes on pickle protocols and weights_only
        try:
            return load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as error:
            if not trust:
                raise InspectError(
                    f"{path} holds objects a weights-only load refuses ({_weights_only_reason(error)}). If it is a"
                    " checkpoint from a source you trust, rerun with --trust to load it with weights_only=False"
                    " (which can run code stored in the file)."
                ) from None
        except Exception as error:
            raise _unreadable(path, error) from None
        try:
            return load(path, map_location="cpu", weights_only=False)
        except Exception as error:
            raise _unreadable(path, error) from None


def _unreadable(path: str, error: BaseException) -> InspectError:
    truncation = _truncation(path)
    if truncation is not None:
        return InspectError(
            f"cannot read {path} as a checkpoint: it is TRUNCATED ({truncation}). A process was stopped while writing"
            " or copying it: resume from the checkpoint before it (with SLURM, move this file aside; the requeued job"
            " then restores the newest whole hpc checkpoint)."
        )
    return InspectError(
        f"cannot read {path} as a checkpoint: it is corrupted or not written by torch.save ({one_line(error)})"
    )


def _truncation(path: str) -> str | None:
    """How a local file that ``torch.save`` began reads as cut short: empty, or a zip archive without its end.

    ``torch.save`` writes a zip archive, whose directory comes last: a file that begins as one but lacks that end
    was cut short. (Files elsewhere than on a local disk are not examined.)

    Example:
        >>> import os, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> whole, cut = os.path.join(folder, "whole.ckpt"), os.path.join(folder, "cut.ckpt")
        >>> import torch
        >>> torch.save({"a": torch.zeros(1000)}, whole)
        >>> with open(whole, "rb") as source, open(cut, "wb") as target:
        ...     _ = target.write(source.read()[:2000])
        >>> _truncation(whole) is None, _truncation(cut)
        (True, 'a zip archive without its end: 2,000 bytes')

    """
    if not os.path.isfile(path):
        return None
    size = os.path.getsize(path)
    if size == 0:
        return "an empty file"
    with open(path, "rb") as file:
        begins_as_zip = file.read(4) == b"PK\x03\x04"
    if begins_as_zip and not zipfile.is_zipfile(path):
        return f"a zip archive without its end: {size:,} bytes"
    return None


def load_checkpoint(path: str, trust: bool = False) -> dict[str, Any]:
    """Load a Lightning checkpoint read-only with Lightning's own loader (local path or fsspec URL), on the CPU.

    Args:
        path: A local path or any URL Lightning accepts for ``ckpt_path``.
        trust: Retry with ``weights_only=False`` if a weights-only load refuses an object in the file.

    Raises:
        InspectError: With a one-line message, if the file is missing, unreadable or not a Lightning checkpoint.

    """
    cloud_io = _cloud_io()
    sharded = _check_exists(path, cloud_io)
    checkpoint = _load(f"{path.rstrip('/')}/{SHARDED_METADATA}" if sharded else path, trust, cloud_io._load)
    if not isinstance(checkpoint, dict):
        raise InspectError(f"{path} is not a Lightning checkpoint: it holds a {type(checkpoint).__name__}, not a dict")
    # a sharded checkpoint keeps the model and optimizer states in its shards, not in its metadata file
    required = ("epoch", "global_step") if sharded else ("epoch", "global_step", "state_dict")
    missing = [key for key in required if key not in checkpoint]
    if missing:
        keys = ", ".join(repr(key) for key in list(checkpoint)[:6]) or "none"
        raise InspectError(f"{path} is not a Lightning checkpoint: it has no {', '.join(missing)} (its keys: {keys})")
    for key in ("epoch", "global_step"):
        if not _is_int(checkpoint[key]):
            raise InspectError(f"{path} is not a Lightning checkpoint: its {key!r} is not an int")
    return checkpoint


# ---------------------------------------------------------------------------------------------- rendering
_VERDICT_TEXT = {
    EXACT: "EXACT: the resumed run continues as the uninterrupted run would have",
    CAVEATS: "CAVEATS: the resume runs, but not exactly as the uninterrupted run would have",
    NOT_POSSIBLE: "NOT POSSIBLE: the resume stops (see why, and the opt-out)",
}
_CONTINUES_TEXT = {
    EXACTLY: "continues exactly",
    FRESH_ORDER: "continues from a fresh order",
    EPOCH_RESTART: "restarts its epoch",
    UNKNOWN: "unknown",
}


def _saved_text(point: ResumePoint) -> str:
    epoch, trained = point.epoch, point.batches_trained
    if point.saved_at == EPOCH_START:
        return f"in on_train_epoch_start of epoch {epoch}"
    if point.saved_at == EPOCH_END:
        return f"at the end of epoch {epoch - 1} (on_train_epoch_end)"
    if point.saved_at == BETWEEN_EPOCHS:
        return "before the first epoch" if epoch == 0 else f"between epochs, after epoch {epoch - 1} finished"
    if point.saved_at == STOPPED and trained is not None:
        return (
            f"after training stopped early in epoch {epoch}, after batch_idx {trained - 1} (max_steps, max_time or"
            " trainer.should_stop)"
        )
    if trained is None:
        return "at a point inspect does not recognise"
    if point.saved_at == BATCH_END:
        return f"in on_train_batch_end of batch_idx {trained - 1}, epoch {epoch}"
    if point.saved_at == IN_BATCH:
        return f"inside batch_idx {trained} of epoch {epoch}, before it finished"
    if trained == 0:
        return f"in epoch {epoch}, before its first batch"
    return f"after batch_idx {trained - 1} of epoch {epoch} completed (e.g. in the validation after it)"


def _resumes_text(point: ResumePoint) -> str:
    if point.batch is None:
        return f"unknown (epoch {point.epoch})"
    if point.epoch_done:
        return (
            f"the end of epoch {point.epoch}: no batch is left, its validation and epoch-end hooks run, then epoch"
            f" {point.epoch + 1} starts at batch_idx 0"
        )
    if not point.continues_epoch:
        return f"the start of epoch {point.epoch} (batch_idx 0)"
    text = f"epoch {point.epoch}, batch_idx {point.batch}"
    if point.batch != point.batches_trained:
        return text
    if point.saved_at == IN_BATCH:
        return f"{text} again (it had not finished)"
    if point.saved_at == BATCH_END:
        return f"{text} (first the rest of batch_idx {point.batch - 1}: a validation or scheduler step due after it)"
    return text


def _na(value: object) -> str:
    return "?" if value is None else str(value)


def _versions_text(report: Report) -> str:
    written = report.written_by
    versions = [f"lightning {_na(written['lightning'])}"]
    if report.state.present:
        versions += [f"lightning-midepoch {_na(written['lightning_midepoch'])}", f"torch {_na(written['torch'])}"]
    else:
        versions.append("without MidEpochResume")
    return ", ".join(versions)


def _rng_text(report: Report) -> str:
    rng = report.rng
    if rng.all_present:
        text = f"present for every rank ({len(rng.ranks_present)} of {report.world_size})"
    elif rng.ranks_present:
        text = f"missing for rank(s) {', '.join(map(str, rng.ranks_missing))} of {report.world_size}"
    else:
        text = "not saved"
    return text + (", CUDA included" if rng.cuda else "")


def _last_batch_text(report: Report) -> str:
    info = report.last_batch
    if info.ranks_present:
        ranks = "every rank" if len(info.ranks_present) == report.world_size else f"rank(s) {info.ranks_present}"
        return (
            f"last batch trained fingerprinted for {ranks} ({_na(info.parts)} parts): the resumed run loads it"
            " again and compares it before training"
        )
    if info.why_absent is None:
        return "no fingerprint"
    return f"no fingerprint ({info.why_absent}): the resumed run cannot check its batches"


def _state_text(state: StateInfo) -> str:
    if not state.present:
        return "absent (written without the callback)"
    if state.bytes is None:
        return "present, not a dict"
    return f"state version {state.version!r}, adds {state.bytes:,} bytes ({state.bytes / 1024:.1f} KiB)"


def _order_text(loader: LoaderReport) -> str:
    if loader.kind == S.KIND_MAP:
        source = loader.order
        recorded = "snapshot present" if loader.snapshot_present else "no snapshot"
        if loader.snapshot_present is False and loader.seed_determined:
            recorded += " (determined by its seed: none needed)"
    elif loader.kind == S.KIND_ITERABLE:
        source = f"IterableDataset via {loader.order}"
        recorded = "dataset state saved" if loader.snapshot_present else "no dataset state"
    else:
        source = f"stateful loader {loader.order}"
        recorded = "loader state saved by Lightning" if loader.snapshot_present else "no loader state"
    if loader.continues == NEW_EPOCH:  # nothing recorded is needed: the order is drawn at the epoch's start
        return f"{source}; starts a new epoch (its order is drawn from the restored random states)"
    return f"{source}, {recorded}; {_CONTINUES_TEXT[loader.continues]}"


def _workers_text(loader: LoaderReport) -> str:
    exact = "continue exactly" if loader.worker_states == loader.worker_states_expected else "some start afresh"
    return (
        f"num_workers={loader.num_workers}, random states of {loader.worker_states} of"
        f" {loader.worker_states_expected} worker(s) recorded; with num_workers={loader.num_workers} they {exact}"
    )


def _table(rows: list[list[str]], indent: str) -> list[str]:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return [
        indent + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)).rstrip() for row in rows
    ]


def _loader_lines(report: Report) -> list[str]:
    if report.loaders is None:
        reason = "the checkpoint has no MidEpochResume state" if not report.state.present else "state unusable"
        return [f"Train dataloaders:  unknown ({reason})"]
    if not report.loaders:
        return ["Train dataloaders:  none recorded (the state was written before the trainer trained)"]
    lines = [f"Train dataloaders:  {len(report.loaders)} (CombinedLoader mode {report.state.mode!r})"]
    rows = [["#", "kind", "samples", "batch size", "drop_last", "batches", "consumed"]]
    for loader in report.loaders:
        consumed = f"{_na(loader.batches_consumed)} batches, {_na(loader.samples_consumed)} samples"
        if loader.pass_index:
            consumed += f" (pass {loader.pass_index + 1} of the epoch)"
        sizes = (loader.dataset_length, loader.batch_size, loader.drop_last, loader.num_batches)
        rows.append([str(loader.index), loader.kind, *map(_na, sizes), consumed])
    table = _table(rows, "  ")
    lines.append(table[0])
    for loader, row in zip(report.loaders, table[1:], strict=True):
        lines += [row, f"     order: {_order_text(loader)}"]
        if loader.num_workers is not None:
            lines.append(f"     workers: {_workers_text(loader)}")
    return lines


def render_text(report: Report) -> str:
    """The report as aligned ``key: value`` lines, a per-loader table and the verdict."""
    world_size = _na(report.world_size) if report.state.present else "unknown (not recorded)"
    lines = [
        f"Checkpoint:         {report.path}",
        f"Written by:         {_versions_text(report)}",
        f"Saved:              {_saved_text(report.resume)}",
        f"Resumes at:         {_resumes_text(report.resume)}",
        f"Global step:        {report.global_step}",
        f"World size:         {world_size}",
        f"RNG states:         {_rng_text(report)}",
        f"Batch check:        {_last_batch_text(report)}",
        f"MidEpochResume:     {_state_text(report.state)}",
        *_loader_lines(report),
        "",
        f"Verdict:            {_VERDICT_TEXT[report.verdict]}",
    ]
    for blocker in report.blockers:
        lines += [f"  - why: {blocker.reason}", f"    opt-out: {blocker.opt_out}"]
    lines += [f"  - caveat: {caveat}" for caveat in report.caveats]
    if report.verdict != NOT_POSSIBLE:
        lines += [f"  - condition: {condition}" for condition in report.conditions]
    return "\n".join(lines) + "\n"


def render_json(report: Report) -> str:
    """The report as one JSON object (see ``docs/inspect.md`` for the schema)."""
    return json.dumps(report.to_json(), indent=2) + "\n"


def inspect_checkpoint(path: str, *, trust: bool = False) -> Report:
    """Load the checkpoint at ``path`` (read-only) and analyse it.

    Raises:
        InspectError: If it cannot be read as a Lightning checkpoint.

    """
    return analyse(load_checkpoint(path, trust=trust), path)
