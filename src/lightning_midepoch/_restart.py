"""Where a resumed run continues: the one model of a restart, read from Lightning's progress counters.

Lightning decides where a restored fit continues from its loops' progress trackers
(``_FitLoop.update_restart_stage``, ``_TrainingEpochLoop.update_restart_stage``); with
:class:`~lightning_midepoch.MidEpochResume` attached the run continues as the uninterrupted one did (an epoch left
early continues, a batch interrupted in ``on_train_batch_end`` is finished). The predicates below say where a
checkpoint was written; :func:`resume_point` composes them into where the resumed run continues. The runtime makes its
restart decisions with the same predicates (:meth:`~lightning_midepoch._restoring.Restorer.loops_restored`, the fit
loop's override in :mod:`lightning_midepoch._loops`), and ``inspect`` reports :func:`checkpoint_point`
(:mod:`lightning_midepoch._inspect`); the test harness checks that every resume it runs continues where
:func:`checkpoint_point` says.

* the epoch stage comes from the fit loop's epoch progress (:func:`epoch_stage`; ``inspect`` reads its totals, the
  runtime the restored counts of the current epoch): ``ready == started + 1``
  means it was written in ``on_train_epoch_start`` (that epoch starts again); ``processed == completed + 1`` means it
  was written at the epoch's end (``on_train_epoch_end``: the next epoch starts from its first batch); all four equal
  means between epochs; ``processed == started - 1`` means inside an epoch;
* inside an epoch, the batch counters of *this epoch* (:func:`batch_stage`) say where: ``ready == started ==
  processed == completed + 1`` is ``on_train_batch_end`` (the resumed run finishes that batch, e.g. a validation due
  after it, then continues with batch ``processed``); ``processed < ready`` is inside a batch (that batch runs again);
  all four equal is after a batch completed (e.g. in the validation that followed it);
* Lightning itself decides "written in ``on_train_batch_end``" from the *total* batch counters, and moves one batch
  on only then (:func:`resume_point`). After an earlier resume from inside a batch those totals drift from this
  epoch's counters; ``inspect`` then says which batches Lightning will train twice or skip.
* A checkpoint written once the training loop stopped before the epoch's end (``max_steps``, ``max_time``,
  ``trainer.should_stop``) continues that epoch (:func:`continues_stopped_epoch`), where Lightning would start the
  next one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from lightning_midepoch import _state as S

# where the checkpoint was written, from the loop progress (``ResumePoint.saved_at``)
EPOCH_START = "epoch_start"
MID_EPOCH = "mid_epoch"  # an epoch stage only; inside an epoch the batch stage says where
BATCH_END = "batch_end"
IN_BATCH = "in_batch"
BETWEEN_BATCHES = "between_batches"
EPOCH_END = "epoch_end"
BETWEEN_EPOCHS = "between_epochs"
STOPPED = "stopped"  # after the training loop stopped before the epoch's end (max_steps, max_time, should_stop)
UNKNOWN = "unknown"

_COUNT_NAMES = ("ready", "started", "processed", "completed")


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _get(mapping: object, *keys: str) -> object:
    """``mapping[k1][k2]...``, or ``None`` where a level is missing or not a mapping."""
    for key in keys:
        if not isinstance(mapping, Mapping):
            return None
        mapping = mapping.get(key)
    return mapping


@dataclass(frozen=True)
class Counts:
    """One of Lightning's progress trackers: how many items were ready, started, processed and completed."""

    ready: int
    started: int
    processed: int
    completed: int

    @classmethod
    def parse(cls, raw: object) -> Counts | None:
        """Read a tracker from a checkpoint's ``loops`` (``None`` unless it holds the four counts as ints).

        Example:
            >>> Counts.parse({"ready": 4, "started": 4, "processed": 4, "completed": 3})
            Counts(ready=4, started=4, processed=4, completed=3)

        """
        if not isinstance(raw, Mapping):
            return None
        counts = [value for name in _COUNT_NAMES if _is_int(value := raw.get(name))]
        return cls(*counts) if len(counts) == len(_COUNT_NAMES) else None

    @classmethod
    def of(cls, tracker: Any) -> Counts:
        """The counts of one of Lightning's live progress trackers (the loops' trackers count all four stages)."""
        return cls(tracker.ready, tracker.started, tracker.processed, tracker.completed)

    def __str__(self) -> str:
        return f"ready={self.ready} started={self.started} processed={self.processed} completed={self.completed}"


def epoch_stage(total: Counts) -> str:
    """Where in the fit loop a checkpoint was written, from its total epoch progress, as Lightning reads it.

    Example:
        >>> epoch_stage(Counts(ready=2, started=2, processed=1, completed=1))  # inside epoch 1
        'mid_epoch'
        >>> epoch_stage(Counts(ready=2, started=2, processed=2, completed=1))  # in on_train_epoch_end of epoch 1
        'epoch_end'

    """
    ready, started, processed, completed = total.ready, total.started, total.processed, total.completed
    if ready == started + 1 and processed == started and completed == processed:
        return EPOCH_START
    if ready == started and processed == started - 1 and completed == processed:
        return MID_EPOCH
    if ready == started == processed and completed == processed - 1:
        return EPOCH_END
    if ready == started == processed == completed:
        return BETWEEN_EPOCHS
    return UNKNOWN


