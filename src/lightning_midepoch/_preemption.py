"""Pre-emption: a signal handler that writes a checkpoint runs at the next consistent point of the fit.

Python runs a signal handler in the main thread between any two bytecodes: inside ``optimizer.step()``, inside the
fetch of the next batch, inside a collective. A handler that writes a checkpoint there (Lightning's SLURM
auto-requeue handler does, and so do the handlers users write for Kubernetes' ``preStop`` hooks and spot-instance
notices) can write a torn state, and under DDP ranks that enter the save at different points wait for each other
forever. :class:`SignalDeferral` takes the place of the handlers that checkpoint (and only of those: a stack dump
or a profiler toggle runs at once, with its frame): it notes the signal, and the callback serves it (calls the
handler with the frame the signal arrived in) at the next consistent point: the end of a training batch, of a
validation batch, of an epoch, or of training. Once training is over, every handler runs at once, as in stock
Lightning, and a signal noted but not served yet is served then.

Which handlers checkpoint (:func:`checkpointing_handler`): Lightning's SLURM auto-requeue handler; under DDP also
Lightning's SIGTERM notifier, which runs a collective (a broadcast); and every handler of a signal the user names in
``MidEpochResume(checkpoint_signals=...)``.

Under DDP every rank serves the same signals at the same point without a collective of its own: Lightning already
exchanges rank 0's SIGTERM flag at the start of every training batch (``_broadcast_sigterm_tensor``, Lightning 2.5.2
and later), and :class:`SharedSignalCheck` stands in for that exchange on this trainer, with every rank's signals in
the same message. The ranks then serve what they agreed on at the end of that batch, every rank alike; a rank that
had not received a signal yet absorbs its own delivery of it when it comes (one delivery per rank, one service).

A served handler writes its checkpoint's temporary file beside the checkpoint (:func:`writes_beside`): Lightning
writes through fsspec, which makes its temporary file in the system's temporary folder and moves it into place, a
copy that a kill can cut short when the two lie on different filesystems.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import signal
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

import torch

from lightning_midepoch import _compat
from lightning_midepoch._mixin import stock_reduce, unmix

if TYPE_CHECKING:
    from lightning.pytorch import Trainer

log = logging.getLogger(__name__)

Handler = Callable[[int, Any], Any]
#: How a handler is served: the context it runs in (given whether the ranks may not all be at this point)
Serving = Callable[[bool], AbstractContextManager[Any]]


def signal_name(signum: int) -> str:
    """A signal's name, also for a real-time signal (which :class:`signal.Signals` does not name).

    Example:
        >>> import signal
        >>> signal_name(signal.SIGUSR1), signal_name(signal.SIGRTMIN + 2)
        ('SIGUSR1', 'SIGRTMIN+2')

    """
    try:
        return signal.Signals(signum).name
    except ValueError:
        if hasattr(signal, "SIGRTMIN") and signal.SIGRTMIN <= signum <= signal.SIGRTMAX:
            return f"SIGRTMIN+{signum - signal.SIGRTMIN}"
        return str(signum)


def candidate_signals(requeue: int | None, declared: Iterable[int] = ()) -> tuple[int, ...]:
    """The signals whose handlers may checkpoint: SIGTERM, SLURM's ``requeue_signal`` and the user's declared ones.

    Example:
        >>> import signal
        >>> candidate_signals(signal.SIGUSR1, [signal.SIGHUP]) == (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)
        True

    """
    numbers: list[int] = [int(signal.SIGTERM)] if hasattr(signal, "SIGTERM") else []
    for signum in (requeue, *declared):
        if signum is not None and int(signum) not in numbers:
            numbers.append(int(signum))
    return tuple(numbers)


def checkpointing_handler(handler: object, connector: object, *, declared: bool, ranks_exchange: bool) -> bool:
    """Whether ``handler`` (a signal's handler, as Lightning registered it) writes checkpoints or runs collectives.

    Lightning composes the handlers of one signal into one (:func:`~lightning_midepoch._compat.composed_handlers`):
    its SLURM auto-requeue handler saves a checkpoint; its SIGTERM notifier broadcasts under DDP
    (``ranks_exchange``), which every rank must do at the same point. A declared signal's handler counts whatever it
    is. The default action, ignoring and Python's Ctrl-C handler are never deferred.
    """
    if not callable(handler) or handler is signal.default_int_handler:
        return False
    if declared:
        return True
    parts = _compat.composed_handlers(handler, connector)
    known = _compat.lightning_signal_handlers(connector)
    return any(part == known["requeue"] or (ranks_exchange and part == known["sigterm"]) for part in parts)


def _no_context(apart: bool) -> AbstractContextManager[Any]:
    """How a handler runs where nothing is asked of it: as it is (a function, not a lambda: it pickles)."""
    return contextlib.nullcontext()


class SignalDeferral:
    """Holds the handlers that checkpoint, serves them at consistent points, and at once when training is over.

    Example:
        >>> import signal
        >>> served = []
        >>> previous = signal.signal(signal.SIGUSR2, lambda signum, frame: served.append(signum))
        >>> deferral = SignalDeferral()
        >>> deferral.install({signal.SIGUSR2: signal.getsignal(signal.SIGUSR2)})
        >>> signal.raise_signal(signal.SIGUSR2)
        >>> served, deferral.pending_signals()
        ([], [<Signals.SIGUSR2: 12>])
        >>> deferral.serve()
        True
        >>> served == [signal.SIGUSR2]
        True
        >>> deferral.finish()
        >>> signal.raise_signal(signal.SIGUSR2)  # training is over: at once
        >>> len(served)
        2
        >>> deferral.uninstall()
        >>> _ = signal.signal(signal.SIGUSR2, previous)

    """

    def __init__(self, serving: Serving | None = None) -> None:
        self.serving_context: Serving = serving if serving is not None else _no_context
        self.handlers: dict[int, Handler] = {}  # the handlers deferred, by signal
        self.pending: list[tuple[int, FrameType | None]] = []  # received, not served yet: the signal and its frame
        self.exchanging = False  # under DDP, every rank serves what the ranks agreed on (SharedSignalCheck)
        self.agreed: list[int] = []  # what every rank agreed on at the latest exchange: served at the next point
        self.owed: Counter[int] = Counter()  # served as agreed before this rank's own delivery came: absorbed then
        self.served_together: set[int] = set()  # served at a point every rank agreed on
        self.shared: SharedSignalCheck | None = None  # under DDP: the ranks' exchange
        self.serving: int | None = None  # the signal whose handler runs now
        self.live = False  # training runs: handlers wait for a consistent point

    @property
    def signals(self) -> tuple[int, ...]:
        return tuple(self.handlers)

    def pending_signals(self) -> list[signal.Signals | int]:
        """The signals received and not served yet, by name where Python names them."""
        return [_named(signum) for signum, _ in self.pending]

    def install(self, handlers: dict[int, Handler]) -> None:
        """Take the place of ``handlers`` (each signal's current handler, which checkpoints), in the main thread."""
        if self.handlers or threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in handlers.items():
            self.handlers[signum] = handler
            signal.signal(signum, self._note)
        self.live = True

    def uninstall(self) -> None:
        """Serve what is noted (at once), then give each signal its handler back (where nobody replaced ours)."""
        self.finish()
        for signum, handler in self.handlers.items():
            if signal.getsignal(signum) == self._note:
                signal.signal(signum, handler)
        self.handlers = {}

    def _note(self, signum: int, frame: FrameType | None) -> None:
        # the whole handler: a signal can land anywhere, so while training runs nothing here touches its state
        if self.owed[signum]:  # this rank's own delivery of a signal every rank served already
            self.owed[signum] -= 1
            return
        if not self.live:
            self._call(signum, frame, apart=True)
            return
        # a repeat asks for what is already under way
        if signum != self.serving and all(signum != noted for noted, _ in self.pending):
            self.pending.append((signum, frame))

    def agree(self, flags: list[int]) -> None:
        """The ranks' exchange: ``flags`` says, per signal of :attr:`signals`, whether any rank received it.

        Each is served at this rank's next consistent point, as on every rank; one this rank has not received yet is
        owed: its own delivery, when it comes, asks for nothing more.
        """
        for signum, flag in zip(self.signals, flags, strict=True):
            if not flag or signum in self.agreed:
                continue
            self.agreed.append(signum)
            noted = [entry for entry in self.pending if entry[0] == signum]
            if noted:
                self.pending.remove(noted[0])
            else:
                self.owed[signum] += 1

    def flags(self) -> list[int]:
        """Per signal of :attr:`signals`: whether this rank received it and waits for the ranks to agree."""
        noted = {signum for signum, _ in self.pending}
        return [int(signum in noted) for signum in self.signals]

    def serve(self) -> bool:
        """Now is a consistent point: call the handlers of the signals received (agreed on, under DDP); any ran."""
        if self.exchanging:
            due: list[tuple[int, FrameType | None]] = [(signum, None) for signum in self.agreed]
            self.agreed = []
            self.served_together.update(signum for signum, _ in due)
        else:
            due, self.pending = self.pending, []
        for signum, frame in due:
            self._call(signum, frame, apart=False)
        return bool(due)

    def finish(self) -> None:
        """Training is over: what is agreed or noted is served now, and every later delivery at once."""
        if not self.live:
            return
        self.live = False
        due = [(signum, None) for signum in self.agreed] + self.pending
        self.agreed, self.pending = [], []
        for signum, frame in due:
            # (what every rank agreed on was agreed on every rank: each serves it as it finishes)
            self._call(signum, frame, apart=True)

    def _call(self, signum: int, frame: FrameType | None, apart: bool) -> None:
        handler = self.handlers.get(signum)
        if handler is None:  # pragma: no cover - only deferred signals are noted
            return
        self.serving = signum
        try:
            with self.serving_context(apart):
                handler(signum, frame)
        finally:
            self.serving = None


def _named(signum: int) -> signal.Signals | int:
    try:
        return signal.Signals(signum)
    except ValueError:
        return signum


class SharedSignalCheck:
    """Under DDP: stands in for Lightning's exchange of rank 0's SIGTERM flag at the start of each training batch.

    The same collective at the same moment (every rank makes it there), carrying more: the SIGTERM flag, each rank's
    number of validation batches (:func:`validation_batches`), and per deferred signal whether any rank received it
    (an ``all_reduce`` with ``MAX``, where Lightning broadcasts from rank 0; with the notifier deferred, every rank's
    flag is the same). What follows is Lightning's: a failed exchange asks for nothing, a SIGTERM raises Lightning's
    ``SIGTERMException`` on every rank after a barrier.

    Where every rank has the same number of validation batches, known before the validation starts, every rank
    reaches the end of each of them: the validation that follows exchanges the signals' flags there too
    (:meth:`validation_batch_end`), so that a signal landing in it is served within one validation batch.
    """

    def __init__(self, trainer: Trainer, deferral: SignalDeferral) -> None:
        self.trainer, self.deferral = trainer, deferral
        self.agreed_validation = False  # every rank has the same number of validation batches (latest exchange)
        self.in_validation = False  # the validation under way exchanges at its batches' ends
        self.exchanged: torch.Tensor | None = None  # the last exchange's tensor (see _exchange)

    def __call__(self) -> None:
        trainer = self.trainer
        batches = validation_batches(trainer)
        notes = [int(bool(trainer.received_sigterm)), batches, -batches, *self.deferral.flags()]
        agreed = self._exchange(notes)
        if agreed is None:  # as Lightning's exchange: a rank that cannot exchange goes on
            agreed = [0, -1, 1] + [0] * (len(notes) - 3)
        # (the largest count is the smallest one, and not "unknown"): every rank's is the same
        self.agreed_validation = agreed[1] > 0 and agreed[1] == -agreed[2]
        self.deferral.agree(agreed[3:])
        if agreed[0]:
            with contextlib.suppress(Exception):
                torch.distributed.barrier()  # (as Lightning: every rank leaves together)
            raise _compat.sigterm_exception(trainer)()

    def validation_start(self) -> None:
        """A validation of the fit starts (after the training batch whose exchange agreed on its length)."""
        self.in_validation, self.agreed_validation = self.agreed_validation, False

    def validation_batch_end(self) -> None:
        """The end of a validation batch, reached by every rank where they agreed on the validation's length."""
        if not self.in_validation:
            return
        agreed = self._exchange(self.deferral.flags())
        if agreed is None:  # a rank is gone: exchange nothing more in this validation
            self.in_validation = False
            return
        self.deferral.agree(agreed)

    def validation_end(self) -> None:
        self.in_validation = False

    def _exchange(self, notes: list[int]) -> list[int] | None:
        try:
            exchanged = torch.tensor(notes, dtype=torch.int64, device=self.trainer.strategy.root_device)
            # kept until the next exchange: gloo's worker thread lets go of the collective's tensors after the call
            # returns, and freeing a tensor there takes the GIL; at the interpreter's exit that aborts the process
            # ("terminate called without an active exception", pytorch/pytorch#190489), and the exchange can be the
            # job's last collective (Lightning's own, which this one stands in for, drops its tensor)
            self.exchanged = exchanged
            torch.distributed.all_reduce(exchanged, op=torch.distributed.ReduceOp.MAX)
            return [int(flag) for flag in exchanged.tolist()]
        except Exception:
            return None


def validation_batches(trainer: Trainer) -> int:
    """The number of this rank's batches in the fit's next validation: else -1 (unknown now).

    Known: the validation dataloaders are set up (by the sanity check or an earlier validation) and not reloaded
    (``reload_dataloaders_every_n_epochs``), each of finite length over a map-style dataset (its sampler's length is
    the number of batches it yields), and ``validation_step`` takes batches, not the ``dataloader_iter``.

    Example:
        >>> import lightning as L
        >>> validation_batches(L.Trainer(logger=False, enable_progress_bar=False))  # nothing set up yet
        -1

    """
    counts = trainer.num_val_batches
    reloads: Any = getattr(trainer, "reload_dataloaders_every_n_epochs", None)  # (set by Lightning's data connector)
    if not counts or reloads or any(count == float("inf") for count in counts):
        return -1
    loaders = trainer.val_dataloaders
    loaders = list(loaders.values()) if isinstance(loaders, dict) else loaders
    for loader in loaders if isinstance(loaders, (list, tuple)) else [loaders]:
        if isinstance(getattr(loader, "dataset", None), torch.utils.data.IterableDataset):
            return -1
    module = trainer.lightning_module
    step = getattr(module, "validation_step", None) if module is not None else None
    with contextlib.suppress(TypeError, ValueError):
        if step is not None and "dataloader_iter" in inspect.signature(step).parameters:
            return -1
    return int(sum(counts))


@contextmanager
def _held(signums: Iterable[int]) -> Iterator[None]:
    """Block ``signums`` in the main thread meanwhile (where the platform can).

    One sent meanwhile is delivered once, when they are unblocked, to the handler installed by then. Lightning
    registers its handlers and the deferral takes the place of those that checkpoint a moment later: a signal between
    the two would run Lightning's handler at once, a checkpoint before the fit's first batch that no resume continues
    exactly (``make chaos``). A signal sent to the process goes to another thread that does not block it, if there is
    one (CPython then runs the handler of the moment in the main thread).
    """
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, set(signums))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class _DeferringSignalConnector:
    """The override on one trainer's signal connector: the deferral takes the place of the handlers that checkpoint.

    Lightning registers its handlers (SLURM's auto-requeue, its SIGTERM notifier, composed with any the process had)
    as ``fit`` starts; from that moment, those that checkpoint are served at consistent points until training ends.
    """

    __reduce_ex__ = stock_reduce
    _midepoch_deferral: SignalDeferral
    _midepoch_declared: tuple[int, ...]

    def register_signal_handlers(self) -> None:
        deferral = self._midepoch_deferral
        trainer = _compat.connector_trainer(self)
        environment = _compat.cluster_environment(trainer)
        requeue = getattr(environment, "requeue_signal", None) if getattr(environment, "auto_requeue", False) else None
        candidates = candidate_signals(requeue, self._midepoch_declared)
        with _held(candidates):  # (one that arrives meanwhile finds the deferral, not Lightning's handler)
            super().register_signal_handlers()  # type: ignore[misc]
            exchanging = (
                trainer.world_size > 1
                and torch.distributed.is_available()
                and torch.distributed.is_initialized()
                and _compat.has_sigterm_exchange(trainer)
            )
            handlers = {}
            for signum in candidates:
                handler = signal.getsignal(signum)
                declared = signum in self._midepoch_declared
                if checkpointing_handler(handler, self, declared=declared, ranks_exchange=exchanging):
                    handlers[signum] = handler
            deferral.install(handlers)  # type: ignore[arg-type]
            if deferral.handlers and exchanging:
                deferral.exchanging = True
                deferral.shared = SharedSignalCheck(trainer, deferral)
                _compat.replace_sigterm_exchange(trainer, deferral.shared)

    def teardown(self) -> None:
        # (Lightning gives the process its own handlers back: every signal noted was served by then)
        self._midepoch_deferral.uninstall()
        _compat.restore_sigterm_exchange(_compat.connector_trainer(self))
        super().teardown()  # type: ignore[misc]
        unmix(self, type(self)._midepoch_stock)  # type: ignore[attr-defined]


class _WriteBeside:
    """Lightning's ``TorchCheckpointIO``, writing each local checkpoint to a temporary file beside it first.

    The same bytes (``torch.save`` of the same dictionary); the move into place is a rename on one filesystem, so a
    process killed while writing leaves the previous file as it was. Remote paths and everything else go to the
    plugin it stands in for.
    """

    def __init__(self, io: Any) -> None:
        self.io = io

    def __getattr__(self, name: str) -> Any:
        return getattr(self.io, name)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        target = os.fspath(path)
        if storage_options is not None or "://" in target:
            self.io.save_checkpoint(checkpoint, path, storage_options=storage_options)
            return
        folder = os.path.dirname(os.path.abspath(target))
        os.makedirs(folder, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(target)}.", suffix=".tmp")
        try:
            with os.fdopen(descriptor, "wb") as file:
                torch.save(checkpoint, file)
            os.replace(temporary, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(temporary)
            raise


@contextmanager
def writes_beside(strategy: Any, torch_io: type) -> Iterator[None]:
    """While the block runs, ``strategy`` writes local checkpoints through :class:`_WriteBeside`.

    Only where its plugin is Lightning's own ``torch_io`` (``TorchCheckpointIO``): a user's plugin (asynchronous, to
    object storage) writes as it does.
    """
    io = strategy.checkpoint_io
    if type(io) is not torch_io:
        yield
        return
    strategy.checkpoint_io = _WriteBeside(io)
    try:
        yield
    finally:
        strategy.checkpoint_io = io
