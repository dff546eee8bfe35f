"""What a checkpoint saves: the callback's state at one moment, and the exchange that brings every rank's part in.

:class:`Saver` builds the state of one trainer's session. A checkpoint can be written while ``fit`` runs or after it
ended (``trainer.save_checkpoint`` once ``fit`` returned or raised), so the state of the moment training stopped is
kept as a :class:`Snapshot`: a checkpoint written later records where the run stopped and the random states it had
then, not what the process did afterwards. :func:`gather` brings every rank's part to the rank that writes the file.
"""

from __future__ import annotations

import pickle
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from lightning_midepoch import _batch_check, _compat, _datalibs, _rng
from lightning_midepoch import _state as S
from lightning_midepoch.__about__ import __version__

if TYPE_CHECKING:
    from lightning_midepoch._shared import Shared
    from lightning_midepoch._workers import WorkerStates


@dataclass(frozen=True)
class Snapshot:
    """The callback's state at one moment: what every rank shares, and this rank's own part."""

    facts: dict[str, Any]  # every key of the state but the ranks'
    rank_state: dict[str, Any]
    rank: int
    world_size: int
    own_only: bool  # taken while handling an exception: the ranks may not be there to exchange their states

    def state_dict(self) -> dict[str, Any]:
        """The state as Lightning stores it: every rank's part, in global rank order, in the one written file."""
        return {**self.facts, S.KEY_RANKS: gather(self.rank_state, self.rank, self.world_size, self.own_only)}