def batch_stage(counts: Counts) -> str:
    """Where inside an epoch a checkpoint was written, from batch progress counters.

    Example:
        >>> batch_stage(Counts(ready=4, started=4, processed=4, completed=3))  # on_train_batch_end of batch_idx 3
        'batch_end'
        >>> batch_stage(Counts(ready=4, started=4, processed=3, completed=3))  # inside batch_idx 3
        'in_batch'

    """
    ready, started, processed, completed = counts.ready, counts.started, counts.processed, counts.completed
    if ready == started == processed and completed == processed - 1:
        return BATCH_END
    if processed < ready:
        return IN_BATCH
    if ready == started == processed == completed:
        return BETWEEN_BATCHES
    return UNKNOWN


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run continues.

    Attributes:
        saved_at: Where the checkpoint was written (``epoch_start``, ``batch_end``, ``in_batch``,
            ``between_batches``, ``epoch_end``, ``between_epochs``, ``stopped`` or ``unknown``).
        epoch: The epoch the resumed run continues (or starts).
        batch: The ``batch_idx`` it continues with: batches of ``epoch`` consumed. ``None`` when unknown.
        batches_trained: Batches of ``epoch`` the checkpoint's weights were trained on. ``None`` when unknown.
        epoch_done: No batch of ``epoch`` is left: its end (validation, ``on_train_epoch_end``) runs, then the next
            epoch starts.

    """

    saved_at: str
    epoch: int
    batch: int | None
    batches_trained: int | None
    epoch_done: bool

    @property
    def continues_epoch(self) -> bool:
        """The resumed run trains more batches of an epoch already under way, so that epoch's order matters."""
        return self.saved_at in (BATCH_END, IN_BATCH, BETWEEN_BATCHES, STOPPED) and not self.epoch_done


def resume_point(
    epoch: int, epoch_total: Counts, batch_total: Counts, batch_current: Counts, is_last_batch: bool
) -> ResumePoint:
    """Where a run resumed from a checkpoint with these progress counters continues.

    Args:
        epoch: ``checkpoint["epoch"]`` (``trainer.current_epoch`` when it was written).
        epoch_total: The fit loop's total epoch progress.
        batch_total: The epoch loop's total batch progress (what Lightning's restart logic reads).
        batch_current: The epoch loop's batch progress within the epoch.
        is_last_batch: Whether the epoch's last batch had been fetched.

    Example:
        >>> resume_point(1, Counts(2, 2, 1, 1), Counts(14, 14, 14, 13), Counts(4, 4, 4, 3), False)
        ResumePoint(saved_at='batch_end', epoch=1, batch=4, batches_trained=4, epoch_done=False)
        >>> resume_point(1, Counts(2, 2, 2, 1), Counts(20, 20, 20, 20), Counts(10, 10, 10, 10), True)
        ResumePoint(saved_at='epoch_end', epoch=2, batch=0, batches_trained=0, epoch_done=False)

    """
    stage = epoch_stage(epoch_total)
    if stage == EPOCH_END:
        return ResumePoint(EPOCH_END, epoch + 1, 0, 0, False)
    if stage in (EPOCH_START, BETWEEN_EPOCHS):
        return ResumePoint(stage, epoch, 0, 0, False)
    saved_at = batch_stage(batch_current) if stage == MID_EPOCH else UNKNOWN
    if saved_at == UNKNOWN:
        return ResumePoint(UNKNOWN, epoch, None, None, False)
    trained = batch_current.processed if saved_at == BATCH_END else batch_current.completed
    # Lightning counts the interrupted batch as completed only when its *total* counters say on_train_batch_end
    batch = batch_current.completed + (1 if batch_stage(batch_total) == BATCH_END else 0)
    epoch_done = is_last_batch and saved_at != IN_BATCH and batch == trained
    return ResumePoint(saved_at, epoch, batch, trained, epoch_done)


def continues_stopped_epoch(stopped: object, fetched: object, ready: object) -> bool:
    """Whether a checkpoint written after the training loop stopped early continues the epoch it stopped in.

    ``stopped`` and ``fetched``: the callback's record (it stopped; the batches fetched then); ``ready``: the loops'
    batches of the epoch. They agree unless the loops' state comes from another moment than the record.

    Example:
        >>> [continues_stopped_epoch(*record) for record in [(True, 7, 7), (True, 7, 0), (None, 7, 7)]]
        [True, False, False]

    """
    return stopped is True and fetched == ready


def checkpoint_point(checkpoint: Mapping[str, Any], state_key: str) -> ResumePoint:
    """Where a run resumed from ``checkpoint`` (a loaded Lightning checkpoint) continues with the callback attached.

    ``state_key``: where the checkpoint holds the callback's state (whether it stopped early, and where).
    """
    fit_loop = _get(checkpoint, "loops", "fit_loop")
    state = _get(checkpoint, "callbacks", state_key)
    fetched = _get(state, S.KEY_FETCHED)
    ready = _get(fit_loop, "epoch_loop.batch_progress", "current", "ready")
    if continues_stopped_epoch(_get(state, S.KEY_STOPPED), fetched, ready):
        epoch_of_stop = _get(state, S.KEY_EPOCH)
        if isinstance(epoch_of_stop, int) and isinstance(fetched, int):
            return ResumePoint(STOPPED, epoch_of_stop, fetched, fetched, False)
    epoch_total = Counts.parse(_get(fit_loop, "epoch_progress", "total"))
    batch_total = Counts.parse(_get(fit_loop, "epoch_loop.batch_progress", "total"))
    batch_current = Counts.parse(_get(fit_loop, "epoch_loop.batch_progress", "current"))
    is_last_batch = _get(fit_loop, "epoch_loop.batch_progress", "is_last_batch") is True
    epoch: int = checkpoint["epoch"]
    if epoch_total is None or batch_total is None or batch_current is None:
        return ResumePoint(UNKNOWN, epoch, None, None, False)
    return resume_point(epoch, epoch_total, batch_total, batch_current, is_last_batch)
