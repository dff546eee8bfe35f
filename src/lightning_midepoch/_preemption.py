"""Pre-emption: a signal that asks for a checkpoint is served at the next consistent point of the fit.

Python runs a signal handler in the main thread between any two bytecodes: inside ``optimizer.step()``, inside the
fetch of the next batch, inside a collective. A handler that writes a checkpoint there (Lightning's SLURM
auto-requeue handler does, and so do the handlers users write for Kubernetes' ``preStop`` hooks and spot-instance
notices) can write a torn state, and under DDP ranks that enter the save at different points wait for each other
forever. :class:`SignalDeferral` takes the place of the handlers of the signals that ask for a checkpoint: it only
notes the signal, and the callback serves it (calls the handler that was there) at the next consistent point: the
end of a training batch, of a validation run, of an epoch, or of training (a signal received after that is dropped:
the job has finished its training). It takes their
place right after Lightning registers its own (:class:`_DeferringSignalConnector`), and gives them back before
Lightning restores the process's. Under DDP every rank serves the same signals at the same point: the ranks compare
notes at an agreed consistent point about once a second (:class:`Agreement`).

While a handler is served, temporary files are made beside the checkpoints (:func:`temporary_files_in`): fsspec,
which Lightning writes checkpoints through, writes a temporary file and moves it into place; that move is a rename
(atomic) only when both lie on one filesystem, and otherwise a copy that a kill can cut short.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from lightning_midepoch._mixin import stock_reduce

log = logging.getLogger(__name__)

#: The signals whose handlers are deferred (where the process has one): the one SLURM sends before a time limit
#: (``--signal=USR1@90``) and that Lightning's auto-requeue listens to, the other user signal (a common
#: ``requeue_signal``), and SIGTERM (pre-emption, Kubernetes, spot instances). SIGINT is left alone (Ctrl-C).
CANDIDATE_SIGNALS: tuple[str, ...] = ("SIGUSR1", "SIGUSR2", "SIGTERM")

Handler = Callable[[int, Any], Any]


def candidate_signals(extra: int | None = None) -> tuple[int, ...]:
    """The numbers of :data:`CANDIDATE_SIGNALS` this platform has, plus ``extra`` (a SLURM ``requeue_signal``).

    The same on every rank of a job (the agreement between ranks relies on it).

    Example:
        >>> import signal
        >>> candidate_signals(signal.SIGHUP) == (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGHUP)
        True

    """
    numbers = [int(getattr(signal, name)) for name in CANDIDATE_SIGNALS if hasattr(signal, name)]
    if extra is not None and int(extra) not in numbers:
        numbers.append(int(extra))
    return tuple(numbers)


def _defers(handler: object) -> bool:
    """A handler written in Python (not the default action, not ignored, not Python's Ctrl-C handler)."""
    return callable(handler) and handler is not signal.default_int_handler


class SignalDeferral:
    """Notes the signals that ask for a checkpoint and serves them, later, at a consistent point.

    Example:
        >>> import signal
        >>> served = []
        >>> previous = signal.signal(signal.SIGUSR2, lambda signum, frame: served.append(signum))
        >>> deferral = SignalDeferral((signal.SIGUSR2,))
        >>> deferral.install()
        >>> signal.raise_signal(signal.SIGUSR2)
        >>> served, [signum.name for signum in deferral.pending]
        ([], ['SIGUSR2'])
        >>> deferral.serve()
        True
        >>> [signal.Signals(signum).name for signum in served]
        ['SIGUSR2']
        >>> deferral.uninstall()
        >>> _ = signal.signal(signal.SIGUSR2, previous)

    """

    def __init__(self, signals: tuple[int, ...]) -> None:
        self.signals = signals
        self.handlers: dict[int, Handler] = {}  # the handlers deferred, by signal
        self.pending: list[signal.Signals] = []  # received and not served yet, in order of arrival
        self.held: list[int] = []  # agreed on and held back at the last point: served at the next
        self.serving: int | None = None  # the signal whose handler runs now
        self.received = 0  # every delivery noted (a repeat while its own handler runs included)
        self.served_together: set[int] = set()  # served at a point every rank agreed on

    @property
    def installed(self) -> bool:
        return bool(self.handlers)

    def install(self) -> None:
        """Take the place of the current handler of each signal that has one (in the main thread only)."""
        if self.handlers or threading.current_thread() is not threading.main_thread():
            return
        for signum in self.signals:
            handler = signal.getsignal(signum)
            if _defers(handler):
                self.handlers[signum] = handler  # type: ignore[assignment]
                signal.signal(signum, self._note)

    def uninstall(self) -> None:
        """Give each signal its handler back (where nobody replaced ours since); what is pending is dropped."""
        for signum, handler in self.handlers.items():
            if signal.getsignal(signum) == self._note:
                signal.signal(signum, handler)
        if self.pending or self.held:
            log.info(f"lightning-midepoch: signals received as the fit ended, not served: {self.pending + self.held}")
        self.handlers, self.pending, self.held = {}, [], []

    def _note(self, signum: int, frame: Any) -> None:
        # the whole handler: a signal can land anywhere, so nothing here may touch the training's state
        self.received += 1
        # a repeat asks for what is already under way
        if signum != self.serving and signum not in self.pending and signum not in self.held:
            self.pending.append(signal.Signals(signum))

    def serve(
        self,
        agree: Callable[[list[int]], list[int]] | None = None,
        directory: str | None = None,
        hold: Callable[[], Collection[int]] = tuple,
    ) -> bool:
        """Call the deferred handlers of the signals received: now is a consistent point. Whether any ran.

        ``agree`` turns this rank's pending signals into those of every rank (the same list on each), so that every
        rank runs the same handlers here; ``directory`` is where the handlers' checkpoints are written. ``hold()``
        names signals that must wait for the next point (asked only when something is to be served); those wait on
        every rank alike, with no further agreement.
        """
        pending = [int(signum) for signum in self.pending]
        if agree is not None:
            pending = agree(pending)
        pending = self.held + [signum for signum in pending if signum not in self.held]
        if not pending:
            return False
        waiting = set(hold())
        self.held = [signum for signum in pending if signum in waiting]
        self.pending = [signum for signum in self.pending if signum not in pending]
        served = False
        with temporary_files_in(directory):
            for signum in pending:
                handler = self.handlers.get(signum)
                if signum in waiting or handler is None:
                    continue
                self.serving, served = signum, True
                if agree is not None:
                    self.served_together.add(signum)
                try:
                    handler(signum, None)
                finally:
                    self.serving = None
        return served


#: Under DDP, about how many seconds of training pass between two comparisons of the ranks' signals
AGREEMENT_PERIOD_S = 1.0


class Agreement:
    """Under DDP: the signals every rank serves at a consistent point, the same on each rank.

    The ranks compare what they received (one ``all_reduce`` of a few integers) at every ``interval``-th consistent
    point only, an interval they agree on as they compare: about :data:`AGREEMENT_PERIOD_S` seconds of training, at
    least one point. Every rank reaches the same points in the same order, so all count alike and none waits for
    a comparison another does not make; a signal waits at most about that long (or one step, if longer) for its
    point. Elsewhere the call costs a countdown.
    """

    def __init__(self, signals: tuple[int, ...], device: torch.device, period: float | None = None) -> None:
        self.signals, self.device = signals, device
        self.period = AGREEMENT_PERIOD_S if period is None else period
        self.interval = self.countdown = 1  # the first point compares (and sizes the interval)
        self.since = time.monotonic()
        self.comparisons = 0

    def compare_next(self) -> None:
        """Make the next point a comparison (every rank calls this at the same point): the last one of training."""
        self.countdown = 1

    def __call__(self, pending: list[int]) -> list[int]:
        self.countdown -= 1
        if self.countdown > 0:
            return []
        per_point = (time.monotonic() - self.since) / self.interval
        # (the first comparison has measured nothing yet: the next point compares again)
        proposal = max(1, int(self.period / per_point)) if self.comparisons and per_point > 0 else 1
        # a flag per signal, and the interval proposed, negated: MAX gives any rank's signals and the shortest interval
        notes = [int(signum in pending) for signum in self.signals] + [-proposal]
        agreed = torch.tensor(notes, dtype=torch.int64, device=self.device)
        torch.distributed.all_reduce(agreed, op=torch.distributed.ReduceOp.MAX)
        *flags, interval = agreed.tolist()
        self.interval = self.countdown = -interval
        self.since = time.monotonic()
        self.comparisons += 1
        return [signum for signum, flag in zip(self.signals, flags, strict=True) if flag]


class _DeferringSignalConnector:
    """The override on one trainer's signal connector: the deferral takes the place of the handlers it registers.

    Lightning registers its handlers (SLURM's auto-requeue, its SIGTERM notifier, composed with any the process had)
    as ``fit`` starts; from that moment to its teardown, each is served at consistent points instead.
    """

    __reduce_ex__ = stock_reduce
    _midepoch_deferral: SignalDeferral

    def register_signal_handlers(self) -> None:
        super().register_signal_handlers()  # type: ignore[misc]
        self._midepoch_deferral.install()

    def teardown(self) -> None:
        # training is over (its last point served what came before): a signal received since is dropped, as the job
        # has finished its training (a checkpoint written now, after Lightning tore the loops down, would wait for
        # the reports of DataLoader workers that are gone)
        self._midepoch_deferral.uninstall()
        super().teardown()  # type: ignore[misc]


@contextmanager
def temporary_files_in(directory: str | None) -> Iterator[None]:
    """Make ``tempfile``'s temporary files in ``directory`` (a local folder) while the block runs.

    fsspec writes a checkpoint to a temporary file and moves it into place: with the two in one folder, the move is a
    rename, and a process killed while writing leaves the previous checkpoint as the newest whole file.

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> with temporary_files_in(folder):
        ...     tempfile.gettempdir() == folder
        True
        >>> tempfile.gettempdir() == folder
        False

    """
    if directory is None or not os.path.isdir(directory):
        yield
        return
    previous = tempfile.tempdir
    tempfile.tempdir = directory
    try:
        yield
    finally:
        tempfile.tempdir = previous
