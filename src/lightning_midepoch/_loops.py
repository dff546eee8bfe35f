"""The ``_FitLoop`` and ``_TrainingEpochLoop`` overrides: resume the interrupted epoch exactly.

These are mixins, put in front of the trainer's own loop classes on one trainer instance by :class:`_Session`; the
classes themselves are never changed. What they change with respect to stock Lightning, on resume only:

* ``_TrainingEpochLoop.on_run_start`` starts the held-back iterator of the resumed epoch after the sampler epoch is
  set, with every train loader fast-forwarded past its consumed batches at the sampler level, then runs the stock
  method (which keeps that iterator).
* A checkpoint written in ``on_train_batch_end`` interrupted the rest of that batch (the validation due after it,
  the step-interval plateau schedulers): stock Lightning skips it, and at an epoch's last batch also skips the
  epoch's end (and after the batch that reached ``max_steps``, all of it). Here the loop finishes that batch, and
  that epoch, as the uninterrupted run did.
* A checkpoint written in ``on_train_epoch_start`` starts that epoch afresh (stock Lightning first replays the
  previous epoch's last batch position and numbers the epoch one too high).
* The random states and partial gradients saved with the checkpoint are restored before the epoch continues.
* The validation loader iterator that stock Lightning starts on resume, only to skip a validation the checkpoint
  already holds, draws nothing from the process-wide random generators.
* The stock "dataloader is not resumable" warning is not given: this path is supported.

A run that never resumes goes through the stock code unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_midepoch import _compat, _restart, _rng
from lightning_midepoch._fetchers import _ResumableDataFetcher
from lightning_midepoch._mixin import mixed_copy, stock_reduce

if TYPE_CHECKING:
    from lightning.pytorch.loops.fetchers import _DataFetcher
    from lightning.pytorch.loops.fit_loop import _FitLoop as _FitLoopBase
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop as _EpochLoopBase

    from lightning_midepoch._planning import ResumePlanner
    from lightning_midepoch._recording import Recording
    from lightning_midepoch._restoring import Restorer
    from lightning_midepoch._saving import Saver
    from lightning_midepoch._shared import Shared
else:
    _FitLoopBase = object
    _EpochLoopBase = object


@dataclass(frozen=True)
class LoopParts:
    """What the loop overrides work with: the shared state and the parts they call at the loops' moments."""

    ctx: Shared
    recording: Recording  # given to the train data fetcher's override
    saver: Saver
    restorer: Restorer
    planner: ResumePlanner