class Saver:
    """What one trainer's checkpoints save: the live states, and those of the moments Lightning re-runs from.

    Lightning re-runs what a checkpoint interrupted: an epoch's start, a batch, and (with the callback) the rest of
    an epoch the training loop left early. The saver keeps the states of those moments, read as they pass (cheaply:
    torch's generator state at each batch, the process-wide states at each epoch), and builds the state to save.
    """

    def __init__(self, ctx: Shared, workers: WorkerStates) -> None:
        self.ctx = ctx
        self.workers = workers  # the random states inside the train loaders' worker processes
        # iterable datasets that save their own position: their states before each of the latest fetches of this
        # epoch's iterator, each with the fetcher's count of fetched batches then
        self.dataset_history: dict[int, deque[tuple[int, Any]]] = {}
        # ... and the pass each is in: its epoch's iterator was started (a checkpoint at an epoch's start tells)
        self.dataset_passes: dict[int, dict[str, Any]] = {}
        # loaders that save their own position (Lightning saves it): their states before the latest fetches, likewise
        self.loader_history: dict[int, deque[tuple[int, Any]]] = {}
        self.follows_positions = False  # some of the above: before_fetch follows their positions
        self.fetch_work = False  # before_fetch has something to do (positions, or the generators below)
        # per loader without workers: the generators its dataset owns (by path), and their states before the fetch
        self.dataset_generators: dict[int, dict[str, Any]] = {}
        self.dataset_generators_at_fetch: dict[int, dict[str, Any]] = {}
        self._in_chains: set[int] = set()  # generators the sampler chains hold (their pass records restore them)
        # the states Lightning gives them on a mid-epoch resume, until the resumed pass has fetched
        self.loaded_loader_states: list[Any] = []
        self.epoch_start: dict[str, Any] | None = None  # before on_train_epoch_start
        # the process-wide generators before the batch was fetched
        self.batch_start = _rng.BatchStartStates()
        # the current batch's backward has run (the callback's on_after_backward says so): a checkpoint inside the
        # batch may then find gradients pending (manual optimization, or accumulating gradients)
        self.backward_done = False
        self.stopped: Snapshot | None = None  # the training loop stopped before the epoch's end: the state then
        # the process-wide generators as the fit's current validation started (None: none runs): a checkpoint written
        # inside it resumes by running that validation again
        self.validation_start: dict[str, Any] | None = None
        self.before_validation: dict[str, Any] | None = None  # (taken at the end of the batch a validation follows)
        # a signal handler runs where the ranks may not all be (training is over): its checkpoint holds this rank's
        # states only and waits for no worker
        self.apart = False
        # the batch (the epoch loop's total count of processed batches) in which the callback's own
        # on_train_batch_end last ran (see hooks_after)
        self.own_batch_end = -1

    def attach(self, loaders: list[Any]) -> None:
        """Follow the train loaders' positions and the generators of the datasets read in the main process.

        Positions: those of iterable datasets and loaders that save their own (``state_dict``).
        """
        self.dataset_history = {
            index: deque(maxlen=8) for index, loader in enumerate(loaders) if _saves_dataset_state(loader)
        }
        self.dataset_passes = {}
        self.loader_history = {
            index: deque(maxlen=8) for index, loader in enumerate(loaders) if S.loader_kind(loader) == S.KIND_STATEFUL
        }
        self.follows_positions = bool(self.dataset_history or self.loader_history)
        # (one that the sampler chain holds too is the pass records' to restore)
        chains = [recorder.rng_objects.values() if recorder is not None else () for recorder in self.ctx.recorders]
        self._in_chains = {id(obj) for objects in chains for obj in objects}
        self.dataset_generators = {}
        self.dataset_generators_at_fetch = {}
        self.find_dataset_generators()

    def find_dataset_generators(self, index: int | None = None) -> None:
        """Search the datasets read in the main process (or loader ``index``'s) for generators they own.

        Searched when the loaders are set up, and again at each checkpoint and before a resume: a dataset may create
        its generator on its first sample.
        """
        for position, loader in enumerate(self.ctx.loaders):
            if index is not None and position != index:
                continue
            found = _main_process_generators(loader)
            objects = {path: obj for path, obj in found.items() if id(obj) not in self._in_chains}
            if objects:
                self.dataset_generators[position] = objects
        self.fetch_work = self.follows_positions or bool(self.dataset_generators)

    def epoch_started(self) -> None:
        """Called before each epoch's ``on_train_epoch_start`` (and sampler epoch)."""
        self.epoch_start = _rng.capture_global(include_cuda=True)
        self.stopped = None

    def before_fetch(self) -> None:
        """Called right before every fetch from the train loaders, where :attr:`fetch_work` says there is work.

        The recording (:class:`~lightning_midepoch._recording.Recording`) reads the process-wide states first
        (``batch_start.take()``, which runs at every batch): a checkpoint written inside the batch makes a resumed run
        fetch it again, and a dataset read in the main process draws its augmentation as its samples are loaded, so
        the re-run batch starts from the states before the fetch (see
        :class:`lightning_midepoch._rng.BatchStartStates`). Here: the datasets' own generators, and the loaders'
        positions.
        """
        self._take_dataset_generators()
        if self.follows_positions:
            self._follow_positions()

    def take_batch_start(self) -> None:
        """Copy the states a batch starts from again: a pass's order was drawn in the fetch, before any loading."""
        self.batch_start.take()
        self._take_dataset_generators()

    def _take_dataset_generators(self) -> None:
        if self.dataset_generators:
            self.dataset_generators_at_fetch = {
                index: _rng.capture_objects(objects) for index, objects in self.dataset_generators.items()
            }

    def _follow_positions(self) -> None:
        """The positions of the train loaders that save their own, before the fetch."""
        fetched = getattr(self.ctx.fetcher, "fetched", 0)
        for index, history in self.dataset_history.items():
            history.append((fetched, self.ctx.loaders[index].dataset.state_dict()))
        # a copy: a loader may hand out (and later update) its own state object. Before the first fetch of a resumed
        # pass the state is the one it was given: litdata's StreamingDataLoader would overwrite that with its dataset's
        # still stale epoch if asked now
        loaded, self.loaded_loader_states = self.loaded_loader_states, []
        for position, (index, history) in enumerate(self.loader_history.items()):
            state = loaded[position] if position < len(loaded) else self.ctx.loaders[index].state_dict()
            history.append((fetched, _dicts_copied(state)))

    def iterator_started(self) -> None:
        """Called when the epoch's train iterator is (re)created: the fetcher counts its batches from zero again.

        The pass record says that this epoch's iterator was started, and the states it started from. Lightning starts
        the first epoch's iterator before ``on_train_epoch_start``: a checkpoint written there must not start it
        again (a DataLoader iterator draws its base seed from torch's process-wide generator), as with a map-style
        loader's pass record.
        """
        epoch = self.ctx.trainer.current_epoch
        for history in self.loader_history.values():
            history.clear()
        for index, history in self.dataset_history.items():
            history.clear()
            at_iter = {"global": _rng.capture_global(), "objects": {}}
            self.dataset_passes[index] = {"epoch": epoch, "index": 0, "at_iter": at_iter, "at_first_next": None}

    def batch_end_reached(self) -> None:
        """The callback's own ``on_train_batch_end`` ran: the callbacks after it in this batch run after it too."""
        total: Any = self.ctx.trainer.fit_loop.epoch_loop.batch_progress.total
        self.own_batch_end = total.processed

    def hooks_after(self) -> list[str]:
        """The ``on_train_batch_end`` hooks that run after a checkpoint written now, in that hook of a training batch.

        A resume from it continues after the batch and runs none of them: what they change is in no checkpoint.
        Lightning runs the callbacks' hooks in ``trainer.callbacks`` order, then the LightningModule's, and does not
        say which callback writes. Named (see :func:`~lightning_midepoch._compat.batch_end_hooks_kept`): the module's,
        and, where the checkpoint comes before the callback's own hook (a callback listed before it writes, or a
        signal handler served in it), the callbacks listed after the callback. Where the writer comes after the
        callback, the callbacks after the writer cannot be told from those before it: they are not named.
        """
        trainer = self.ctx.trainer
        total: Any = trainer.fit_loop.epoch_loop.batch_progress.total
        if not (trainer.training and total.ready == total.started == total.processed == total.completed + 1):
            return []
        objects: list[Any] = [trainer.lightning_module]
        if self.own_batch_end != total.processed:
            callbacks = list(getattr(trainer, "callbacks", ()))
            ours = [
                i
                for i, callback in enumerate(callbacks)
                if getattr(vars(callback).get("_session"), "ctx", None) is self.ctx
            ]
            objects += callbacks[ours[0] + 1 :] if ours else []
        return _compat.batch_end_hooks_kept(trainer, objects)

    def state_dict(self) -> dict[str, Any]:
        """The callback's checkpoint state (see :mod:`lightning_midepoch._state` for the layout)."""
        return self.snapshot().state_dict()

    def snapshot(self, ranks_together: bool = False) -> Snapshot:
        """The state to save now: as of the moment the training loop stopped early, if it did; otherwise now.

        ``ranks_together``: while handling an exception, every rank is known to handle the same one at the same point
        (Lightning's SIGTERM exception, after every rank served SIGTERM at one agreed point): the checkpoint written
        then gathers every rank's states, as any other does.
        """
        if self.stopped is not None:
            return self.stopped
        return self._snapshot_now(stopped=False, ranks_together=ranks_together)

    def epoch_loop_ended(self) -> None:
        """Called when the epoch's training loop has returned, before the epoch's end hooks.

        If it stopped before the epoch's end (``max_steps``, ``max_time``, ``trainer.should_stop``), Lightning
        counts the epoch as finished, but a longer run would have continued it: checkpoints written from now on
        record this moment, and resuming one continues the epoch.
        """
        epoch_loop = self.ctx.trainer.fit_loop.epoch_loop
        progress = epoch_loop.batch_progress.current
        finished_batches = 0 < progress.ready == progress.completed  # not cancelled by on_train_batch_start -> -1
        if finished_batches and not _compat.all_batches_reached(epoch_loop):
            self.stopped = self._snapshot_now(stopped=True)

    def _snapshot_now(self, stopped: bool, ranks_together: bool = False) -> Snapshot:
        trainer, ctx = self.ctx.trainer, self.ctx
        self.find_dataset_generators()  # (one created since, on a first sample, is saved from now on)
        passes: list[dict[str, Any] | None] = [
            recorder.record.state_dict()
            if recorder is not None and recorder.record is not None
            else self.dataset_passes.get(index)
            for index, recorder in enumerate(self.ctx.recorders)
        ]
        grads = self._partial_grads()
        inside_batch = self._inside_batch()
        # the batch check: a resumed run loads the last batch trained again, so the positions saved are before it
        last_batch = self._last_batch(inside_batch)
        rewind = int(last_batch is not None)
        rank_state = {
            S.KEY_RNG: self._live_states(inside_batch, grads_pending=grads is not None),
            S.KEY_PASSES: passes,
            S.KEY_GENERATORS: [
                _rng.capture_objects(recorder.rng_objects) if recorder is not None else None
                for recorder in self.ctx.recorders
            ],
            S.KEY_DATASET_STATES: [self._dataset_state(index, rewind) for index in range(len(self.ctx.loaders))],
            S.KEY_GRADS: grads,
            S.KEY_LAST_BATCH: last_batch,
        }
        if self.dataset_generators:  # (the key is absent where no dataset read in the main process owns a generator)
            rank_state[S.KEY_DATASET_GENERATORS] = [
                self._dataset_generator_states(index, inside_batch) for index in range(len(self.ctx.loaders))
            ]
        if self.workers.loaders:
            epoch_ended = bool(ctx.trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)
            # (handling an exception, nothing waits for the workers: they may be gone, or never have started)
            wait = not (_compat.interrupted(trainer) or self.apart)
            rank_state[S.KEY_WORKERS] = self.workers.state_dict(self._worker_positions(rewind), epoch_ended, wait)
        fetcher = self.ctx.fetcher
        fetched = 0
        if fetcher is not None and fetcher.iterator is not None:
            fetched = fetcher.fetched - len(_compat.held_batches(fetcher))
        facts = {
            S.KEY_VERSION: S.STATE_VERSION,
            S.KEY_PACKAGE_VERSION: __version__,
            S.KEY_LIGHTNING_VERSION: _compat.lightning_version(trainer),
            S.KEY_TORCH_VERSION: str(torch.__version__),
            S.KEY_EPOCH: trainer.current_epoch,
            S.KEY_FETCHED: fetched,
            S.KEY_STOPPED: stopped,
            S.KEY_WORLD_SIZE: trainer.world_size,
            S.KEY_MODE: _compat.combined_mode(self.ctx.combined_loader) if self.ctx.combined_loader is not None else "",
            S.KEY_ELASTIC: ctx.elastic if ctx.elastic and ctx.elastic["epoch"] == trainer.current_epoch else None,
            S.KEY_LOADERS: [S.loader_facts(loader) for loader in self.ctx.loaders],
        }
        hooks_after = self.hooks_after()
        if hooks_after:  # (the key is absent where none is named)
            facts[S.KEY_HOOKS_AFTER] = hooks_after
        interrupted = _compat.interrupted(trainer)
        own_only = (interrupted and not ranks_together) or self.apart
        return Snapshot(facts, rank_state, trainer.global_rank, trainer.world_size, own_only)

    def _last_batch(self, inside_batch: bool) -> dict[str, Any] | None:
        """The batch check's entry: the last batch trained, fingerprinted, and the states it was loaded from.

        None where a resumed run cannot load that batch again as it does for a checkpoint written inside it: inside
        a batch (it is loaded again anyway), at an epoch's start or last batch, while handling an exception, where
        steps pull their own batches, loaders keep their own position or are left to Lightning (their positions are
        Lightning's to restore), an iterable without a position of its own is read (the resumed epoch restarts it
        from its beginning, as stock Lightning does: no position to load its last batch again from), where workers
        hand batches over out of order, or where the states the batch was loaded from are gone (loaded in the main
        process before the batch Lightning holds ahead, or before a generator its dataset created on a first sample
        was found).
        """
        ctx = self.ctx
        trainer, fetcher = ctx.trainer, ctx.fetcher
        if ctx.verify_batch == "off" or inside_batch or _compat.interrupted(trainer) or self._inside_epoch_start():
            return None
        if fetcher is None or fetcher.iterator is None or _compat.steps_pull_batches(fetcher):
            return None
        if _compat.all_batches_reached(trainer.fit_loop.epoch_loop) or (
            ctx.elastic and ctx.elastic["epoch"] == trainer.current_epoch
        ):
            return None
        kinds = [S.loader_kind(loader) for loader in ctx.loaders]
        if S.KIND_STATEFUL in kinds or S.KIND_FOREIGN in kinds or any(map(_out_of_order, ctx.loaders)):
            return None
        if any(_restarts(kind, loader) for kind, loader in zip(kinds, ctx.loaders, strict=True)):
            return None
        held = len(_compat.held_batches(fetcher))
        if held > 1 or (held and any(not getattr(loader, "num_workers", 0) for loader in ctx.loaders)):
            return None
        batch = ctx.previous_batch if held else ctx.last_batch
        at_fetch = self.dataset_generators_at_fetch
        if batch is None or any(set(at_fetch.get(i, ())) != set(gens) for i, gens in self.dataset_generators.items()):
            return None
        # (the CPU generators a batch is loaded from: the isolation around loading it again leaves CUDA's alone)
        rng = {kind: state for kind, state in self.batch_start.states().items() if kind != "cuda"}
        entry: dict[str, Any] = {"fingerprint": _batch_check.fingerprint(batch), "rng": rng}
        if self.dataset_generators:
            entry["dataset_generators"] = [at_fetch.get(index) for index in range(len(ctx.loaders))]
        return entry

    def _worker_positions(self, rewind: int) -> dict[int, int]:
        """Per loader with workers: the batches of its current pass a resumed run does not fetch again.

        ``rewind``: the batches before that the resumed run loads again for the batch check.
        """
        ctx = self.ctx
        fetcher = ctx.fetcher
        batch = ctx.trainer.fit_loop.epoch_loop.batch_progress.current
        if _compat.steps_pull_batches(fetcher):  # steps pull their batches: the fetcher counts them
            consumed = fetcher.fetched - len(_compat.held_batches(fetcher)) if fetcher is not None else 0
        else:
            # as the resumed run counts them; written inside a batch, Lightning fetches that batch again
            consumed = batch.ready - (1 if batch.processed < batch.ready else 0) - rewind  # type: ignore[attr-defined]
        mode = _compat.combined_mode(ctx.combined_loader) if ctx.combined_loader is not None else ""
        positions = {}
        for index in self.workers.loaders:
            recorder = ctx.recorders[index]
            record = recorder.record if recorder is not None else None
            if recorder is None:  # an iterable dataset: one pass per epoch
                positions[index] = max(consumed, 0)
                continue
            if record is None:
                positions[index] = 0
                continue
            pass_index, position = S.loader_position(mode, max(consumed, 0), len(recorder), record.index)
            if pass_index != record.index:
                position = 0 if pass_index < record.index else len(recorder)
            positions[index] = position
        return positions

    def loader_states(self) -> list[Any] | None:
        """The states of the loaders that save their own position, where Lightning's are not those to resume from.

        Lightning saves such a loader's state as it is when the checkpoint is written: after the batches its fetcher
        fetched ahead (an unsized loader's next one), and after the batch in progress, which a resumed run fetches
        again; a resumed loader would skip them. Here each is the state before the first batch a resumed run fetches,
        in the order of Lightning's list; ``None`` where Lightning's own is right (nothing pending).
        """
        if not self.loader_history or self.stopped is not None:
            return None
        states = []
        for index, history in self.loader_history.items():
            loader = self.ctx.loaders[index]
            state = self._pending_state(history, lambda: None)
            stale = _datalibs.lags_a_pass(getattr(loader, "dataset", None))
            if state is not None and state is _pending_first(history) and stale:
                # before a pass's first fetch, a Hugging Face IterableDataset still reports its previous pass
                self._warn_pass_start(index, loader)
                state = None
            states.append(state)
        return states if any(state is not None for state in states) else None

    def _warn_pass_start(self, index: int, loader: Any) -> None:
        _compat.warn(
            f"A checkpoint was written before the first batch of train dataloader {index} ({type(loader).__name__})"
            f" was finished, while its {type(loader.dataset).__name__} still reported its previous pass as its state:"
            " the checkpoint holds the loader's state after the batches Lightning had fetched, which a resumed run"
            " skips (as stock Lightning does). Checkpoints written later in the epoch resume exactly.",
            self.ctx.trainer,
            self.ctx.warned,
        )

    def _dataset_state(self, index: int, rewind: int) -> Any:
        """An iterable dataset's own position at the first batch a resumed run fetches (before its fetch)."""
        history = self.dataset_history.get(index)
        if history is None:
            return None
        return self._pending_state(history, self.ctx.loaders[index].dataset.state_dict, rewind)

    def _pending_state(self, history: deque[tuple[int, Any]], current: Any, rewind: int = 0) -> Any:
        """From a history of states before fetches: the state before the first fetch a resumed run makes again."""
        fetcher = self.ctx.fetcher
        pending = len(_compat.held_batches(fetcher)) + rewind  # fetched ahead, not consumed yet; loaded again
        batch = self.ctx.trainer.fit_loop.epoch_loop.batch_progress.current
        if batch.processed < batch.ready and not _compat.steps_pull_batches(fetcher):  # type: ignore[attr-defined]
            pending += 1  # written inside a batch: Lightning fetches that batch again
        # the fetches that returned a batch (the fetcher counted one more after them); not the one that met the end
        counts = [count for count, _ in history]
        fetches = [
            state
            for (count, state), later in zip(history, [*counts[1:], getattr(fetcher, "fetched", 0)], strict=True)
            if later > count
        ]
        if pending and len(fetches) >= pending:
            return fetches[-pending]
        return current()

    def _inside_epoch_start(self) -> bool:
        """Written inside ``on_train_epoch_start``: a resumed run runs the epoch's start again."""
        epoch = self.ctx.trainer.fit_loop.epoch_progress.current
        return bool(epoch.started < epoch.ready and self.epoch_start is not None)  # type: ignore[attr-defined]

    def _inside_batch(self) -> bool:
        """Written inside a batch (on_train_batch_start, training_step, backward, optimizer step).

        A resumed run fetches the batch again and runs it again, from the states it started with.
        """
        batch = self.ctx.trainer.fit_loop.epoch_loop.batch_progress.current  # (each stage counted)
        return bool(batch.processed < batch.ready and self.batch_start.taken)  # type: ignore[attr-defined]

    def _dataset_generator_states(self, index: int, inside_batch: bool) -> dict[str, Any] | None:
        """The states of the generators a dataset read in the main process owns: the resumed run loads from them."""
        objects = self.dataset_generators.get(index)
        if not objects:
            return None
        if inside_batch and index in self.dataset_generators_at_fetch:
            return self.dataset_generators_at_fetch[index]
        return _rng.capture_objects(objects)

    def _live_states(self, inside_batch: bool, grads_pending: bool) -> dict[str, Any]:
        """The states the resumed run continues from: now, unless Lightning will re-run what is in progress."""
        live = _rng.capture_global(include_cuda=True)
        if self.validation_start is not None:
            return self.validation_start
        if self._inside_epoch_start():
            return self.epoch_start  # type: ignore[return-value]
        if inside_batch:
            if self.backward_done and grads_pending:
                self._warn_backward_rerun()
            return {**live, **self.batch_start.states()}
        return live

    def _warn_backward_rerun(self) -> None:
        if self.ctx.trainer.lightning_module.automatic_optimization:
            message = (
                "A checkpoint was written after the backward pass of a batch inside a gradient accumulation group."
                " Resuming it runs that batch again and adds its gradients a second time: the resumed run will differ"
                " slightly."
            )
        else:
            message = (
                "A checkpoint was written after a backward pass of a batch (manual optimization), with gradients not"
                " yet used by an optimizer step. Resuming it runs that batch again: unless its training_step zeroes"
                " the gradients before its backward pass, that batch's gradients are added a second time and the"
                " resumed run will differ slightly."
            )
        _compat.warn(
            f"{message} Write checkpoints in on_train_batch_end (as ModelCheckpoint does).",
            self.ctx.trainer,
            self.ctx.warned,
        )

    def _partial_grads(self) -> dict[str, torch.Tensor] | None:
        """Gradients accumulated so far and not yet stepped with (Lightning's checkpoint does not hold them).

        Under automatic optimization: inside an unfinished accumulation group, or inside any batch of a group but its
        first (the group's last included: Lightning zeroes the gradients at a group's first batch only, so a resumed
        run that runs such a batch again adds to the gradients of the group's earlier batches, which it needs).
        Under manual optimization the step decides when it steps: whenever a gradient is not all zero bits (no
        pending gradients, the usual case at a step's end, keeps the checkpoint small; all-zero gradients come back
        as ``None``, as they start in any fit).
        """
        trainer = self.ctx.trainer
        module = trainer.lightning_module
        if module.automatic_optimization:
            epoch_loop = trainer.fit_loop.epoch_loop
            batch = epoch_loop.batch_progress.current
            in_batch = batch.processed < batch.ready  # type: ignore[attr-defined]
            rerun_continues_group = in_batch and epoch_loop.batch_idx % trainer.accumulate_grad_batches != 0
            if not (rerun_continues_group or epoch_loop._should_accumulate()):
                return None
        pending = {name: p.grad for name, p in module.named_parameters() if p.grad is not None}
        if not module.automatic_optimization and not any(map(_nonzero_bits, pending.values())):
            return None
        return {name: grad.detach().cpu().clone() for name, grad in pending.items()} or None


