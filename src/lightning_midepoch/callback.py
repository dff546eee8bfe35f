"""The public entry point: the :class:`MidEpochResume` callback."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import signal
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, get_args

from typing_extensions import override

from lightning_midepoch import _compat, _rng
from lightning_midepoch import _state as S
from lightning_midepoch._batch_check import VerifyBatch
from lightning_midepoch._preemption import SignalDeferral, writes_beside
from lightning_midepoch._saving import Snapshot
from lightning_midepoch._session import _Session
from lightning_midepoch._shared import OnMismatch

if TYPE_CHECKING:
    from lightning.pytorch import Callback as _CallbackBase
    from lightning.pytorch import LightningModule, Trainer


_NAMESPACES = ("lightning.pytorch", "pytorch_lightning")


def _callback_bases() -> tuple[type, ...]:
    """Lightning's ``Callback`` from every namespace the process has imported, so that either ``Trainer`` takes ours.

    Only namespaces already imported count: importing ``pytorch_lightning`` beside ``lightning`` re-points the
    rank-zero logger the two share, which would move a ``lightning`` user's log messages. Where none is imported yet,
    the first one installed is.
    """
    bases = [sys.modules[name].Callback for name in _NAMESPACES if hasattr(sys.modules.get(name), "Callback")]
    if bases:
        return tuple(bases)
    for name in _NAMESPACES:
        if importlib.util.find_spec(name.split(".")[0]) is not None:
            return (importlib.import_module(name).Callback,)
    raise ImportError(  # pragma: no cover - the package requires one of them
        "lightning-midepoch needs `lightning` or `pytorch_lightning`: `pip install lightning`."
    )


def _adopt_imported_namespaces() -> None:
    """Make the callback a ``Callback`` of every namespace imported since this module was."""
    # Why a base is added at run time, to our own class only: the trainer accepts a callback by
    # `isinstance(callback, Callback)` against its own namespace's `Callback`, and `lightning.pytorch.Callback` and
    # `pytorch_lightning.Callback` are two plain classes (metaclass `type`: no `ABC.register`, no `__instancecheck__`
    # to hook). No documented interface makes one object an instance of both but inheriting both; importing the other
    # namespace up front to inherit it at class creation re-points the rank-zero logger the two share (a `lightning`
    # user's messages would move); and a subclass made per instance would be a class pickle cannot find by name (DDP
    # spawn pickles the trainer's callbacks). So the class gains the base of a namespace imported after this module,
    # when a callback is created; the bases' layouts are the same (`object`'s), which is what CPython checks.
    bases = _CallbackBase.__bases__
    missing = tuple(base for base in _callback_bases() if base not in bases)
    if missing:
        _CallbackBase.__bases__ = bases + missing


if not TYPE_CHECKING:
    _CallbackBase = type("_CallbackBase", _callback_bases(), {"__module__": __name__})


class MidEpochResume(_CallbackBase):
    """Resume training exactly from the middle of an epoch.

    Attach it to the ``Trainer`` and resume with ``trainer.fit(..., ckpt_path=...)`` as usual. A checkpoint taken
    after batch ``k`` of an epoch then continues with batch ``k + 1`` of the same order: each map-style train
    dataloader skips the consumed batches at the sampler level (indices only, no data is loaded), the random states
    in effect when the checkpoint was written are restored, and the rest of the run is what it would have been
    without the interruption. Attached to a run that is never interrupted, it changes nothing.

    Args:
        on_mismatch: What to do when the interrupted epoch cannot be continued exactly because the train dataloaders
            differ from the ones the checkpoint was saved with (dataset length, batch size, ``drop_last``, sampler,
            number of dataloaders, world size), or because the checkpoint's MidEpochResume state was damaged after it
            was written. ``"raise"`` (default) stops with a :class:`~lightning_midepoch.MidEpochResumeError` saying
            what differs (or which field is damaged); ``"restart_epoch"`` warns and continues the interrupted epoch
            from a freshly started order, as stock Lightning does (a damaged state is then set aside entirely).
        verify_batch: What to do when the last batch trained before the checkpoint, which a resumed run loads again
            at its start, differs from the batch the checkpoint's run trained on (the checkpoint carries its
            fingerprint where it can be loaded again as it was: see the docs' page "Data pipelines", section "A
            resume that checks itself"). The batch differs when randomness outside the callback's reach shaped it
            (a generator at module level), or the dataset or its transforms changed. ``"warn"`` (default) warns
            before the resumed run trains, naming the batch and the differing parts; ``"raise"`` stops with a
            :class:`~lightning_midepoch.MidEpochResumeError` instead; ``"off"`` saves no fingerprints (and compares
            none).
        checkpoint_signals: Signals whose handlers write checkpoints (``trainer.save_checkpoint``), beside those
            Lightning registers itself (its SLURM auto-requeue handler). While training runs, the handler such a
            signal had when ``fit`` started is called at the next consistent point (the end of the batch or validation
            batch in progress) instead of wherever the signal lands, so that the checkpoint is whole and resumes
            exactly; under DDP every rank calls it at the same point. Handlers of other signals run at once, as usual.

    Example:
        >>> import lightning as L
        >>> trainer = L.Trainer(callbacks=[MidEpochResume()], logger=False, enable_progress_bar=False)
        >>> [type(c).__name__ for c in trainer.callbacks if isinstance(c, MidEpochResume)]
        ['MidEpochResume']

    """

    def __init__(
        self,
        on_mismatch: OnMismatch = "raise",
        verify_batch: VerifyBatch = "warn",
        checkpoint_signals: Iterable[int] = (),
    ) -> None:
        _adopt_imported_namespaces()
        super().__init__()
        if on_mismatch not in get_args(OnMismatch):
            raise ValueError(f"`on_mismatch` must be one of {list(get_args(OnMismatch))}, got {on_mismatch!r}.")
        if verify_batch not in get_args(VerifyBatch):
            raise ValueError(f"`verify_batch` must be one of {list(get_args(VerifyBatch))}, got {verify_batch!r}.")
        self.on_mismatch: OnMismatch = on_mismatch
        self.verify_batch: VerifyBatch = verify_batch
        self.checkpoint_signals: tuple[int, ...] = _signal_numbers(checkpoint_signals)
        self._session: _Session | None = None
        # where the latest fit of this trainer stopped: what a checkpoint written after it records
        self._final: Snapshot | None = None
        # the signals that ask for a checkpoint, served at consistent points (see lightning_midepoch._preemption)
        self._deferral: SignalDeferral | None = None
        self._stepped_aside = False  # the installed Lightning resumes mid-epoch itself (said once)

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if _compat.resumes_mid_epoch_itself(trainer):
            # the installed Lightning carries the change this callback delivers: it records and resumes the train
            # order itself, so the callback steps aside (installing nothing, checking no version) to do nothing twice
            if not self._stepped_aside:
                self._stepped_aside = True
                _compat.info(
                    f"{_compat.namespace(trainer)} {_compat.lightning_version(trainer)} resumes mid-epoch itself:"
                    " MidEpochResume steps aside (it can be removed from the Trainer's callbacks).",
                    trainer,
                )
            self._finish()
            return
        aside = _compat.check_supported(trainer)
        self._finish()  # a fit of this trainer that ended without teardown (an exception) left nothing installed
        if aside:
            # never a fit refused: what the overrides cannot run on is left to Lightning, named
            _compat.warn(
                f"MidEpochResume steps aside for this fit: {aside}. Nothing of it is installed, so a mid-epoch"
                " checkpoint resumes as stock Lightning resumes it (a new pass of the interrupted epoch).",
                trainer,
                set(),
            )
            self._final = None
            return
        self._final = None
        self._session = _Session(trainer, self.on_mismatch, self.verify_batch)
        self._session.install()
        # a partial, not a lambda: whatever pickles or copies the trainer (a loader copied during fit reaches it)
        # reaches the deferral too
        self._deferral = SignalDeferral(functools.partial(self._serving, trainer))
        self._session.defer_signals(self._deferral, self.checkpoint_signals)

    # ------------------------------------------------------------------ pre-emption
    def _serve_signals(self) -> None:
        """A consistent point: serve the checkpointing handlers of the signals received (see SignalDeferral.serve)."""
        if self._deferral is not None and (self._deferral.pending or self._deferral.agreed):
            self._deferral.serve()

    @contextmanager
    def _serving(self, trainer: Trainer, apart: bool) -> Iterator[None]:
        """How a deferred handler runs: its checkpoint is written beside the file.

        ``apart`` (training is over): the checkpoint holds this rank's states only and waits for no DataLoader worker.
        """
        saver = self._session.saver if self._session is not None else None
        if saver is not None:
            saver.apart = apart
        try:
            with writes_beside(trainer.strategy, _compat.torch_checkpoint_io(trainer)):
                yield
        finally:
            if saver is not None:
                saver.apart = False

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._serve_signals()
        session = self._session
        if session is not None:  # (after serving: a checkpoint served here comes before the callbacks after this one)
            session.saver.batch_end_reached()
        if (
            session is not None
            and session.ctx.fetcher is not None
            and _compat.validation_follows(trainer, session.ctx.fetcher)
        ):
            # a checkpoint written inside the validation that follows resumes by running it again: from the states
            # it starts with (before its loader's iterator draws its seed)
            session.saver.before_validation = _rng.capture_global(include_cuda=True)

    @override
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        saver = self._session.saver if self._session is not None else None
        if saver is not None and not trainer.sanity_checking:
            saver.validation_start, saver.before_validation = saver.before_validation, None
        if self._deferral is not None and self._deferral.shared is not None and not trainer.sanity_checking:
            self._deferral.shared.validation_start()  # under DDP: exchange at its batches' ends, where sure

    @override
    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not trainer.sanity_checking:
            if self._deferral is not None and self._deferral.shared is not None:
                self._deferral.shared.validation_batch_end()  # (every rank: what any rank received)
            self._serve_signals()

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._session is not None:
            self._session.saver.validation_start = None
        if self._deferral is not None and self._deferral.shared is not None:
            self._deferral.shared.validation_end()
        if not trainer.sanity_checking:
            if self._session is not None:
                self._session.ctx.validated_since_resume = self._session.ctx.resuming
            self._serve_signals()

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._serve_signals()

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # the last consistent point: what is due is served; from now on every handler runs at once (as stock)
        self._serve_signals()
        if self._deferral is not None:
            self._deferral.finish()

    # ------------------------------------------------------------------ the end of a fit
    @override
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # a checkpoint from the very end of training resumes into no epoch at all: the process still continues
        # from the random states it recorded
        if self._session is not None:
            self._session.restorer.restore_live_state()

    @override
    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # a checkpoint written later in this batch may find its gradients pending (see Saver.backward_done)
        if self._session is not None:
            self._session.saver.backward_done = True

    @override
    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        # Lightning saved the stateful loaders' states as they are now, past the batches a resumed run fetches again
        if self._session is not None and (states := self._session.saver.loader_states()) is not None:
            _compat.replace_loader_states(checkpoint, states)

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        # Lightning runs no teardown hook after an exception: give everything back here (the ranks may not all be
        # here: a signal noted is served as training is over). Lightning's SIGTERM exception after every rank served
        # SIGTERM at one point: every rank is here, and a checkpoint written now (OnExceptionCheckpoint) can hold
        # every rank's states
        together = (
            self._deferral is not None
            and signal.SIGTERM in self._deferral.served_together
            and isinstance(exception, _compat.sigterm_exception(trainer))
        )
        self._finish(ranks_together=together)

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._finish()

    def _finish(self, ranks_together: bool = False) -> None:
        """Keep where the fit stopped, for a checkpoint written after it, and give the trainer its stock loops back."""
        if self._deferral is not None:
            # the signals noted are served now; later ones at once (the signal connector's teardown gives the
            # handlers back)
            self._deferral.finish()
            self._deferral = None
        if self._session is not None:
            self._final = self._session.saver.snapshot(ranks_together)
            self._session.uninstall()
            self._session = None

    @override
    def state_dict(self) -> dict[str, Any]:
        if self._session is not None:
            return self._session.saver.state_dict()
        if self._final is not None:  # written after fit (`trainer.save_checkpoint` once `fit` returned or raised)
            return self._final.state_dict()
        return S.empty_state()  # no fit has run: there is no position to record

    @override
    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        if self._session is None:
            return
        self._session.restorer.load_state_dict(state_dict)


def _signal_numbers(signals: Iterable[int]) -> tuple[int, ...]:
    """``checkpoint_signals`` as numbers, checked: signals of this platform that a handler can catch.

    Example:
        >>> import signal
        >>> _signal_numbers([signal.SIGUSR2, signal.SIGUSR2]) == (signal.SIGUSR2,)
        True

    """
    if isinstance(signals, (int, str)):
        signals = [signals]
    catchable = signal.valid_signals() - {getattr(signal, "SIGKILL", None), getattr(signal, "SIGSTOP", None)}
    numbers: list[int] = []
    for signum in signals:
        if isinstance(signum, bool) or not isinstance(signum, int) or signum not in catchable:
            raise ValueError(
                f"`checkpoint_signals` takes signals a handler can catch on this platform (such as signal.SIGUSR2 or"
                f" signal.SIGRTMIN + 1), got {signum!r}."
            )
        if int(signum) not in numbers:
            numbers.append(int(signum))
    return tuple(numbers)
