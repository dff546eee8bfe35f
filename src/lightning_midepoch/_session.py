"""One trainer's mid-epoch resume machinery, from the callback's ``setup`` to the end of its ``fit``: assembled here.

The session builds the parts, gives each the shared state (:class:`~lightning_midepoch._shared.Shared`) and the
parts it works with, and puts the fit loop's override on its trainer (and only there): the rest of the overrides
follow from it (:mod:`lightning_midepoch._loops`, :mod:`lightning_midepoch._fetchers`). The parts: what checkpoints
save (:class:`~lightning_midepoch._saving.Saver`), what a resume restores
(:class:`~lightning_midepoch._restoring.Restorer`) and where the resumed run continues
(:class:`~lightning_midepoch._planning.ResumePlanner`); the recorders on the train loaders
(:class:`~lightning_midepoch._recording.Recording`); the random states inside DataLoader workers
(:class:`~lightning_midepoch._workers.WorkerStates`), the resumed pass of loaders that keep their own position
(:class:`~lightning_midepoch._passes.ResumedPass`) and the batch check
(:class:`~lightning_midepoch._batch_check.BatchCheck`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_midepoch import _compat, _workers
from lightning_midepoch import _state as S
from lightning_midepoch._batch_check import BatchCheck, VerifyBatch, outcomes_of_ranks
from lightning_midepoch._loops import LoopParts, _ResumableFitLoop
from lightning_midepoch._mixin import mix_in
from lightning_midepoch._passes import ResumedPass
from lightning_midepoch._planning import ResumePlanner
from lightning_midepoch._preemption import SignalDeferral, _DeferringSignalConnector
from lightning_midepoch._recording import Recording
from lightning_midepoch._restoring import Restorer
from lightning_midepoch._saving import Saver
from lightning_midepoch._shared import OnMismatch, Shared

if TYPE_CHECKING:
    from lightning.pytorch import Trainer


class _Session:
    """The parts of mid-epoch resume for one trainer during one ``fit``, assembled."""

    def __init__(self, trainer: Trainer, on_mismatch: OnMismatch, verify_batch: VerifyBatch = "warn") -> None:
        self.ctx = ctx = Shared(trainer, on_mismatch, verify_batch)
        workers = _workers.WorkerStates()  # the random states inside the train loaders' worker processes
        batch_check = BatchCheck(verify_batch, self._report_batch, self._agree)
        resumed_pass = ResumedPass(ctx)  # loaders that keep a position for one pass, or start lazily
        self.saver = saver = Saver(ctx, workers)  # what checkpoints save
        self.restorer = restorer = Restorer(ctx, saver)  # what a resume restores
        planner = ResumePlanner(ctx, restorer, saver, workers, resumed_pass, batch_check)  # where the run continues
        self.recording = Recording(ctx, saver, workers, resumed_pass, batch_check)  # the train loaders' recorders
        self._loop_parts = LoopParts(ctx, self.recording, saver, restorer, planner)

    def install(self) -> None:
        """Put the fit loop's override on this trainer's fit loop (the epoch loop's waits for a restore)."""
        fit_loop = self.ctx.trainer.fit_loop
        self.ctx.mix(fit_loop, _ResumableFitLoop, self._loop_parts)
        if fit_loop._data_fetcher is not None:
            # the train data was set up before this setup (a datamodule's setup, or a callback's listed before this
            # one, read `trainer.estimated_stepping_batches`): the fit loop's override adopts that fetcher
            fit_loop._data_fetcher = fit_loop._data_fetcher
            if fit_loop._combined_loader is not None:
                fit_loop._data_fetcher.setup(fit_loop._combined_loader)

    def defer_signals(self, deferral: SignalDeferral, declared: tuple[int, ...]) -> None:
        """Put the override on this trainer's signal connector: ``deferral`` holds its handlers that checkpoint.

        And those of the ``declared`` signals, in ``fit``. The connector's own teardown, after the session's, takes
        the override off (signals keep being served until Lightning gives the process its handlers back).
        """
        connector = _compat.signal_connector(self.ctx.trainer)
        if not isinstance(connector, _DeferringSignalConnector):
            mix_in(connector, _DeferringSignalConnector)
        vars(connector)["_midepoch_deferral"] = deferral
        vars(connector)["_midepoch_declared"] = declared

    def uninstall(self) -> None:
        """Give the trainer its stock loops and the loaders their own index samplers back."""
        self.ctx.last_batch = self.ctx.previous_batch = None
        self.recording.detach()
        self.ctx.unmix_all()

    # ------------------------------------------------------------------ the batch check
    def _report_batch(self, message: str, fail: bool) -> None:
        if fail:
            raise S.MidEpochResumeError(
                f'{message} (This is an error because of MidEpochResume(verify_batch="raise"); "warn" continues.)'
            )
        self.ctx.warn(message)

    def _agree(self, differs: bool) -> list[bool]:
        """Every rank's outcome of the batch check (one collective, at the resumed epoch's start: all reach it)."""
        trainer = self.ctx.trainer
        return outcomes_of_ranks(differs, trainer.global_rank, trainer.world_size, trainer.strategy)