def _nonzero_bits(tensor: torch.Tensor) -> bool:
    """Whether any element of ``tensor`` has a bit set (``-0.0`` counts: it is not the zero a fresh fit starts from).

    Example:
        >>> _nonzero_bits(torch.zeros(3)), _nonzero_bits(torch.tensor([0.0, -0.0])), _nonzero_bits(torch.ones(()))
        (False, True, True)

    """
    return bool(tensor.detach().reshape(-1).view(torch.uint8).any())


def _pending_first(history: deque[tuple[int, Any]]) -> Any:
    """The state recorded before a pass's first fetch, if the history still holds it."""
    return history[0][1] if history and history[0][0] == 0 else None


def _dicts_copied(state: Any) -> Any:
    """A copy of the nested dicts of a loader's state, sharing everything else (lists, tensors, strings, numbers).

    A loader may update the dict it handed out (litdata's ``StreamingDataLoader`` returns its dataset's own state dict
    and updates it at the next call); lists in a state are replaced, not changed, by the libraries read (torchdata
    0.11.0, litdata 0.2.76), and a litdata state lists every chunk of its dataset: copying them at every fetch would
    cost time proportional to the dataset's size.

    Example:
        >>> state = {"dataset": {"num_samples_yielded": 4, "chunks": [0, 1]}}
        >>> copied = _dicts_copied(state)
        >>> state["dataset"]["num_samples_yielded"] = 6
        >>> copied, copied["dataset"]["chunks"] is state["dataset"]["chunks"]
        ({'dataset': {'num_samples_yielded': 4, 'chunks': [0, 1]}}, True)

    """
    if isinstance(state, dict):
        return {key: _dicts_copied(value) for key, value in state.items()}
    return state