class _ResumableFitLoop(_FitLoopBase):
    """Mixed into the trainer's fit loop by :class:`~lightning_midepoch._session._Session`."""

    _midepoch: LoopParts
    __reduce_ex__ = stock_reduce

    @property
    def _data_fetcher(self) -> Any:
        return self.__dict__.get("_data_fetcher")

    @_data_fetcher.setter
    def _data_fetcher(self, fetcher: Any) -> None:
        # the fetcher is created inside setup_data: take it over before setup_data starts its iterator. The fit loop
        # keeps a copy with the override (mixed_copy): nothing refers to the new fetcher yet, and Lightning reads its
        # attributes at every fetch
        if fetcher is not None:
            parts = self._midepoch
            fetcher, original = mixed_copy(fetcher, _ResumableDataFetcher, first={"_midepoch": parts.recording})
            parts.ctx.installed(fetcher, original)
            parts.ctx.fetcher = fetcher
        self.__dict__["_data_fetcher"] = fetcher

    @override
    def load_state_dict(self, state_dict: dict[str, Any], prefix: str = "") -> None:
        parts = self._midepoch
        # Everything the epoch loop's override does follows a restore (`restarting` is set by nothing else). Until
        # then the epoch loop is left as it is: putting an override on an object slows down every read of its
        # attributes a little (see lightning_midepoch._mixin.mix_in), and Lightning reads the epoch loop's hundreds of
        # times per training step.
        parts.ctx.mix(self.epoch_loop, _ResumableTrainingEpochLoop, parts)
        super().load_state_dict(state_dict, prefix)
        parts.restorer.loops_restored()
        if parts.ctx.resuming and self._combined_loader is not None:
            # Reading `trainer.estimated_stepping_batches` before the fit loop runs (to size OneCycleLR in
            # configure_optimizers, say) set up the train data and started its iterator before this restore: that
            # iterator is set aside, and the resumed epoch's is held back as when the data is set up after it
            _set_aside_early_iterator(parts.ctx)
            self._midepoch_reload_epoch()

    @property
    @override
    def done(self) -> bool:
        # a checkpoint from on_train_batch_end of the batch that reached max_steps: the uninterrupted run went on to
        # that batch's validation and its epoch's end, which stock Lightning skips (max_steps is reached). The fit
        # loop stays restarting until its first epoch is over, where the epoch loop has finished that batch.
        if self.restarting and self._midepoch.ctx.resuming:
            # (Lightning tells a restart from on_train_batch_end by the batch progress's totals)
            totals = _restart.Counts.of(self.epoch_loop.batch_progress.total)
            if _restart.batch_stage(totals) == _restart.BATCH_END:
                return False
        return super().done

    @override
    def setup_data(self) -> None:
        ctx = self._midepoch.ctx
        first_after_resume = self._combined_loader is None and ctx.resuming
        ctx.hold_next_iter = first_after_resume
        try:
            super().setup_data()
        finally:
            ctx.hold_next_iter = False
        if first_after_resume and self._combined_loader is not None:
            self._midepoch_reload_epoch()

    def _midepoch_reload_epoch(self) -> None:
        n = _compat.reload_every_n_epochs(self.trainer)
        if n:
            # the uninterrupted run last reloaded at the latest multiple of n, not at the epoch it was resumed in
            epoch = self.trainer.current_epoch
            self._last_train_dl_reload_epoch = epoch - epoch % n

    @override
    def reset(self) -> None:
        # the fit loop runs (setup_data came first): restores from now on are a tuner's, not a resume
        self._midepoch.ctx.trained = True
        self.update_restart_stage()
        progress = self.epoch_loop.batch_progress
        # a checkpoint from on_train_batch_end of an epoch's last batch: stock Lightning would count that epoch as
        # finished here, skipping its validation and epoch-end hooks. The epoch loop finishes it instead.
        finish_epoch = (
            self.restarted_mid_epoch and self.epoch_loop.restarted_on_train_batch_end and progress.is_last_batch
        )
        if finish_epoch:
            progress.is_last_batch = False
        try:
            super().reset()
        finally:
            if finish_epoch:
                progress.is_last_batch = True
        if self.restarted_on_epoch_start:
            # a checkpoint from on_train_epoch_start: the batch progress it holds is the previous epoch's, and
            # stock Lightning would "finish" that epoch a second time. The epoch loop starts this epoch afresh.
            self.epoch_loop.restarting = False
            # stock Lightning also takes back the epoch's "ready" (reset_on_restart) without counting it again in
            # on_advance_start: a checkpoint written later in this epoch would then look like one from an earlier
            # stage (from its end: "finished", so a resume from it skipped the next epoch)
            _compat.count_epoch_ready(self.epoch_progress)

    @override
    def on_advance_start(self) -> None:
        # before on_train_epoch_start: a new epoch's hooks and order draw from the states the checkpoint recorded
        self._midepoch.restorer.restore_live_state()
        # an epoch that reloads the train loaders starts their iterator here, which draws from the random states:
        # the epoch's start is after that (as in an epoch that does not reload), or a resume from its
        # on_train_epoch_start checkpoint would miss that draw. The stock method's setup_data has nothing left to do.
        self.setup_data()
        self._midepoch.saver.epoch_started()
        super().on_advance_start()

    @override
    def on_advance_end(self) -> None:
        self._midepoch.saver.epoch_loop_ended()
        session = self._midepoch.ctx
        resumed_epoch_ends = self.restarting and session.resuming and _compat.all_batches_reached(self.epoch_loop)
        if not (resumed_epoch_ends and self._midepoch_plateau_metrics_fresh()):
            if resumed_epoch_ends and self._midepoch_plateau_monitors():
                session.warn(
                    "A ReduceLROnPlateau scheduler is not stepped at the end of the epoch this run resumed into (stock"
                    " Lightning skips that step on a restart), because no validation ran after the restore to give it"
                    " the metric it monitors, where the uninterrupted run stepped it here: from the next epoch on, the"
                    " learning rate may differ from the uninterrupted run's. A checkpoint written before the"
                    " epoch's last validation (or at an epoch's end) resumes exactly."
                )
            super().on_advance_end()
            return
        # Stock Lightning steps no epoch-interval scheduler at the end of the epoch it resumed into, because the
        # metrics a ReduceLROnPlateau monitors are not in the checkpoint. Here a validation ran in this process
        # after the restore, as in the uninterrupted run, which stepped them here: they are stepped alike.
        self._restarting = False
        try:
            super().on_advance_end()
        finally:
            self._restarting = True

    def _midepoch_plateau_monitors(self) -> list[str]:
        """What the trainer's ReduceLROnPlateau schedulers stepped at an epoch's end monitor."""
        configs = self.trainer.lr_scheduler_configs
        return [str(c.monitor) for c in configs if c.reduce_on_plateau and c.interval == "epoch"]

    def _midepoch_plateau_metrics_fresh(self) -> bool:
        """Whether a validation ran since the restore and every ReduceLROnPlateau's metric is at hand."""
        monitors = self._midepoch_plateau_monitors()
        metrics = self.trainer.callback_metrics
        return self._midepoch.ctx.validated_since_resume and bool(monitors) and all(m in metrics for m in monitors)


