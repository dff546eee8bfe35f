"""What a resume restores: the checkpoint's state, checked when Lightning hands it over.

The random states, the loaders' own generators, iterable datasets' positions and partial gradients it holds are
restored when the resumed run starts training.

:class:`Restorer` is given the session's shared state (:mod:`lightning_midepoch._shared`) and the saver, whose
record of the loaders' positions and the datasets' generators it sets; where each loader continues is
:mod:`lightning_midepoch._planning`'s concern.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Mapping, Set
from typing import TYPE_CHECKING, Any

from lightning_midepoch import _compat, _datalibs, _restart, _rng, _validate
from lightning_midepoch import _state as S

if TYPE_CHECKING:
    from lightning_midepoch._saving import Saver
    from lightning_midepoch._shared import Shared


class Restorer:
    """The checkpoint's MidEpochResume state for one fit, and the restoring of what it holds."""

    def __init__(self, ctx: Shared, saver: Saver) -> None:
        self.ctx = ctx
        self.saver = saver
        self.trainer = ctx.trainer
        self.warned = ctx.warned
        self.loaded: Mapping[str, Any] | None = None  # the checkpoint's state, once Lightning restored the callback
        self._live_pending = False
        self.entry_found = False  # the checkpoint resumed has a MidEpochResume entry (possibly an empty one)
        self.discarded = False  # its entry was damaged and set aside (on_mismatch="restart_epoch"), with a warning
        self.restored_in_batch = False  # the checkpoint resumed was written inside a batch (Lightning re-runs it)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.ctx.trained:
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
        if self.ctx.on_mismatch == "raise":
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
        if not self.ctx.trained and _compat.restoring_checkpoint(self.trainer):
            self.ctx.resuming = True
            # what the stateful loaders are given (if Lightning gives it) is their state before the first fetch
            self.saver.loaded_loader_states = _compat.pending_loader_states(self.trainer.fit_loop)
            self.reopen_stopped_epoch()
            fit_loop = self.trainer.fit_loop
            # where the checkpoint was written, as the model of a restart reads it (lightning_midepoch._restart)
            epoch_stage = _restart.epoch_stage(_restart.Counts.of(fit_loop.epoch_progress.current))
            if fit_loop.restarting and epoch_stage in (_restart.EPOCH_END, _restart.BETWEEN_EPOCHS):
                # every batch of the epoch was run (a checkpoint from on_train_epoch_end, or after fit): Lightning
                # starts the next epoch, except with max_steps set, where its fit loop always counts as restarting
                # and so runs the ended epoch's end again (the next epoch never starts when that reaches max_epochs)
                _compat.stop_restarting(fit_loop)
            batch = fit_loop.epoch_loop.batch_progress.current  # as saved: each stage counted (a _BatchProgress)
            self.restored_in_batch = _restart.batch_stage(_restart.Counts.of(batch)) == _restart.IN_BATCH
            if epoch_stage == _restart.BETWEEN_EPOCHS:
                # written once an epoch had ended (after fit, say): with max_steps set, stock Lightning keeps
                # "restarting" into that epoch's finished batch progress and trains one stray batch before the next
                _compat.start_batch_progress_afresh(fit_loop.epoch_loop.batch_progress)

    def reopen_stopped_epoch(self) -> None:
        """After the loops are restored: a checkpoint written once training stopped early continues that epoch.

        Lightning counts an epoch its training loop left early as finished; a resumed run would start the next one.
        """
        loaded = self.loaded
        fit_loop = self.trainer.fit_loop
        ready = fit_loop.epoch_loop.batch_progress.current.ready
        if loaded is None or not _restart.continues_stopped_epoch(loaded[S.KEY_STOPPED], loaded[S.KEY_FETCHED], ready):
            return  # (also where the loops' state does not come from the moment the state recorded)
        _compat.reopen_epoch(fit_loop.epoch_progress, loaded[S.KEY_EPOCH])
        fit_loop.restarting = True  # Lightning decided "not restarting" from the finished epoch it had restored

    def rank_state(self, rank: int | None = None) -> Mapping[str, Any] | None:
        if self.loaded is None:
            return None
        ranks = self.loaded[S.KEY_RANKS]
        rank = self.trainer.global_rank if rank is None else rank
        return ranks[rank] if rank < len(ranks) else None

    @property
    def elastic_resume(self) -> bool:
        return self.loaded is not None and self.loaded.get(S.KEY_WORLD_SIZE, 1) != self.trainer.world_size

    def restore_live_state(self) -> None:
        """Restore the random states and partial gradients saved with the checkpoint (once, on the first epoch)."""
        if not self._live_pending:
            return
        self._live_pending = False
        # sharded parameters' gradients are laid out as the strategy chooses (FSDP keeps them unsharded inside an
        # accumulation group), not as the parameters are shaped on this rank: they cannot be put back
        sharded = _compat.shards_parameters(self.trainer)
        if self.loaded is not None and not self.elastic_resume and not sharded:
            # the gradients are restored into this model's parameters: a shape they cannot take is damage
            shapes = {name: tuple(p.shape) for name, p in self.trainer.lightning_module.named_parameters()}
            try:
                _validate.check_grads(self.loaded, shapes)
            except _validate.DamagedStateError as error:
                self._discard(error)
                return
        if self.loaded is not None and not self.elastic_resume:
            self._warn_ranks_without_states()
        rank_state = self.rank_state()
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
        self.restore_loader_generators(rank_state)
        grads = rank_state.get(S.KEY_GRADS)
        if grads and self.elastic_resume:
            _compat.warn(
                "The checkpoint was written inside a gradient accumulation group on another number of devices: the"
                " gradients accumulated so far are dropped and the group restarts on the new devices.",
                self.trainer,
                self.warned,
            )
        elif grads and sharded:
            _compat.warn(
                "The checkpoint was written inside a gradient accumulation group under a strategy that shards the"
                " parameters (FSDP): the gradients accumulated so far cannot be put back and are dropped, so the step"
                " that ends the group uses only the gradients of the batches after the checkpoint and the run differs"
                " from the uninterrupted one. Write such checkpoints at accumulation boundaries"
                " (`ModelCheckpoint(every_n_train_steps=...)` does).",
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

    def restore_loader_generators(self, rank_state: Mapping[str, Any] | None, restored: Set[int] = frozenset()) -> None:
        """Set the generators owned by the loaders and their samplers to their states at the checkpoint.

        Those of the loaders in ``restored`` are set by their replayed pass (only missing ones are reported).
        """
        states = rank_state.get(S.KEY_GENERATORS, []) if rank_state is not None else []
        for index, (recorder, objects) in enumerate(zip(self.ctx.recorders, states, strict=False)):
            if recorder is not None and objects:
                if index in restored:
                    missing = [path for path in objects if path not in recorder.rng_objects]
                else:
                    missing = _rng.restore_objects(recorder.rng_objects, objects)
                if missing:
                    self._warn_missing_generators(index, missing)
        self._restore_dataset_generators(rank_state)
        for index, paths in self.ctx.out_of_reach.items():
            _compat.warn(
                f"The sampler chain of train dataloader {index} goes deeper than the search for random generators"
                f" ({', '.join(paths)}): a generator kept there is neither saved nor restored, so the resumed order"
                " and draws may differ from the uninterrupted run's. Keep the generator closer to the DataLoader, or"
                " implement `state_dict()`/`load_state_dict()` on a stateful loader.",
                self.trainer,
                self.warned,
            )

    def _restore_dataset_generators(self, rank_state: Mapping[str, Any] | None) -> None:
        """Set the generators of the datasets read in the main process to their states (they draw as they load)."""
        saver = self.saver
        saved = rank_state.get(S.KEY_DATASET_GENERATORS) if rank_state is not None else None
        for index, states in enumerate(saved or []):
            in_main = index < len(self.ctx.loaders) and not getattr(self.ctx.loaders[index], "num_workers", 0)
            if in_main and states and any(path not in saver.dataset_generators.get(index, {}) for path in states):
                self._create_lazy_generators(index)
        current = saver.dataset_generators
        if rank_state is None or not current:
            return
        for index, objects in current.items():
            states = saved[index] if saved is not None and index < len(saved) else None
            if states is None:
                self._warn_unsaved_dataset_generators(index, list(objects))
                continue
            missing = _rng.restore_objects(objects, states)
            if missing:
                self._warn_missing_generators(index, missing)

    def _create_lazy_generators(self, index: int) -> None:
        """Have loader ``index``'s dataset create the generators it creates on its first sample: load sample 0 once.

        The original dataset had created them by the checkpoint; this one has not yet. The sample is loaded with the
        process-wide states kept still, and its draws from the new generators are overwritten by their saved states.
        """
        dataset = self.ctx.loaders[index].dataset
        with _rng.isolated_global(), contextlib.suppress(Exception):  # (still missing then: reported)
            if callable(getattr(dataset, "__getitems__", None)):
                dataset.__getitems__([0])
            else:
                dataset[0]
        self.saver.find_dataset_generators(index)

    def _warn_unsaved_dataset_generators(self, index: int, paths: list[str]) -> None:
        _compat.warn(
            f"The dataset of train dataloader {index} draws from its own random generator(s) {', '.join(paths)} in"
            " the main process, and the checkpoint holds no states for them (it was written by an earlier release,"
            " or while the loader had workers or its dataset no generators): they continue from their fresh states,"
            " so the samples loaded from now on are augmented differently from the uninterrupted run's. Resume from"
            " a checkpoint written by this release with the same loader to continue them exactly.",
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

    def reload_dataset_states(self, rank_state: Mapping[str, Any] | None) -> None:
        for loader, state in zip(self.ctx.loaders, self._saved_dataset_states(rank_state), strict=False):
            if state is not None:
                loader.dataset.load_state_dict(state)

    def _saved_dataset_states(self, rank_state: Mapping[str, Any] | None) -> list[Any]:
        """The rank's saved dataset states, one per train loader (None where nothing was saved)."""
        states = list(rank_state.get(S.KEY_DATASET_STATES, [])) if rank_state is not None else []
        return states + [None] * (len(self.ctx.loaders) - len(states))

    def restore_dataset_states(
        self,
        rank_state: Mapping[str, Any] | None,
        at_epoch_end: bool = False,
        from_start: bool = False,
        exclude: Collection[int] = (),
    ) -> None:
        """Give the iterable datasets that save their own position the states saved for them.

        ``at_epoch_end``: written at the epoch's last batch, where a shuffle buffer had been emptied (no warning).
        ``from_start``: the resumed pass starts at its beginning (the state is from before a pass's first fetch,
        which Hugging Face's ``IterableDataset`` still reports as its previous pass's: it starts afresh instead).
        ``exclude``: loaders read in workers, whose copies continue from the states their workers saved.
        """
        states = self._saved_dataset_states(rank_state)
        for index, (loader, state) in enumerate(zip(self.ctx.loaders, states, strict=False)):
            if index in exclude:
                continue  # read in workers: each worker's copy continues from its own saved state
            if state is not None:
                loader.dataset.load_state_dict(state)
                if from_start:
                    _datalibs.forget_restored_position(loader.dataset)
            elif S.loader_kind(loader) == S.KIND_ITERABLE:
                self.warn_iterable(index, loader)
                continue
            buffer = _datalibs.unsaved_buffer(getattr(loader, "dataset", None))
            if buffer is not None and not at_epoch_end:
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

    def warn_iterable(self, index: int, loader: Any) -> None:
        """Say that an iterable dataset restarts its iteration in the interrupted epoch."""
        name = type(getattr(loader, "dataset", loader)).__name__
        _compat.warn(
            f"Train dataloader {index} iterates over an IterableDataset ({name}), which has no sampler to skip at:"
            " the interrupted epoch restarts its iteration from the beginning. To resume it exactly, give"
            f" {name} `state_dict()`/`load_state_dict()` methods that save and restore its position (each worker's"
            " copy has its own) and resume with the same num_workers, or use torchdata's StatefulDataLoader.",
            self.trainer,
            self.warned,
        )