def _main_process_generators(loader: Any) -> dict[str, Any]:
    """The generators the dataset of a loader without worker processes owns, by path (``dataset.<attribute>``).

    It draws from them in the main process as its samples are loaded; with workers, each worker's copy draws from
    its own (:mod:`lightning_midepoch._workers`).
    """
    if getattr(loader, "num_workers", 0) or getattr(loader, "dataset", None) is None:
        return {}
    return _rng.find_dataset_generators(loader.dataset)


def _restarts(kind: str, loader: Any) -> bool:
    """Whether a resumed epoch restarts ``loader`` from its beginning: an iterable whose dataset keeps no position.

    Example:
        >>> _restarts(S.KIND_ITERABLE, [0, 1, 2])
        True

    """
    return kind == S.KIND_ITERABLE and not S.is_stateful(getattr(loader, "dataset", None))


def _out_of_order(loader: Any) -> bool:
    """A loader whose workers hand their batches over as they finish them (no order a resume could continue)."""
    return bool(getattr(loader, "num_workers", 0)) and getattr(loader, "in_order", True) is False


def _saves_dataset_state(loader: Any) -> bool:
    """An iterable dataset in the main process that saves its own position (``state_dict``)."""
    dataset = getattr(loader, "dataset", None)
    return S.loader_kind(loader) == S.KIND_ITERABLE and S.is_stateful(dataset) and loader.num_workers == 0


