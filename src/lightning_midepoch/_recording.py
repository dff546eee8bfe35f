"""The train loaders as one fit sees them: a recorder on each map-style loader's index sampler, and their events.

:class:`Recording` puts an :class:`~lightning_midepoch._order._IndexSamplerRecorder` in place of the index sampler
of every map-style train loader (and gives the originals back), and passes on what the fetcher and ``CombinedLoader``
overrides (:mod:`lightning_midepoch._fetchers`) see: an epoch's train iterator being created, a training batch about
to be fetched and just fetched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader

from lightning_midepoch import _compat, _rng, _workers
from lightning_midepoch import _state as S
from lightning_midepoch._order import _IndexSamplerRecorder

if TYPE_CHECKING:
    from lightning.pytorch.utilities.combined_loader import CombinedLoader

    from lightning_midepoch._batch_check import BatchCheck
    from lightning_midepoch._passes import ResumedPass
    from lightning_midepoch._saving import Saver
    from lightning_midepoch._shared import Shared


class Recording:
    """The recorders on one trainer's train loaders, and the events of its train iterator and fetches."""

    def __init__(
        self,
        ctx: Shared,
        saver: Saver,
        workers: _workers.WorkerStates,
        resumed_pass: ResumedPass,
        batch_check: BatchCheck,
    ) -> None:
        self.ctx = ctx
        self.saver = saver
        self.workers = workers
        self.resumed_pass = resumed_pass
        self.batch_check = batch_check  # (the CombinedLoader override hands it a resumed iterator)

    def attach(self, combined_loader: CombinedLoader) -> None:
        """Wrap the index sampler of every map-style train loader in a recorder (called before any iterator)."""
        ctx = self.ctx
        self.detach()
        ctx.combined_loader = combined_loader
        ctx.loaders = list(combined_loader.flattened)
        # (searched before the recorders are in place: a search through one would read its sampler's __dict__)
        ctx.out_of_reach = {
            index: beyond
            for index, loader in enumerate(ctx.loaders)
            if S.loader_kind(loader) == S.KIND_MAP
            and (beyond := _rng.out_of_reach(_rng_roots(loader, S.index_sampler(loader))))
        }
        ctx.recorders = [self._install_recorder(loader) for loader in ctx.loaders]
        self.saver.attach(ctx.loaders)
        self.workers.attach(ctx.loaders, ctx.recorders, ctx.in_training_fetch)
        for index, loader in enumerate(ctx.loaders):
            if isinstance(loader, DataLoader) and loader.num_workers > 0 and getattr(loader, "in_order", True) is False:
                self._warn_out_of_order(index)
            recorder = ctx.recorders[index]
            if recorder is not None and _workers.persist(recorder, loader):
                recorder.on_outside = lambda index=index: self._warn_training_pass_restarted(index)

    def detach(self) -> None:
        """Give the loaders their own index samplers back.

        Each recorder found in a loader, also after an :meth:`attach` that an exception (a ``KeyboardInterrupt``, a
        signal's) stopped half-way, before it listed its recorders.
        """
        ctx = self.ctx
        self.workers.detach()
        for loader in ctx.loaders:
            for attribute in ("batch_sampler", "sampler"):
                recorder = getattr(loader, attribute, None)
                if isinstance(recorder, _IndexSamplerRecorder):
                    object.__setattr__(loader, attribute, recorder.inner)  # (see _install_recorder)
        ctx.loaders, ctx.recorders = [], []

    def _install_recorder(self, loader: Any) -> _IndexSamplerRecorder | None:
        if S.loader_kind(loader) != S.KIND_MAP:
            return None
        attribute = "batch_sampler" if loader.batch_sampler is not None else "sampler"
        inner = getattr(loader, attribute)
        if isinstance(inner, _IndexSamplerRecorder):
            return inner
        ctx = self.ctx
        rng_objects = _rng.find_rng_objects(_rng_roots(loader, inner))
        recorder = _IndexSamplerRecorder(
            inner,
            rng_objects,
            lambda: ctx.trainer.current_epoch,
            observing=ctx.in_training_fetch,
            drawn=self._pass_drawn,
        )
        # `DataLoader.__setattr__` refuses `sampler` and `batch_sampler` once the loader is initialized, and torch
        # documents no way to replace them: its way is a new DataLoader (Lightning's `_update_dataloader`), which would
        # be another object than the one the CombinedLoader, the fit loop and the user's code hold, and which a user's
        # DataLoader subclass cannot always be rebuilt as. The loader is the one Lightning processed (the recorder goes
        # in before its first iterator), the recorder forwards everything to the original, and `detach` puts the
        # original back at the fit's end.
        object.__setattr__(loader, attribute, recorder)
        return recorder

    def _pass_drawn(self) -> None:
        """A recorded pass yields its first item: its order is drawn, and nothing of it is loaded yet.

        Inside a fetch (a cycling loader starting over, or the epoch's first batch of a sampler that draws at its
        first item), that is where the batch starts: a resumed run replays the pass without drawing, then loads the
        batch again.
        """
        if self.ctx.in_training_fetch():
            self.saver.take_batch_start()

    def _warn_out_of_order(self, index: int) -> None:
        self.ctx.warn(
            f"Train dataloader {index} has `in_order=False`: its workers' batches arrive in the order they finish,"
            " which differs from run to run, so an epoch has no order that a resume could continue. A checkpoint"
            " written in the middle of an epoch resumes by skipping the first batches of the sampler's order, which are"
            " not the batches this run trained on (some samples are trained on twice, others not at all), and the"
            " workers' random states are not those of the batches they produce. Keep `in_order=True` (the default) to"
            " resume exactly."
        )

    def _warn_training_pass_restarted(self, index: int) -> None:
        """A pass of a persistent-workers loader started outside the training loop: it restarts the training's."""
        if _compat.workers_started(self.ctx.loaders[index]):
            self.ctx.warn(
                f"Train dataloader {index} was iterated outside the training loop during fit (a callback's"
                " `iter(trainer.train_dataloader)`, say). With `persistent_workers=True` a DataLoader has one iterator,"
                " so this restarted the pass the training loop is taking: the rest of this epoch trains on a new pass,"
                " as in stock Lightning, and a checkpoint written before the epoch ends cannot be resumed exactly (the"
                " resumed run warns). Iterate a copy of the loader, or one with `persistent_workers=False`."
            )

    def start_epoch(self) -> None:
        """The train iterator is being created: every recorder's next pass is the epoch's first."""
        self.ctx.last_batch = self.ctx.previous_batch = None
        self.resumed_pass.epoch_started()
        self.saver.iterator_started()
        self.workers.epoch_started()
        for recorder in self.ctx.recorders:
            if recorder is not None:
                recorder.start_epoch()

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


def _rng_roots(loader: Any, index_sampler: Any) -> dict[str, Any]:
    """Where a loader's generators are searched from (the names are the first parts of their saved paths)."""
    return {"loader": loader, "index_sampler": index_sampler}
