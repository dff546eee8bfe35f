"""One trainer's mid-epoch resume machinery, from the callback's ``setup`` to the end of its ``fit``.

The session installs the loop and fetcher overrides on its trainer (and only there), wraps the index sampler of each
map-style train loader in a recorder, and on resume plans where each loader continues and restores the saved random
states and partial gradients. What checkpoints save is its :class:`~lightning_midepoch._saving.Saver`'s concern.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from lightning_midepoch import _compat, _elastic, _rng, _validate
from lightning_midepoch import _state as S
from lightning_midepoch._fetchers import _ResumableDataFetcher
from lightning_midepoch._loops import _ResumableFitLoop, _ResumableTrainingEpochLoop
from lightning_midepoch._mixin import mix_in, mixed_copy, unmix
from lightning_midepoch._order import _IndexSamplerRecorder, _PassRecord, _Replay
from lightning_midepoch._saving import Saver

if TYPE_CHECKING:
    from lightning.pytorch import Trainer
    from lightning.pytorch.loops.fetchers import _DataFetcher
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
    from lightning.pytorch.utilities.combined_loader import CombinedLoader

OnMismatch = Literal["raise", "restart_epoch"]


class _Session:
    """The state and actions of mid-epoch resume for one trainer during one ``fit``."""

    def __init__(self, trainer: Trainer, on_mismatch: OnMismatch) -> None:
        self.trainer = trainer
        self.on_mismatch = on_mismatch
        self.loaded: Mapping[str, Any] | None = None  # the checkpoint's state, once Lightning restored the callback
        self.loaders: list[Any] = []
        self.recorders: list[_IndexSamplerRecorder | None] = []
        self.combined_loader: CombinedLoader | None = None
        self.fetcher: _DataFetcher | None = None
        # flags shared with the loop and fetcher overrides
        self.hold_next_iter = False
        self.iterator_held = False
        self.iterator_started = False  # the resumed epoch's iterator was just started: the next iter() keeps it
        self.finish_interrupted_batch = False
        self._live_pending = False
        self.warned: set[str] = set()
        self._originals: list[tuple[object, type]] = []
        self.fetching = False  # the training loop is creating or advancing its train iterator
        self.elastic: dict[str, Any] | None = None  # the epoch being finished on another world size
        self.saver = Saver(self)  # what checkpoints save
        self.resuming = False  # this fit resumes from a checkpoint (the loops were restored before it trained)
        self.trained = False  # the fit loop has set up its data: restores from now on are a tuner's, not a resume
        self.entry_found = False  # the checkpoint resumed has a MidEpochResume entry (possibly an empty one)
        self.discarded = False  # its entry was damaged and set aside (on_mismatch="restart_epoch"), with a warning
        self.restored_in_batch = False  # the checkpoint resumed was written inside a batch (Lightning re-runs it)
        self.out_of_reach: dict[int, list[str]] = {}  # per loader: where the search for its generators stopped

    # ------------------------------------------------------------------ installing
    def install(self) -> None:
        """Put the fit loop's override on this trainer's fit loop (the epoch loop's waits for a restore)."""
        fit_loop = self.trainer.fit_loop
        self._mix(fit_loop, _ResumableFitLoop)
        if fit_loop._data_fetcher is not None:  # pragma: no cover - Lightning creates it inside setup_data
            fit_loop._data_fetcher = fit_loop._data_fetcher  # the fit loop's override adopts it

    def loops_restoring(self) -> None:
        """Lightning is about to restore the loops' state: put the epoch loop's override on the epoch loop.

        Everything the epoch loop's override does follows a restore (``restarting`` is set by nothing else). Until
        then the epoch loop is left as it is: putting an override on an object slows down every read of its
        attributes a little (see :func:`~lightning_midepoch._mixin.mix_in`), and Lightning reads the epoch loop's
        hundreds of times per training step.
        """
        self._mix(self.trainer.fit_loop.epoch_loop, _ResumableTrainingEpochLoop)

    def _mix(self, obj: object, mixin: type) -> None:
        if not isinstance(obj, mixin):
            self._originals.append((obj, mix_in(obj, mixin)))
            vars(obj)["_midepoch"] = self

    def uninstall(self) -> None:
        """Give the trainer its stock loops and the loaders their own index samplers back."""
        self._restore_samplers()
        for obj, original in reversed(self._originals):
            unmix(obj, original)
        self._originals.clear()

    def adopt_fetcher(self, fetcher: _DataFetcher) -> _DataFetcher:
        """Take over the train data fetcher the fit loop just created: returns the fetcher the fit loop keeps.

        That is a copy with the override (:func:`~lightning_midepoch._mixin.mixed_copy`): nothing refers to the new
        fetcher yet, and Lightning reads its attributes at every fetch.
        """
        fetcher, original = mixed_copy(fetcher, _ResumableDataFetcher)
        fetcher._midepoch = self  # type: ignore[attr-defined]
        self._originals.append((fetcher, original))
        self.fetcher = fetcher
        return fetcher

    def attach(self, combined_loader: CombinedLoader) -> None:
        """Wrap the index sampler of every map-style train loader in a recorder (called before any iterator)."""
        self._restore_samplers()
        self.combined_loader = combined_loader
        self.loaders = list(combined_loader.flattened)
        self.recorders = [self._install_recorder(loader) for loader in self.loaders]
        self.out_of_reach = {
            index: beyond
            for index, (loader, recorder) in enumerate(zip(self.loaders, self.recorders))
            if recorder is not None and (beyond := _rng.out_of_reach(_rng_roots(loader, recorder.inner)))
        }
        self.saver.attach(self.loaders)

    def after_fetch(self) -> None:
        """Called right after every fetch from the train loaders."""
        self.saver.batch_started()
        self.fetching = False

    def before_fetch(self) -> None:
        """Called right before every fetch from the train loaders."""
        self.fetching = True
        self.saver.before_fetch()

    def _install_recorder(self, loader: Any) -> _IndexSamplerRecorder | None:
        if S.loader_kind(loader) != S.KIND_MAP:
            return None
        attribute = "batch_sampler" if loader.batch_sampler is not None else "sampler"
        inner = getattr(loader, attribute)
        if isinstance(inner, _IndexSamplerRecorder):
            return inner
        rng_objects = _rng.find_rng_objects(_rng_roots(loader, inner))
        recorder = _IndexSamplerRecorder(
            inner, rng_objects, lambda: self.trainer.current_epoch, observing=lambda: self.fetching
        )
        # DataLoader forbids reassigning its samplers after __init__; the recorder forwards everything to the original
        object.__setattr__(loader, attribute, recorder)
        return recorder

    def _restore_samplers(self) -> None:
        for loader, recorder in zip(self.loaders, self.recorders):
            if recorder is not None:
                attribute = "batch_sampler" if loader.batch_sampler is recorder else "sampler"
                object.__setattr__(loader, attribute, recorder.inner)
        self.loaders, self.recorders = [], []

    def start_epoch(self) -> None:
        """The train iterator is being created: every recorder's next pass is the epoch's first."""
        self.saver.iterator_started()
        for recorder in self.recorders:
            if recorder is not None:
                recorder.start_epoch()

    # ------------------------------------------------------------------ resuming
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.trained:
            # Lightning's tuners restore the checkpoint they wrote before their trial steps in the middle of a fit:
            # stock Lightning then keeps the process's random states and the loops start afresh, and so does this
            return
        self.entry_found = True
        try:
            migrated = _validate.checked(state)
        except _validate.DamagedStateError as error:
            self._discard(error)
            return
        self.loaded = migrated if S.records_position(migrated) else None
        self._live_pending = self.loaded is not None

    def _discard(self, error: _validate.DamagedStateError) -> None:
        """Raise on a damaged state, or (``on_mismatch="restart_epoch"``) resume as if the checkpoint had none."""
        if self.on_mismatch == "raise":
            raise error
        _compat.warn(
            f"The checkpoint's MidEpochResume state is damaged: {error.problem} Resuming without it"
            " (on_mismatch='restart_epoch'), as from a checkpoint written without the callback: Lightning's own state"
            " is restored, but the rest of the interrupted epoch is drawn from a fresh order (some of its samples are"
            " seen twice and others not at all, unless the order is fixed or determined by a seed and the epoch) and"
            " the random states of dropout and augmentation are drawn afresh.",
            self.trainer,
            self.warned,
        )
        self.loaded, self._live_pending, self.discarded = None, False, True

    def loops_restored(self) -> None:
        """Lightning restored the loops: a resume, if from a checkpoint before the fit trained.

        Lightning's tuners also reset the loops (from a copy of their state, before their trial steps) and restore
        their own checkpoint after them: neither is a resume.
        """
        if not self.trained and _compat.restoring_checkpoint(self.trainer):
            self.resuming = True
            self.reopen_stopped_epoch()
            fit_loop = self.trainer.fit_loop
            if fit_loop.restarting and _compat.epoch_trained(fit_loop.epoch_progress):
                # every batch of the epoch was run (a checkpoint from on_train_epoch_end, or after fit): Lightning
                # starts the next epoch, except with max_steps set, where its fit loop always counts as restarting
                # and so runs the ended epoch's end again (the next epoch never starts when that reaches max_epochs)
                _compat.stop_restarting(fit_loop)
            batch = fit_loop.epoch_loop.batch_progress.current  # as saved: each stage counted (a _BatchProgress)
            self.restored_in_batch = batch.processed < batch.ready  # type: ignore[attr-defined]
            if _compat.epoch_finished(fit_loop.epoch_progress):
                # written once an epoch had ended (after fit, say): with max_steps set, stock Lightning keeps
                # "restarting" into that epoch's finished batch progress and trains one stray batch before the next
                _compat.start_batch_progress_afresh(fit_loop.epoch_loop.batch_progress)

    def reopen_stopped_epoch(self) -> None:
        """After the loops are restored: a checkpoint written once training stopped early continues that epoch.

        Lightning counts an epoch its training loop left early as finished; a resumed run would start the next one.
        """
        loaded = self.loaded
        if loaded is None or not loaded[S.KEY_STOPPED]:
            return
        fit_loop = self.trainer.fit_loop
        if fit_loop.epoch_loop.batch_progress.current.ready != loaded[S.KEY_FETCHED]:
            return  # the loops' state does not come from the moment the state recorded
        _compat.reopen_epoch(fit_loop.epoch_progress, loaded[S.KEY_EPOCH])
        fit_loop.restarting = True  # Lightning decided "not restarting" from the finished epoch it had restored

    def _rank_state(self, rank: int | None = None) -> Mapping[str, Any] | None:
        if self.loaded is None:
            return None
        ranks = self.loaded[S.KEY_RANKS]
        rank = self.trainer.global_rank if rank is None else rank
        return ranks[rank] if rank < len(ranks) else None

    @property
    def _elastic_resume(self) -> bool:
        return self.loaded is not None and self.loaded.get(S.KEY_WORLD_SIZE, 1) != self.trainer.world_size

    def restore_live_state(self) -> None:
        """Restore the random states and partial gradients saved with the checkpoint (once, on the first epoch)."""
        if not self._live_pending:
            return
        self._live_pending = False
        if self.loaded is not None and not self._elastic_resume:
            # the gradients are restored into this model's parameters: a shape they cannot take is damage
            shapes = {name: tuple(p.shape) for name, p in self.trainer.lightning_module.named_parameters()}
            try:
                _validate.check_grads(self.loaded, shapes)
            except _validate.DamagedStateError as error:
                self._discard(error)
                return
        if self.loaded is not None and not self._elastic_resume:
            self._warn_ranks_without_states()
        rank_state = self._rank_state()
        if rank_state is None:
            return
        devices = _rng.restore_global(rank_state[S.KEY_RNG])
        if devices is not None:
            _compat.warn(
                f"The checkpoint holds the CUDA random states of {len(rank_state[S.KEY_RNG]['cuda'])} device(s) but"
                f" this process sees {devices}: they are not restored, so random draws on the GPU (dropout, say)"
                " differ from the uninterrupted run's. Resume with the same visible devices to continue them exactly.",
                self.trainer,
                self.warned,
            )
        self._restore_loader_generators(rank_state)
        grads = rank_state.get(S.KEY_GRADS)
        if grads and self._elastic_resume:
            _compat.warn(
                "The checkpoint was written inside a gradient accumulation group on another number of devices: the"
                " gradients accumulated so far are dropped and the group restarts on the new devices.",
                self.trainer,
                self.warned,
            )
        elif grads:
            for name, parameter in self.trainer.lightning_module.named_parameters():
                if name in grads:
                    parameter.grad = grads[name].to(device=parameter.device, dtype=parameter.dtype)

    def _warn_ranks_without_states(self) -> None:
        """Say which ranks continue with fresh random states (said by every rank: Lightning shows rank 0's words)."""
        assert self.loaded is not None
        ranks = self.loaded[S.KEY_RANKS]
        missing = [rank for rank in range(self.trainer.world_size) if rank >= len(ranks) or ranks[rank] is None]
        if not missing or not ranks:
            return
        which = f"rank {missing[0]}" if len(missing) == 1 else f"ranks {', '.join(map(str, missing))}"
        _compat.warn(
            f"The checkpoint holds no random states for {which} (it was written while handling an exception, when"
            " the ranks could not exchange them): they continue with fresh random states, so their dropout and"
            " augmentation draws differ from the uninterrupted run's. The data order is still exact.",
            self.trainer,
            self.warned,
        )

    def _restore_loader_generators(self, rank_state: Mapping[str, Any] | None) -> None:
        """Set the generators owned by the loaders and their samplers to their states at the checkpoint."""
        states = rank_state.get(S.KEY_GENERATORS, []) if rank_state is not None else []
        for index, (recorder, objects) in enumerate(zip(self.recorders, states)):
            if recorder is not None and objects:
                missing = _rng.restore_objects(recorder.rng_objects, objects)
                if missing:
                    self._warn_missing_generators(index, missing)
        for index, paths in self.out_of_reach.items():
            _compat.warn(
                f"The sampler chain of train dataloader {index} goes deeper than the search for random generators"
                f" ({', '.join(paths)}): a generator kept there is neither saved nor restored, so the resumed order"
                " and draws may differ from the uninterrupted run's. Keep the generator closer to the DataLoader, or"
                " implement `state_dict()`/`load_state_dict()` on a stateful loader.",
                self.trainer,
                self.warned,
            )

    def _warn_missing_generators(self, index: int, paths: list[str]) -> None:
        _compat.warn(
            f"The checkpoint recorded the random generator(s) {', '.join(paths)} of train dataloader {index}, which"
            " the current loader does not have: they are not restored, so this loader's order and random draws"
            " continue from fresh states and differ from the uninterrupted run's. Resume with the same samplers"
            " and generators to continue exactly.",
            self.trainer,
            self.warned,
        )

    def start_resumed_epoch(self, epoch_loop: _TrainingEpochLoop, fetcher: _DataFetcher) -> None:
        """Start the first train iterator after a resume: where the interrupted epoch continues, or a new epoch."""
        self.iterator_held = False
        trainer = self.trainer
        fit_loop = trainer.fit_loop
        consumed = epoch_loop.batch_progress.current.ready
        epoch = trainer.current_epoch
        rank_state = self._rank_state()
        records: list[Any] = list(rank_state[S.KEY_PASSES]) if rank_state is not None else []
        records += [None] * (len(self.loaders) - len(records))
        new_epoch = not (fit_loop.restarted_mid_epoch or fit_loop.restarted_on_epoch_end)
        # a pass recorded in this epoch before its first batch is the epoch's own in epoch 0 only (started by the
        # fit loop's setup_data); later, an epoch that reloads the loaders starts a pass there too, but the stock
        # epoch loop starts another one after on_train_epoch_start, and that one draws the epoch's order
        recorded_here = epoch == 0 and any(record is not None and record["epoch"] == epoch for record in records)
        starts_epoch = new_epoch and consumed == 0 and not recorded_here
        if self.loaded is None and not self.discarded and not (self.entry_found and starts_epoch):
            # (an entry that recorded nothing comes from a trainer that had not trained: nothing was lost)
            self._warn_stock_checkpoint()
        if starts_epoch:
            # a new epoch: its order is drawn now from the live states, exactly as in the uninterrupted run
            self._build(fetcher, {i: _Replay(None, 0, 0, live=True) for i in self._rewound_loaders(epoch)})
            return
        if _compat.has_callback(trainer, "StochasticWeightAveraging"):
            self._warn_swa()
        pulled = self.loaded is not None and _compat.steps_pull_batches(fetcher)
        if pulled and self.loaded is not None:
            # training_step(dataloader_iter): a step pulls as many batches as it likes; the fetcher counted them
            consumed = self.loaded[S.KEY_FETCHED]
            if self.restored_in_batch:
                self._warn_step_rerun()
        plan = self._check_checkpoint() if self.loaded is not None else "exact"
        if plan == "restart":
            iter(fetcher)  # on_mismatch="restart_epoch": continue as stock Lightning does
            return
        if plan == "elastic":
            self._start_elastic_epoch(epoch_loop, fetcher, consumed)
            return
        self._restore_dataset_states(rank_state)
        mode = _compat.combined_mode(self.combined_loader)  # type: ignore[arg-type]
        replays = {}
        for index, recorder in enumerate(self.recorders):
            if recorder is None:
                continue
            record = records[index]
            recorded_pass = record["index"] if record is not None and record["epoch"] == epoch else None
            pass_index, skip = S.loader_position(mode, consumed, len(recorder), recorded_pass)
            replay_record = None
            if record is not None and record["epoch"] == epoch and record["index"] == pass_index:
                replay_record = _PassRecord.from_state_dict(record)
            elif not S.describe_order(recorder.inner)[1]:
                self._warn_unrecoverable(index)
            replays[index] = _Replay(replay_record, skip, pass_index)
        with _rng.isolated_global():
            self._build(fetcher, replays)
        # replaying moved the loaders' own generators back to where the pass started; a pass that draws (again) at
        # its first next() sets them itself, but one that is never advanced again must still end where it was
        self._restore_loader_generators(rank_state)
        if self.finish_interrupted_batch and epoch_loop.batch_progress.is_last_batch:
            # written at the epoch's last batch: nothing of this epoch is fetched again, but creating its iterator
            # fetched ahead from the datasets that keep their own position; they start the next epoch where they were
            self._reload_dataset_states(rank_state)
        _compat.set_batch_index(self.combined_loader, consumed)  # type: ignore[arg-type]
        if pulled:
            # the epoch loop adds the steps it restored to the fetcher's count; the steps pulled `consumed` batches,
            # and the fetcher tells the epoch's end from that count (one step too many otherwise)
            fetcher.fetched += consumed - epoch_loop.batch_progress.current.ready

    def _rewound_loaders(self, epoch: int) -> list[int]:
        """Loaders whose first iterator here is a new one where the uninterrupted run reused its persistent workers.

        A new iterator draws a worker base seed from the process-wide generator; resetting persistent workers does
        not. Those loaders keep the live states still across that draw.
        """
        n = _compat.reload_every_n_epochs(self.trainer)
        created_at = epoch - epoch % n if n else 0  # when the uninterrupted run last created the loader
        return [
            index
            for index, (loader, recorder) in enumerate(zip(self.loaders, self.recorders))
            if recorder is not None
            and loader.num_workers > 0
            and loader.persistent_workers
            and not _compat.workers_started(loader)
            and epoch > created_at
        ]

    def _build(self, fetcher: _DataFetcher, replays: Mapping[int, _Replay]) -> None:
        """Create the train iterator with the given loaders armed to replay."""
        for index, replay in replays.items():
            self.recorders[index].arm(replay)  # type: ignore[union-attr]
        try:
            iter(fetcher)
        finally:
            for index in replays:
                self.recorders[index].disarm()  # type: ignore[union-attr]

    def _check_checkpoint(self) -> str:
        """How the interrupted epoch continues: ``"exact"``, ``"elastic"`` or ``"restart"`` (the opt-out)."""
        assert self.loaded is not None
        fix = 'pass `MidEpochResume(on_mismatch="restart_epoch")` to continue the epoch from a fresh order'
        current = [S.loader_facts(loader) for loader in self.loaders]
        saved_world_size = self.loaded[S.KEY_WORLD_SIZE]
        elastic = bool(self.loaded.get(S.KEY_ELASTIC)) or saved_world_size != self.trainer.world_size
        try:
            S.check_mode(self.loaded.get(S.KEY_MODE), _compat.combined_mode(self.combined_loader), fix)  # type: ignore[arg-type]
            S.check_loaders(self.loaded[S.KEY_LOADERS], current, fix, same_world_size=not elastic)
            if elastic:
                S.check_elastic(
                    self.loaded[S.KEY_LOADERS], saved_world_size, self.trainer.world_size, fix, self._order_recorded()
                )
        except S.MidEpochResumeError as error:
            if self.on_mismatch == "raise":
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
        rank0 = self._rank_state(0)
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
        loader, recorder = self.loaders[0], self.recorders[0]
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
            rank0 = self._rank_state(0)
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
        layout = _elastic_layout(loader, trainer.world_size)
        mine = _elastic.shard(left, trainer.global_rank, trainer.world_size, layout["drop_last"])
        items: list[Any] = (
            _elastic.batched(mine, layout["batch_size"], layout["batch_drop_last"])
            if loader.batch_sampler is not None
            else mine
        )
        offset = max(len(recorder) - len(items), 0)
        self.elastic = {**elastic, "current": {**layout, "batch_offset": offset}}
        _compat.move_batch_progress(epoch_loop.batch_progress, offset)
        with _rng.isolated_global():
            self._build(fetcher, {0: _Replay(None, 0, 0, batches=items)})
        _compat.set_batch_index(self.combined_loader, offset)  # type: ignore[arg-type]
        _compat.info(
            f"Finishing epoch {trainer.current_epoch} on {trainer.world_size} device(s): {len(left)} samples were"
            f" not consumed before the checkpoint; this rank trains {len(items)} batch(es) of them.",
            trainer,
        )

    def _reload_dataset_states(self, rank_state: Mapping[str, Any] | None) -> None:
        states = list(rank_state.get(S.KEY_DATASET_STATES, [])) if rank_state is not None else []
        for loader, state in zip(self.loaders, states):
            if state is not None:
                loader.dataset.load_state_dict(state)

    def _restore_dataset_states(self, rank_state: Mapping[str, Any] | None) -> None:
        states = list(rank_state.get(S.KEY_DATASET_STATES, [])) if rank_state is not None else []
        states += [None] * (len(self.loaders) - len(states))
        for index, (loader, state) in enumerate(zip(self.loaders, states)):
            if state is not None:
                loader.dataset.load_state_dict(state)
            elif S.loader_kind(loader) == S.KIND_ITERABLE:
                self._warn_iterable(index, loader)
                continue
            buffer = _compat.unsaved_buffer(getattr(loader, "dataset", None))
            if buffer is not None:
                self._warn_buffer(index, loader, buffer)

    def _warn_buffer(self, index: int, loader: Any, buffer: str) -> None:
        name = type(loader.dataset).__name__
        _compat.warn(
            f"Train dataloader {index} iterates over an {name} that draws from {buffer}, which its `state_dict()`"
            " does not hold: the resumed epoch refills the buffer, so some of the epoch's samples are lost, others"
            " seen twice, and the order differs from the uninterrupted run's. To resume exactly, shuffle without a"
            " buffer (a map-style dataset with a shuffling sampler, e.g. `datasets.Dataset` with `shuffle=True`).",
            self.trainer,
            self.warned,
        )

    def _warn_iterable(self, index: int, loader: Any) -> None:
        name = type(getattr(loader, "dataset", loader)).__name__
        _compat.warn(
            f"Train dataloader {index} iterates over an IterableDataset ({name}), which has no sampler to skip at:"
            " the interrupted epoch restarts its iteration from the beginning. To resume it exactly, give"
            f" {name} `state_dict()`/`load_state_dict()` methods that save and restore its position (read in the"
            " main process, so with num_workers=0), or use torchdata's StatefulDataLoader.",
            self.trainer,
            self.warned,
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

    def _warn_unrecoverable(self, index: int) -> None:
        _compat.warn(
            f"The order of train dataloader {index} in the interrupted epoch cannot be recovered from the checkpoint"
            " (it recorded no random state for it). The epoch continues with its remaining number of batches drawn"
            " from a fresh order: some samples of this epoch will be seen twice and others not at all.",
            self.trainer,
            self.warned,
        )


def _rng_roots(loader: Any, index_sampler: Any) -> dict[str, Any]:
    """Where a loader's generators are searched from (the names are the first parts of their saved paths)."""
    return {"loader": loader, "index_sampler": index_sampler}


def _elastic_layout(loader: Any, world_size: int) -> dict[str, Any]:
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
