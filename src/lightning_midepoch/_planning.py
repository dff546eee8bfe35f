"""Where a resumed run continues: the plan for the first train iterator after a resume, and its start.

The interrupted epoch continues exactly (each loader's recorded pass replayed past its consumed items), elastically
on another number of devices, or from a fresh order (``on_mismatch="restart_epoch"``); a checkpoint written at an
epoch's end starts the next epoch. :class:`ResumePlanner` is given the session's shared state
(:mod:`lightning_midepoch._shared`) and the parts it arms before it starts the iterator: the restorer, the saver, the
workers' states, the resumed pass and the batch check.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lightning_midepoch import _batch_check, _compat, _datalibs, _elastic, _rng, _workers
from lightning_midepoch import _state as S
from lightning_midepoch._order import _PassRecord, _Replay

if TYPE_CHECKING:
    from lightning.pytorch.loops.fetchers import _DataFetcher
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    from lightning_midepoch._passes import ResumedPass
    from lightning_midepoch._restoring import Restorer
    from lightning_midepoch._saving import Saver
    from lightning_midepoch._shared import Shared


class ResumePlanner:
    """Starts the first train iterator after a resume, where the checkpoint says the epoch continues."""

    def __init__(
        self,
        ctx: Shared,
        restorer: Restorer,
        saver: Saver,
        workers: _workers.WorkerStates,
        resumed_pass: ResumedPass,
        batch_check: _batch_check.BatchCheck,
    ) -> None:
        self.ctx = ctx
        self.restorer = restorer
        self.saver = saver
        self.workers = workers
        self.resumed_pass = resumed_pass
        self.batch_check = batch_check
        self.trainer = ctx.trainer
        self.warned = ctx.warned

    @property
    def loaded(self) -> Mapping[str, Any] | None:
        return self.restorer.loaded

    def start_resumed_epoch(self, epoch_loop: _TrainingEpochLoop, fetcher: _DataFetcher) -> None:
        """Start the first train iterator after a resume: where the interrupted epoch continues, or a new epoch."""
        self.ctx.iterator_held = False
        hooks_after = self.loaded.get(S.KEY_HOOKS_AFTER) if self.loaded is not None else None
        if hooks_after:
            self._warn_hooks_after(hooks_after)
        trainer = self.trainer
        fit_loop = trainer.fit_loop
        consumed = epoch_loop.batch_progress.current.ready
        epoch = trainer.current_epoch
        rank_state = self.restorer.rank_state()
        records: list[Any] = list(rank_state[S.KEY_PASSES]) if rank_state is not None else []
        records += [None] * (len(self.ctx.loaders) - len(records))
        new_epoch = not (fit_loop.restarted_mid_epoch or fit_loop.restarted_on_epoch_end)
        # a pass recorded in this epoch before its first batch is the epoch's own in epoch 0 only (started by the
        # fit loop's setup_data); later, an epoch that reloads the loaders starts a pass there too, but the stock
        # epoch loop starts another one after on_train_epoch_start, and that one draws the epoch's order
        recorded_here = epoch == 0 and any(record is not None and record["epoch"] == epoch for record in records)
        starts_epoch = new_epoch and consumed == 0 and not recorded_here
        if starts_epoch or fit_loop.restarted_on_epoch_end:
            self._warn_iterables_in_reused_workers(epoch + (0 if starts_epoch else 1))
        if self.loaded is None and not self.restorer.discarded and not (self.restorer.entry_found and starts_epoch):
            # (an entry that recorded nothing comes from a trainer that had not trained: nothing was lost)
            self._warn_stock_checkpoint()
        if starts_epoch:
            continued = self._leave_finished_passes(epoch)
            self.saver.loaded_loader_states = []  # the epoch's first fetch is from a new iterator
            # a new epoch: its order is drawn now from the live states, exactly as in the uninterrupted run; except
            # that epoch 0's iterator was started before on_train_epoch_start, and its stateful loaders continue it
            rewound = self._rewound_loaders(epoch)
            self._arm_workers(rank_state, {i: (0, False) for i in rewound})
            replays = {i: _Replay(None, 0, 0, live=True) for i in rewound}
            if continued:
                with _rng.isolated_global():
                    self._build(fetcher, replays)
                self.resumed_pass.positions_given()
            else:
                self._build(fetcher, replays)
            return
        if _compat.has_callback(trainer, "StochasticWeightAveraging"):
            self._warn_swa()
        if fit_loop.restarted_mid_epoch and _compat.has_callback(trainer, "BaseFinetuning"):
            self._warn_finetuning()
        for index, loader in enumerate(self.ctx.loaders):
            if S.loader_kind(loader) == S.KIND_FOREIGN:
                self._warn_foreign(index, loader)
            if S.loader_kind(loader) == S.KIND_STATEFUL and getattr(loader, "num_workers", 0) > 0:
                self._warn_stateful_workers(index, loader)
        pulled = self.loaded is not None and _compat.steps_pull_batches(fetcher)
        if pulled and self.loaded is not None:
            # training_step(dataloader_iter): a step pulls as many batches as it likes; the fetcher counted them
            consumed = self.loaded[S.KEY_FETCHED]
            if self.restorer.restored_in_batch:
                self._warn_step_rerun()
        plan = self._check_checkpoint() if self.loaded is not None else "exact"
        if plan == "restart":
            iter(fetcher)  # on_mismatch="restart_epoch": continue as stock Lightning does
            return
        if plan == "elastic":
            if self._fingerprinted() and self.ctx.verify_batch != "off":
                _compat.info(
                    "MidEpochResume: this resume continues the epoch on another number of devices, so each rank loads"
                    " other batches than it did before: the checkpoint's fingerprint of its last batch is not"
                    " compared.",
                    trainer,
                )
            self._start_elastic_epoch(epoch_loop, fetcher, consumed)
            return
        at_epoch_end = self.ctx.finish_interrupted_batch and epoch_loop.batch_progress.is_last_batch
        mode = _compat.combined_mode(self.ctx.combined_loader)  # type: ignore[arg-type]
        replays = {}
        # the batch check: the data positions saved are those before the last batch trained, which is loaded again
        start = consumed - self._expect_batch(epoch, consumed)
        # iterable datasets read in workers continue where each worker's copy was
        workers_to_arm: dict[int, tuple[int, bool]] = {
            index: (start, True) for index in self.workers.loaders if self.ctx.recorders[index] is None
        }
        self.restorer.restore_dataset_states(rank_state, at_epoch_end, from_start=start == 0, exclude=workers_to_arm)
        for index, recorder in enumerate(self.ctx.recorders):
            if recorder is None:
                continue
            record = records[index]
            recorded_pass = record["index"] if record is not None and record["epoch"] == epoch else None
            pass_index, skip = S.loader_position(mode, start, len(recorder), recorded_pass)
            replay_record = None
            if record is not None and record["epoch"] == epoch and record["index"] == pass_index:
                replay_record = _PassRecord.from_state_dict(record)
            elif not S.describe_order(recorder.inner)[1]:
                self._warn_unrecoverable(index, written_with_callback=rank_state is not None)
            saved = rank_state.get(S.KEY_GENERATORS, []) if rank_state is not None else []
            generators = saved[index] if index < len(saved) else None
            replays[index] = _Replay(replay_record, skip, pass_index, generators=generators)
            continues = record is not None and record["epoch"] == epoch and record["index"] == pass_index
            if continues or _workers.persist(recorder, self.ctx.loaders[index]):
                workers_to_arm[index] = (skip, continues)
        for index in self._arm_workers(rank_state, workers_to_arm):
            if index in replays:
                replays[index].new_workers = True
        with _rng.isolated_global():
            self._build(fetcher, replays)
        if self._fingerprinted():
            self.batch_check.conclude()  # (every rank: the ranks agree on the outcome)
        # replaying moved the loaders' own generators back to where the pass started; a pass that draws (again) at
        # its first next() sets them itself, but one that is never advanced again must still end where it was. A
        # replayed pass that knows how far the loader had taken it sets them at that position itself.
        self.restorer.restore_loader_generators(
            rank_state, {index for index, replay in replays.items() if replay.restored}
        )
        if at_epoch_end:
            # written at the epoch's last batch: nothing of this epoch is fetched again, but creating its iterator
            # fetched ahead from the datasets that keep their own position; they start the next epoch where they were
            self.restorer.reload_dataset_states(rank_state)
        if not at_epoch_end and not _compat.held_batches(fetcher):  # (a fetch ahead was isolated with the build)
            self.resumed_pass.starts_mid_epoch()
        # what was restored holds for this pass only: later passes start afresh, as in the uninterrupted run
        self.resumed_pass.positions_given()
        _compat.set_batch_index(self.ctx.combined_loader, consumed)  # type: ignore[arg-type]
        if pulled:
            # the epoch loop adds the steps it restored to the fetcher's count; the steps pulled `consumed` batches,
            # and the fetcher tells the epoch's end from that count (one step too many otherwise)
            fetcher.fetched += consumed - epoch_loop.batch_progress.current.ready

    def _fingerprinted(self) -> bool:
        """Whether the checkpoint holds the batch check's entry (for some rank: every rank takes part in the check)."""
        ranks = self.loaded[S.KEY_RANKS] if self.loaded is not None else []
        return any(rank is not None and rank.get(S.KEY_LAST_BATCH) is not None for rank in ranks)

    def _expect_batch(self, epoch: int, consumed: int) -> int:
        """Have the resumed iterator load the last batch trained again, if this rank saved it: 1 if so, else 0.

        A checkpoint that holds the batch check's entry saved the data positions before that batch (never at an
        epoch's last batch): the resumed pass starts there, one batch early.
        """
        rank_state = self.restorer.rank_state()
        entry = rank_state.get(S.KEY_LAST_BATCH) if rank_state is not None else None
        if entry is None:
            self.batch_check.expect(None, "")
            return 0
        saved_generators = entry.get(S.KEY_DATASET_GENERATORS) or []

        def set_states() -> None:
            _rng.restore_global(entry["rng"])
            for index, objects in self.saver.dataset_generators.items():
                if index < len(saved_generators) and saved_generators[index]:
                    _rng.restore_objects(objects, saved_generators[index])

        self.batch_check.expect(
            _batch_check.Refetch(entry["fingerprint"], set_states), f"batch_idx {consumed - 1} of epoch {epoch}"
        )
        return 1

    def _leave_finished_passes(self, epoch: int) -> bool:
        """A new epoch after a checkpoint written at an epoch's end or start: stateful loaders continue from there.

        Lightning gives stateful loaders (torchdata's ``StatefulDataLoader``, litdata's ``StreamingDataLoader``) their
        saved states only when it resumes inside an epoch (also at its start); after one written at an epoch's end a
        fresh loader would start the next epoch from its first order and epoch counter. Each is given its state, which
        is at the end of the finished pass, and started once (that iterator is dropped, as is the position it gave
        its dataset), so that the next iterator is the next epoch's, drawn from the loader's own generators and
        counters as in the uninterrupted run. Epoch 0's iterator was started before ``on_train_epoch_start``: a state
        from there is that iterator's, which continues (True is returned: its start draws nothing again).
        """
        fit_loop = self.trainer.fit_loop
        combined_loader = self.ctx.combined_loader
        stateful = [loader for loader in self.ctx.loaders if S.loader_kind(loader) == S.KIND_STATEFUL]
        if combined_loader is None or not stateful:
            return False
        if _compat.pending_loader_states(fit_loop):
            _compat.load_loader_states(fit_loop, combined_loader)
        elif not self.saver.loaded_loader_states:
            return False  # the checkpoint holds no states for them
        elif epoch == 0:
            return True
        with _rng.isolated_global():  # a DataLoader iterator draws its base seed; this one is no pass of the run's
            for loader in stateful:
                iter(loader)
                for restored in (loader, getattr(loader, "dataset", None)):
                    _datalibs.forget_restored_position(restored)
        return False

    def _rewound_loaders(self, epoch: int) -> list[int]:
        """Loaders whose first iterator here is a new one where the uninterrupted run reused its persistent workers.

        A new iterator draws a worker base seed from the process-wide generator; resetting persistent workers does
        not. Those loaders keep the live states still across that draw.
        """
        return [index for index in self._reused_workers(epoch) if self.ctx.recorders[index] is not None]

    def _reused_workers(self, epoch: int) -> list[int]:
        """Loaders whose persistent workers the uninterrupted run reused at this epoch's start."""
        n = _compat.reload_every_n_epochs(self.trainer)
        created_at = epoch - epoch % n if n else 0  # when the uninterrupted run last created the loader
        return [
            index
            for index, loader in enumerate(self.ctx.loaders)
            if isinstance(getattr(loader, "num_workers", None), int)
            and loader.num_workers > 0
            and loader.persistent_workers
            and not _compat.workers_started(loader)
            and epoch > created_at
        ]

    def _warn_iterables_in_reused_workers(self, epoch: int) -> None:
        """An iterable dataset's persistent workers are not recorded at a pass's end: say what that changes."""
        for index in self._reused_workers(epoch):
            if index not in self.workers.loaders or self.ctx.recorders[index] is not None:
                continue
            name = type(self.ctx.loaders[index].dataset).__name__
            _compat.warn(
                f"Train dataloader {index} reads an IterableDataset ({name}) in persistent worker processes, and the"
                " checkpoint was written after the last batch of an epoch: the workers' copies of the dataset and"
                " their random states at the end of that pass are not recorded, so the next epoch starts new workers"
                " with fresh copies, and the random draws from here on (in the workers, and in the main process,"
                " which draws the new workers' seed) differ from the uninterrupted run's. A checkpoint written before"
                " the epoch's last batch is finished continues them exactly.",
                self.trainer,
                self.ctx.warned,
            )

    def _build(self, fetcher: _DataFetcher, replays: Mapping[int, _Replay]) -> None:
        """Create the train iterator with the given loaders armed to replay."""
        for index, replay in replays.items():
            self.ctx.recorders[index].arm(replay)  # type: ignore[union-attr]
        try:
            iter(fetcher)
        finally:
            for index in replays:
                self.ctx.recorders[index].disarm()  # type: ignore[union-attr]
        for index, (problem, late) in self.workers.resumed().items():
            if problem is not None:
                self._warn_workers(index, problem)
            if late:
                self._warn_late_workers(index, late)

    def _warn_late_workers(self, index: int, late: list[int]) -> None:
        _compat.warn(
            f"Train dataloader {index}'s resumed worker process(es) {late} had not started {_workers.WAIT_S:g} s after"
            " the resumed iterator was created: they load the saved random states when they start, but the checks that"
            " their worker_init_fn and their copy of the dataset let those states continue exactly did not run before"
            " training (a worker_init_fn that seeds from the clock would go unnoticed).",
            self.trainer,
            self.ctx.warned,
        )

    def _arm_workers(
        self, rank_state: Mapping[str, Any] | None, positions: Mapping[int, tuple[int, bool]]
    ) -> list[int]:
        """Make the workers of the loaders at ``positions`` (skip, continues the saved pass) continue the saved ones.

        Returns:
            The loaders armed: their next iterator starts new workers.

        """
        armed = []
        for index, (skip, continues) in positions.items():
            problem = self.workers.arm(index, _workers.saved_entry(rank_state, index), skip, continues)
            if problem is not None and self.ctx.recorders[index] is None:
                # its copies in the workers start from the beginning
                self.restorer.warn_iterable(index, self.ctx.loaders[index])
            elif problem is not None:
                self._warn_workers(index, problem)
            elif index in self.workers.loaders:
                armed.append(index)
        return armed

    def _warn_workers(self, index: int, problem: str) -> None:
        workers = self.ctx.loaders[index].num_workers
        _compat.warn(
            f"Train dataloader {index} loads its batches in {workers} worker process(es) whose random states cannot be"
            f" continued: {problem}. Whatever its dataset draws in the workers (random augmentation) differs from the"
            " uninterrupted run's from here on; the order of the samples is still exact.",
            self.trainer,
            self.ctx.warned,
        )

    def _check_checkpoint(self) -> str:
        """How the interrupted epoch continues: ``"exact"``, ``"elastic"`` or ``"restart"`` (the opt-out)."""
        assert self.loaded is not None
        fix = 'pass `MidEpochResume(on_mismatch="restart_epoch")` to continue the epoch from a fresh order'
        current = [S.loader_facts(loader) for loader in self.ctx.loaders]
        saved_world_size = self.loaded[S.KEY_WORLD_SIZE]
        elastic = bool(self.loaded.get(S.KEY_ELASTIC)) or saved_world_size != self.trainer.world_size
        try:
            S.check_mode(self.loaded.get(S.KEY_MODE), _compat.combined_mode(self.ctx.combined_loader), fix)  # type: ignore[arg-type]
            S.check_loaders(self.loaded[S.KEY_LOADERS], current, fix, same_world_size=not elastic)
            if elastic:
                S.check_elastic(
                    self.loaded[S.KEY_LOADERS], saved_world_size, self.trainer.world_size, fix, self._order_recorded()
                )
        except S.MidEpochResumeError as error:
            if self.ctx.on_mismatch == "raise":
                raise
            _compat.warn(
                f"{error} Continuing the interrupted epoch from a freshly started order (on_mismatch='restart_epoch'):"
                " some samples of this epoch will be seen twice and others not at all.",
                self.trainer,
                self.warned,
            )
            return "restart"
        return "elastic" if elastic else "exact"

    def _order_recorded(self) -> bool:
        """Whether rank 0 recorded how the interrupted epoch's order was drawn (or a resumed epoch carries it)."""
        assert self.loaded is not None
        previous = self.loaded.get(S.KEY_ELASTIC)
        if previous and previous["epoch"] == self.trainer.current_epoch:
            return True
        rank0 = self.restorer.rank_state(0)
        record = rank0[S.KEY_PASSES][0] if rank0 is not None and rank0[S.KEY_PASSES] else None
        return (
            record is not None and record["epoch"] == self.trainer.current_epoch and record["at_first_next"] is not None
        )

    def _start_elastic_epoch(self, epoch_loop: _TrainingEpochLoop, fetcher: _DataFetcher, consumed: int) -> None:
        """Finish the interrupted epoch on this world size: every sample it had not consumed, laid out over the ranks.

        The remaining batches are the epoch's last ones: the batch index continues so that the epoch still ends
        after ``len(train_dataloader)`` batches.
        """
        assert self.loaded is not None
        trainer = self.trainer
        loader, recorder = self.ctx.loaders[0], self.ctx.recorders[0]
        assert recorder is not None
        previous = self.loaded.get(S.KEY_ELASTIC)
        if previous and previous["epoch"] == trainer.current_epoch:
            # this epoch was already resumed elastically: its last phase consumed (consumed - offset) batches
            current = previous["current"]
            phase = {**current, "consumed": (consumed - current["batch_offset"]) * current["batch_size"]}
            elastic = {**previous, "phases": [*previous["phases"], phase]}
        else:
            facts = self.loaded[S.KEY_LOADERS][0]
            spec = facts["global_order"]
            batch_size = facts["batch_size"] or 1
            rank0 = self.restorer.rank_state(0)
            phase = {
                "world_size": self.loaded[S.KEY_WORLD_SIZE],
                "drop_last": spec["kind"] == "distributed" and spec["drop_last"],
                "batch_size": batch_size,
                "batch_drop_last": spec["batch_drop_last"],
                "consumed": consumed * batch_size,
            }
            elastic = {
                "epoch": trainer.current_epoch,
                "spec": spec,
                "dataset_length": facts["dataset_length"],
                "record": rank0[S.KEY_PASSES][0] if rank0 is not None else None,
                "phases": [phase],
            }
        order = _elastic.global_order(elastic["spec"], elastic["dataset_length"], elastic["epoch"], elastic["record"])
        left = _elastic.remaining(order, elastic["phases"])
        layout = elastic_layout(loader, trainer.world_size)
        mine = _elastic.shard(left, trainer.global_rank, trainer.world_size, layout["drop_last"])
        items: list[Any] = (
            _elastic.batched(mine, layout["batch_size"], layout["batch_drop_last"])
            if loader.batch_sampler is not None
            else mine
        )
        offset = max(len(recorder) - len(items), 0)
        self.ctx.elastic = {**elastic, "current": {**layout, "batch_offset": offset}}
        _compat.move_batch_progress(epoch_loop.batch_progress, offset)
        with _rng.isolated_global():
            self._build(fetcher, {0: _Replay(None, 0, 0, batches=items)})
        _compat.set_batch_index(self.ctx.combined_loader, offset)  # type: ignore[arg-type]
        _compat.info(
            f"Finishing epoch {trainer.current_epoch} on {trainer.world_size} device(s): {len(left)} samples were"
            f" not consumed before the checkpoint; this rank trains {len(items)} batch(es) of them.",
            trainer,
        )

    def _warn_swa(self) -> None:
        _compat.warn(
            "StochasticWeightAveraging does not resume exactly from a checkpoint written in the middle of an epoch"
            " (its learning-rate schedule lags one epoch behind the uninterrupted run's; stock Lightning does the"
            " same): the resumed run will differ. Resume from a checkpoint written at an epoch's end, or use"
            " WeightAveraging, which resumes exactly.",
            self.trainer,
            self.warned,
        )

    def _warn_hooks_after(self, hooks: list[str]) -> None:
        _compat.warn(
            f"The checkpoint was written in on_train_batch_end before {', '.join(f'`{hook}`' for hook in hooks)} ran"
            " for that batch (Lightning runs the callbacks' on_train_batch_end in the order of `trainer.callbacks`,"
            " then the LightningModule's): the resumed run continues after that batch and does not run them there,"
            " so what they change (an EMA or momentum update, say) is missing, and the run will differ from the"
            " uninterrupted one (stock Lightning does the same). Make such a change in the on_train_batch_end of a"
            " callback listed before the one that writes checkpoints (Lightning runs ModelCheckpoint after every"
            " other callback). Where a hook named here keeps no state (it only logs), silence this warning with"
            ' `warnings.filterwarnings("ignore", message="The checkpoint was written in on_train_batch_end before")`.',
            self.trainer,
            self.warned,
        )

    def _warn_finetuning(self) -> None:
        _compat.warn(
            "A BaseFinetuning callback does not resume exactly from a checkpoint written in the middle of an epoch:"
            " Lightning does not run `on_train_epoch_start` for the resumed epoch, where it unfreezes the modules due"
            " at that epoch, and its `on_fit_start` freezes them again, so they stay frozen until the next epoch"
            " (stock Lightning does the same). Resume from a checkpoint written at an epoch's end to continue it"
            " exactly.",
            self.trainer,
            self.warned,
        )

    def _warn_stateful_workers(self, index: int, loader: Any) -> None:
        _compat.warn(
            f"Train dataloader {index} ({type(loader).__name__}) keeps its own position, which Lightning restores,"
            f" and loads its batches in {loader.num_workers} worker process(es): the loader restarts its workers"
            " from its own saved state, not from where their random generators were, so whatever its dataset draws"
            " in the workers (random augmentation) differs from the uninterrupted run's for the rest of this epoch;"
            " the order is exact. Draw augmentation from a generator seeded by the sample's index and the epoch to"
            " resume it exactly.",
            self.trainer,
            self.warned,
        )

    def _warn_foreign(self, index: int, loader: Any) -> None:
        _compat.warn(
            f"Train dataloader {index} is left to Lightning: {S.foreign_because(loader)}, so MidEpochResume cannot"
            " count and replay its order. The interrupted epoch continues as stock Lightning continues it, from a new"
            " pass of that loader: unless its order is fixed, some samples of this epoch are seen twice and others"
            " not at all. Everything else (the other loaders, the random states) resumes exactly. To resume it"
            " exactly, iterate it with DataLoader's own `__iter__` over a sampler that has a length, or give it"
            " `state_dict()`/`load_state_dict()` (Lightning then saves and restores its position itself).",
            self.trainer,
            self.warned,
        )

    def _warn_step_rerun(self) -> None:
        _compat.warn(
            "The checkpoint was written inside a training_step that pulls its own batches (training_step(self,"
            " dataloader_iter)): Lightning runs that step again, but the batches it had pulled before the checkpoint"
            " are not pulled again (the step continues with the batches after them) and its random states are those"
            " after its latest pull, not those it started with: the resumed run will differ. Write checkpoints in"
            " on_train_batch_end or on_train_epoch_end (as ModelCheckpoint does), which resume exactly.",
            self.trainer,
            self.warned,
        )

    def _warn_stock_checkpoint(self) -> None:
        _compat.warn(
            "The checkpoint has no MidEpochResume state (it was written without the callback). Where the data order"
            " is fixed or determined by a seed and the epoch (SequentialSampler, DistributedSampler) the epoch"
            " continues exactly; random orders and the random states of dropout and augmentation cannot be"
            " recovered and are drawn afresh. Checkpoints written with MidEpochResume attached resume exactly.",
            self.trainer,
            self.warned,
        )

    def _warn_unrecoverable(self, index: int, written_with_callback: bool) -> None:
        # (a checkpoint with the callback's state records every pass the callback saw begin: one it did not was
        # begun before its setup, or the loader is new)
        why = (
            ": the epoch's iterator was created before MidEpochResume's setup, as when a callback listed before it or a"
            " datamodule's setup reads `trainer.estimated_stepping_batches`, `trainer.train_dataloader` or"
            " `trainer.num_training_batches` (list MidEpochResume first), or the loader was added since"
            if written_with_callback
            else ""
        )
        _compat.warn(
            f"The order of train dataloader {index} in the interrupted epoch cannot be recovered from the checkpoint"
            f" (it recorded no random state for it{why}). The epoch continues with its remaining number of batches"
            " drawn from a fresh order: some samples of this epoch will be seen twice and others not at all.",
            self.trainer,
            self.warned,
        )


def elastic_layout(loader: Any, world_size: int) -> dict[str, Any]:
    """How this run lays an epoch out over its ranks: the sampler's padding and the batch sampler's batches."""
    inner = loader.batch_sampler.inner if loader.batch_sampler is not None else loader.sampler.inner
    batch_size, batch_drop_last = 1, False
    if loader.batch_sampler is not None:
        batch_size, batch_drop_last = loader.batch_sampler.batch_size, bool(loader.batch_sampler.drop_last)
        inner = inner.sampler
    drop_last = bool(getattr(inner, "drop_last", False)) if world_size > 1 else False
    return {
        "world_size": world_size,
        "drop_last": drop_last,
        "batch_size": batch_size,
        "batch_drop_last": batch_drop_last,
    }