def gather(rank_state: dict[str, Any], rank: int, world_size: int, own_only: bool) -> list[dict[str, Any] | None]:
    """Every rank's state in global rank order, on rank 0, which writes the checkpoint; other ranks get their own.

    Rank 0 receives the other ranks' states one rank at a time, each tensor straight into a tensor of its own
    (:func:`_send` and :func:`_receive`); no rank pickles a tensor, so none but the writing one calls ``torch.save``,
    as in stock Lightning. Rank 0 holds its own state, the states received so far and one message; every other rank
    sends its state from where it lies and receives nothing.

    Example:
        >>> gather({"rng": {}}, rank=0, world_size=1, own_only=False)
        [{'rng': {}}]

    """
    states: list[dict[str, Any] | None] = [None] * world_size
    if world_size == 1 or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [rank_state]
    states[rank] = rank_state
    if own_only:
        return states  # each rank's checkpoint holds its own states only
    device = _message_device()
    if rank != 0:
        _send(rank_state, device)
        return states
    for source in range(1, world_size):
        states[source] = _receive(source, device)
    return states


def _message_device() -> torch.device:
    """Where point-to-point messages must lie: the CPU for gloo (and MPI), this rank's GPU for NCCL.

    NCCL moves CUDA tensors only (Lightning's DDP on GPUs uses it); torch's object collectives make the same choice.
    """
    backend = str(torch.distributed.get_backend())
    if "gloo" in backend or "mpi" in backend or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


