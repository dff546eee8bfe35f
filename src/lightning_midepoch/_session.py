"""One trainer's mid-epoch resume machinery, from the callback's ``setup`` to the end of its ``fit``.

The session installs the loop and fetcher overrides on its trainer (and only there), wraps the index sampler of each
map-style train loader in a recorder, and holds what its parts share. The parts: what checkpoints save
(:class:`~lightning_midepoch._saving.Saver`), what a resume restores (:class:`~lightning_midepoch._restoring.Restorer`)
and where the resumed run continues (:class:`~lightning_midepoch._planning.ResumePlanner`); the random states inside
DataLoader workers (:class:`~lightning_midepoch._workers.WorkerStates`) and the resumed pass of loaders that keep
their own position (:class:`~lightning_midepoch._passes.ResumedPass`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from torch.utils.data import DataLoader

from lightning_midepoch import _compat, _rng, _workers
from lightning_midepoch import _state as S
from lightning_midepoch._batch_check import BatchCheck, VerifyBatch, outcomes_of_ranks
from lightning_midepoch._fetchers import _FetchingCombinedLoader, _ResumableDataFetcher
from lightning_midepoch._loops import _ResumableFitLoop, _ResumableTrainingEpochLoop
from lightning_midepoch._mixin import mix_in, mixed_copy, unmix
from lightning_midepoch._order import _IndexSamplerRecorder
from lightning_midepoch._passes import ResumedPass
from lightning_midepoch._planning import ResumePlanner
from lightning_midepoch._preemption import SignalDeferral, _DeferringSignalConnector
from lightning_midepoch._restoring import Restorer
from lightning_midepoch._saving import Saver

if TYPE_CHECKING:
    from lightning.pytorch import Trainer
    from lightning.pytorch.loops.fetchers import _DataFetcher
    from lightning.pytorch.utilities.combined_loader import CombinedLoader

OnMismatch = Literal["raise", "restart_epoch"]


class _Session:
    """The state and actions of mid-epoch resume for one trainer during one ``fit``."""

    def __init__(self, trainer: Trainer, on_mismatch: OnMismatch, verify_batch: VerifyBatch = "warn") -> None:
        self.trainer = trainer
        self.on_mismatch = on_mismatch
        self.verify_batch = verify_batch
        self.loaders: list[Any] = []
        self.recorders: list[_IndexSamplerRecorder | None] = []
        self.combined_loader: CombinedLoader | None = None
        self.fetcher: _DataFetcher | None = None
        # flags shared with the loop and fetcher overrides
        self.hold_next_iter = False
        self.iterator_held = False
        self.iterator_started = False  # the resumed epoch's iterator was just started: the next iter() keeps it
        self.finish_interrupted_batch = False
        self.warned: set[str] = set()
        self._originals: list[tuple[object, type]] = []
        self.starting_iterator = False  # the training loop is creating its train iterator (see in_training_fetch)
        self.fetching = False  # the training loop is fetching a batch from its train iterator (likewise)
        self.elastic: dict[str, Any] | None = None  # the epoch being finished on another world size
        self.resuming = False  # this fit resumes from a checkpoint (the loops were restored before it trained)
        self.validated_since_resume = False  # a validation ran in this fit after the restore (see _loops)
        self.trained = False  # the fit loop has set up its data: restores from now on are a tuner's, not a resume
        self.out_of_reach: dict[int, list[str]] = {}  # per loader: where the search for its generators stopped
        self.workers = _workers.WorkerStates()  # the random states inside the train loaders' worker processes
        # the latest two batches fetched from the train loaders in this epoch (the batch check's; see _fetchers)
        self.last_batch: Any = None
        self.previous_batch: Any = None
        self.batch_check = BatchCheck(verify_batch, self._report_batch, self._agree)
        # the parts
        self.resumed_pass = ResumedPass(self)  # loaders that keep a position for one pass, or start lazily
        self.saver = Saver(self)  # what checkpoints save
        self.restorer = Restorer(self)  # what a resume restores
        self.planner = ResumePlanner(self, self.restorer)  # where the resumed run continues

    # ------------------------------------------------------------------ installing
    def install(self) -> None:
        """Put the fit loop's override on this trainer's fit loop (the epoch loop's waits for a restore)."""
        fit_loop = self.trainer.fit_loop
        self._mix(fit_loop, _ResumableFitLoop)
        if fit_loop._data_fetcher is not None:  # pragma: no cover - Lightning creates it inside setup_data
            fit_loop._data_fetcher = fit_loop._data_fetcher  # the fit loop's override adopts it

    def defer_signals(self, deferral: SignalDeferral, declared: tuple[int, ...]) -> None:
        """Put the override on this trainer's signal connector: ``deferral`` holds its handlers that checkpoint.

        And those of the ``declared`` signals, in ``fit``. The connector's own teardown, after the session's, takes
        the override off (signals keep being served until Lightning gives the process its handlers back).
        """
        connector = _compat.signal_connector(self.trainer)
        if not isinstance(connector, _DeferringSignalConnector):
            mix_in(connector, _DeferringSignalConnector)
        vars(connector)["_midepoch_deferral"] = deferral
        vars(connector)["_midepoch_declared"] = declared

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
        self.last_batch = self.previous_batch = None
        self._restore_samplers()
        for obj, original in reversed(self._originals):
            unmix(obj, original)
        self._originals.clear()

    def adopt_fetcher(self, fetcher: _DataFetcher) -> _DataFetcher:
        """Take over the train data fetcher the fit loop just created: returns the fetcher the fit loop keeps.

        That is a copy with the override (:func:`~lightning_midepoch._mixin.mixed_copy`): nothing refers to the new
        fetcher yet, and Lightning reads its attributes at every fetch.
        """
        fetcher, original = mixed_copy(fetcher, _ResumableDataFetcher, first={"_midepoch": self})
        self._originals.append((fetcher, original))
        self.fetcher = fetcher
        return fetcher

    def set_aside_early_iterator(self) -> None:
        """A resume found the train iterator already started (the data was set up before the restore): hold it back.

        The iterator started before the restore drew its order from the process's states then; the resumed epoch's
        is started where the epoch continues, as when the data is set up after the restore. Persistent workers
        started for it are let go; the stateful loaders get the states Lightning restored (which it gives only
        when it sets up the data after the restore: Lightning issue #20550).
        """
        fetcher, combined_loader = self.fetcher, self.combined_loader
        if fetcher is None or combined_loader is None or self.iterator_held:
            return
        for loader in self.loaders:
            _compat.drop_workers(loader)
        if _compat.pending_loader_states(self.trainer.fit_loop):
            _compat.load_loader_states(self.trainer.fit_loop, combined_loader)
        self.hold_next_iter = True
        try:
            iter(fetcher)
        finally:
            self.hold_next_iter = False

    def in_training_fetch(self) -> bool:
        """Whether the training loop is creating or advancing its train iterator (asked where a loader starts a pass).

        Only those passes are the epoch's order; a loader iterated anywhere else (a user's callback, say) is not
        recorded.
        """
        return self.starting_iterator or self.fetching

    def attach(self, combined_loader: CombinedLoader) -> None:
        """Wrap the index sampler of every map-style train loader in a recorder (called before any iterator).

        The ``CombinedLoader`` gets the override that calls :meth:`before_fetch` and :meth:`after_fetch` around every
        fetch of a training batch (:class:`~lightning_midepoch._fetchers._FetchingCombinedLoader`).
        """
        self._restore_samplers()
        self._mix(combined_loader, _FetchingCombinedLoader)
        self.combined_loader = combined_loader
        self.loaders = list(combined_loader.flattened)
        # (searched before the recorders are in place: a search through one would read its sampler's __dict__)
        self.out_of_reach = {
            index: beyond
            for index, loader in enumerate(self.loaders)
            if S.loader_kind(loader) == S.KIND_MAP
            and (beyond := _rng.out_of_reach(_rng_roots(loader, S.index_sampler(loader))))
        }
        self.recorders = [self._install_recorder(loader) for loader in self.loaders]
        self.saver.attach(self.loaders)
        self.workers.attach(self.loaders, self.recorders, self.in_training_fetch)
        for index, loader in enumerate(self.loaders):
            if isinstance(loader, DataLoader) and loader.num_workers > 0 and getattr(loader, "in_order", True) is False:
                self._warn_out_of_order(index)
            recorder = self.recorders[index]
            if recorder is not None and _workers.persist(recorder, loader):
                recorder.on_outside = lambda index=index: self._warn_training_pass_restarted(index)

    def _warn_out_of_order(self, index: int) -> None:
        self.warn(
            f"Train dataloader {index} has `in_order=False`: its workers' batches arrive in the order they finish,"
            " which differs from run to run, so an epoch has no order that a resume could continue. A checkpoint"
            " written in the middle of an epoch resumes by skipping the first batches of the sampler's order, which are"
            " not the batches this run trained on (some samples are trained on twice, others not at all), and the"
            " workers' random states are not those of the batches they produce. Keep `in_order=True` (the default) to"
            " resume exactly."
        )

    def _warn_training_pass_restarted(self, index: int) -> None:
        """A pass of a persistent-workers loader started outside the training loop: it restarts the training's."""
        if _compat.workers_started(self.loaders[index]):
            self.warn(
                f"Train dataloader {index} was iterated outside the training loop during fit (a callback's"
                " `iter(trainer.train_dataloader)`, say). With `persistent_workers=True` a DataLoader has one iterator,"
                " so this restarted the pass the training loop is taking: the rest of this epoch trains on a new pass,"
                " as in stock Lightning, and a checkpoint written before the epoch ends cannot be resumed exactly (the"
                " resumed run warns). Iterate a copy of the loader, or one with `persistent_workers=False`."
            )

    def before_fetch(self) -> None:
        """Called right before every fetch of a training batch."""
        saver = self.saver
        saver.batch_start.take()  # where the batch starts (see Saver.before_fetch)
        # the batch starts: its backward pass has not run (the fetch of the next batch follows the backward)
        saver.backward_done = False
        if saver.fetch_work:
            saver.before_fetch()
        if self.resumed_pass.lazy_starts:
            self.resumed_pass.before_fetch()

    def after_fetch(self) -> None:
        """Called right after every fetch of a training batch (also one that found the iterator exhausted)."""
        if self.resumed_pass.lazy_starts:
            self.resumed_pass.after_fetch()

    def _install_recorder(self, loader: Any) -> _IndexSamplerRecorder | None:
        if S.loader_kind(loader) != S.KIND_MAP:
            return None
        attribute = "batch_sampler" if loader.batch_sampler is not None else "sampler"
        inner = getattr(loader, attribute)
        if isinstance(inner, _IndexSamplerRecorder):
            return inner
        rng_objects = _rng.find_rng_objects(_rng_roots(loader, inner))
        recorder = _IndexSamplerRecorder(
            inner,
            rng_objects,
            lambda: self.trainer.current_epoch,
            observing=self.in_training_fetch,
            drawn=self._pass_drawn,
        )
        # DataLoader forbids reassigning its samplers after __init__; the recorder forwards everything to the original
        object.__setattr__(loader, attribute, recorder)
        return recorder

    def _pass_drawn(self) -> None:
        """A recorded pass yields its first item: its order is drawn, and nothing of it is loaded yet.

        Inside a fetch (a cycling loader starting over, or the epoch's first batch of a sampler that draws at its
        first item), that is where the batch starts: a resumed run replays the pass without drawing, then loads the
        batch again.
        """
        if self.in_training_fetch():
            self.saver.take_batch_start()

    def _restore_samplers(self) -> None:
        self.workers.detach()
        for loader, recorder in zip(self.loaders, self.recorders, strict=True):
            if recorder is not None:
                attribute = "batch_sampler" if loader.batch_sampler is recorder else "sampler"
                object.__setattr__(loader, attribute, recorder.inner)
        self.loaders, self.recorders = [], []

    def warn(self, message: str) -> None:
        """Warn once per message (rank zero, through Lightning's channel)."""
        _compat.warn(message, self.trainer, self.warned)

    # ------------------------------------------------------------------ the batch check
    def _report_batch(self, message: str, fail: bool) -> None:
        if fail:
            raise S.MidEpochResumeError(
                f'{message} (This is an error because of MidEpochResume(verify_batch="raise"); "warn" continues.)'
            )
        self.warn(message)

    def _agree(self, differs: bool) -> list[bool]:
        """Every rank's outcome of the batch check (one collective, at the resumed epoch's start: all reach it)."""
        trainer = self.trainer
        return outcomes_of_ranks(differs, trainer.global_rank, trainer.world_size, trainer.strategy)

    def start_epoch(self) -> None:
        """The train iterator is being created: every recorder's next pass is the epoch's first."""
        self.last_batch = self.previous_batch = None
        self.resumed_pass.epoch_started()
        self.saver.iterator_started()
        self.workers.epoch_started()
        for recorder in self.recorders:
            if recorder is not None:
                recorder.start_epoch()


def _rng_roots(loader: Any, index_sampler: Any) -> dict[str, Any]:
    """Where a loader's generators are searched from (the names are the first parts of their saved paths)."""
    return {"loader": loader, "index_sampler": index_sampler}