class _ResumableTrainingEpochLoop(_EpochLoopBase):
    """Mixed into the trainer's training epoch loop by the fit loop's override when Lightning restores the loops."""

    _midepoch: LoopParts
    __reduce_ex__ = stock_reduce

    @override
    def reset(self) -> None:
        if self.restarting and not self.restarted_on_train_batch_end and _compat.stopped_inside_validation(self):
            # the checkpoint was written inside the validation after a batch (a signal served there): the random
            # states it holds are those of the validation's start, and the batch is finished from there (that
            # validation again, plateau schedulers), as after a checkpoint written in on_train_batch_end
            self._midepoch.ctx.finish_interrupted_batch = True
            _uncount_validation_rerun(self.val_loop.batch_progress)
        if self.restarting and self.restarted_on_train_batch_end:
            self._midepoch.ctx.finish_interrupted_batch = True
            progress = self.batch_progress
            if progress.is_last_batch or progress.current.completed + 1 >= self.trainer.num_training_batches:
                # stay in the interrupted epoch (stock Lightning would roll over into the next one)
                progress.increment_completed()
                self.reset_restart_stage()
        restarting = self.restarting
        if self._midepoch.ctx.resuming:  # this resume is the callback's: its own warnings say what it cannot continue
            with _compat.stock_warning_suppressed():
                super().reset()
        else:  # (a restore the callback leaves to Lightning keeps stock's warning)
            super().reset()
        if restarting:
            # Lightning rewinds this epoch's counters to the last completed batch but not the totals, which it reads
            # to tell where the next checkpoint was written: after a resume from inside a batch they would stay one
            # ahead, and that checkpoint would resume one batch early (training a batch twice)
            total = self.batch_progress.total  # a _BatchProgress: its trackers count every stage
            total.ready = total.started = total.processed = total.completed  # type: ignore[attr-defined]

    @override
    def on_run_start(self, data_fetcher: _DataFetcher) -> None:
        parts = self._midepoch
        session = parts.ctx
        if not session.iterator_held:
            super().on_run_start(data_fetcher)
            return
        # the first epoch after a resume: its iterator is started here, where the epoch continues; then the stock
        # method does the rest. Where it would create the epoch's iterator again (before 2.5.3, which has no
        # `is_resuming`, when the epoch loop is not restarting), that iter() keeps the one just started.
        parts.planner.start_resumed_epoch(self, data_fetcher)
        session.iterator_started = True
        try:
            super().on_run_start(data_fetcher)
        finally:
            session.iterator_started = False

    @override
    def advance(self, data_fetcher: _DataFetcher) -> None:
        session = self._midepoch.ctx
        if session.finish_interrupted_batch:
            # the checkpoint was written in on_train_batch_end: returning lets on_advance_end finish that batch (the
            # validation due after it, plateau schedulers), as the uninterrupted run did after writing it
            session.finish_interrupted_batch = False
            self.val_loop.restarting = False
            if not self._should_accumulate():
                self._batches_that_stepped -= 1  # reset() already counted this batch; on_advance_end counts it
            return
        if not self.restarting:
            super().advance(data_fetcher)
            return
        # the first batch after a resume, where the last batch before it was due a validation (a mid-epoch one, or
        # the previous epoch's last): stock Lightning starts the validation loader's iterator to skip that validation,
        # and a shuffling loader draws from torch's global generator there, which the uninterrupted run did not (the
        # batch would then run from other states than those the checkpoint restored)
        with _compat.evaluation_skip_wrapped(self.val_loop, _rng.isolated_global):
            super().advance(data_fetcher)


def _uncount_validation_rerun(progress: Any) -> None:
    """Take the interrupted validation's completed batches off its progress counters: the resume runs them again.

    Stock Lightning counts each validation batch once, the interrupted one as started but not completed; so does the
    resume that runs the validation again from its start (Lightning's ``test_fit_can_fail_during_validation``).

    >>> from types import SimpleNamespace as N
    >>> total = N(ready=6, started=6, processed=5, completed=5)
    >>> progress = N(total=total, current=N(ready=2, started=2, processed=1, completed=1))
    >>> _uncount_validation_rerun(progress)
    >>> progress.total, progress.current
    (namespace(ready=5, started=5, processed=4, completed=4), namespace(ready=1, started=1, processed=0, completed=0))
    """
    rerun = progress.current.completed
    for tracker in (progress.total, progress.current):
        tracker.ready -= rerun
        tracker.started -= rerun
        tracker.processed -= rerun
        tracker.completed -= rerun


def _set_aside_early_iterator(ctx: Shared) -> None:
    """A resume found the train iterator already started (the data was set up before the restore): hold it back.

    The iterator started before the restore drew its order from the process's states then; the resumed epoch's is
    started where the epoch continues, as when the data is set up after the restore. Persistent workers started for
    it are let go; the stateful loaders get the states Lightning restored (which it gives only when it sets up the
    data after the restore: Lightning issue #20550).
    """
    fetcher, combined_loader = ctx.fetcher, ctx.combined_loader
    if fetcher is None or combined_loader is None or ctx.iterator_held:
        return
    for loader in ctx.loaders:
        _compat.drop_workers(loader)
    fit_loop = ctx.trainer.fit_loop
    if _compat.pending_loader_states(fit_loop):
        _compat.load_loader_states(fit_loop, combined_loader)
    ctx.hold_next_iter = True
    try:
        iter(fetcher)
    finally:
        ctx.hold_next_iter = False