@dataclass(frozen=True)
class _WireTensor:
    """A tensor's place in a message: its dtype and shape; its bytes follow the message's header."""

    dtype: str
    shape: tuple[int, ...]


def _to_wire(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """Replace every tensor in nested dicts, lists and tuples by a :class:`_WireTensor`, appending it to ``tensors``.

    Example:
        >>> tensors = []
        >>> header = _to_wire({"a": [torch.arange(3, dtype=torch.bfloat16)]}, tensors)
        >>> header, len(tensors)
        ({'a': [_WireTensor(dtype='bfloat16', shape=(3,))]}, 1)

    """
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _WireTensor(str(obj.dtype).removeprefix("torch."), tuple(obj.shape))
    if isinstance(obj, dict):
        return {key: _to_wire(value, tensors) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_wire(value, tensors) for value in obj)
    return obj


def _from_wire(obj: Any, fill: Any) -> Any:
    """The inverse of :func:`_to_wire`: ``fill(wire_tensor)`` gives each tensor, in the order they were appended."""
    if isinstance(obj, _WireTensor):
        return fill(obj)
    if isinstance(obj, dict):
        return {key: _from_wire(value, fill) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_from_wire(value, fill) for value in obj)
    return obj


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's memory as a flat uint8 tensor (a view: no copy)."""
    return tensor.reshape(-1).view(torch.uint8)


def _send(state: dict[str, Any], device: torch.device) -> None:
    """Send a state to rank 0: the header's size, the pickled header, then each non-empty tensor's bytes."""
    tensors: list[torch.Tensor] = []
    header = pickle.dumps(_to_wire(state, tensors))
    torch.distributed.send(torch.tensor([len(header)], dtype=torch.int64, device=device), dst=0)
    torch.distributed.send(torch.frombuffer(bytearray(header), dtype=torch.uint8).to(device), dst=0)
    for tensor in tensors:
        if tensor.numel():
            # a view of the tensor itself on the message's device (a copy only if it lies elsewhere or is strided)
            torch.distributed.send(_as_bytes(tensor.detach().to(device).contiguous()), dst=0)


def _receive(source: int, device: torch.device) -> dict[str, Any]:
    """Receive a state sent by :func:`_send`, each tensor into a CPU tensor of its own dtype and shape."""
    size = torch.empty(1, dtype=torch.int64, device=device)
    torch.distributed.recv(size, src=source)
    header = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    torch.distributed.recv(header, src=source)
    wire = pickle.loads(header.cpu().numpy().tobytes())  # a header of small objects: ints, strings, dtypes
    del header

    def fill(spec: _WireTensor) -> torch.Tensor:
        tensor = torch.empty(spec.shape, dtype=getattr(torch, spec.dtype))
        if tensor.numel():
            if device.type == "cpu":
                torch.distributed.recv(_as_bytes(tensor), src=source)  # straight into the tensor's memory
            else:
                message = torch.empty(tensor.nbytes, dtype=torch.uint8, device=device)
                torch.distributed.recv(message, src=source)
                _as_bytes(tensor).copy_(message)
        return tensor

    state: dict[str, Any] = _from_wire(wire, fill)
    return state
