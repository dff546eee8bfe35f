"""What the parts of one trainer's session share: the trainer, its train loaders, the flags, and how to warn.

A leaf of the session's parts: it imports none of them. Each part (:mod:`~lightning_midepoch._saving`,
:mod:`~lightning_midepoch._restoring`, :mod:`~lightning_midepoch._planning`, :mod:`~lightning_midepoch._passes`,
:mod:`~lightning_midepoch._recording`, the loop and fetcher overrides) is given this state and, in its constructor,
the other parts it works with; :mod:`~lightning_midepoch._session` assembles them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from lightning_midepoch import _compat
from lightning_midepoch._mixin import mix_in, unmix

if TYPE_CHECKING:
    from lightning.pytorch import Trainer
    from lightning.pytorch.loops.fetchers import _DataFetcher
    from lightning.pytorch.utilities.combined_loader import CombinedLoader

    from lightning_midepoch._batch_check import VerifyBatch
    from lightning_midepoch._order import _IndexSamplerRecorder

OnMismatch = Literal["raise", "restart_epoch"]


class Shared:
    """The state of mid-epoch resume for one trainer during one ``fit`` that more than one part reads or sets."""

    def __init__(self, trainer: Trainer, on_mismatch: OnMismatch, verify_batch: VerifyBatch = "warn") -> None:
        self.trainer = trainer
        self.on_mismatch = on_mismatch
        self.verify_batch = verify_batch
        self.warned: set[str] = set()  # the messages said (each once)
        # the train loaders, flattened from the train CombinedLoader, and the recorder on each map-style one's sampler
        self.loaders: list[Any] = []
        self.recorders: list[_IndexSamplerRecorder | None] = []
        self.combined_loader: CombinedLoader | None = None
        self.fetcher: _DataFetcher | None = None
        self.out_of_reach: dict[int, list[str]] = {}  # per loader: where the search for its generators stopped
        # flags shared with the loop and fetcher overrides
        self.hold_next_iter = False
        self.iterator_held = False
        self.iterator_started = False  # the resumed epoch's iterator was just started: the next iter() keeps it
        self.finish_interrupted_batch = False
        self.starting_iterator = False  # the training loop is creating its train iterator (see in_training_fetch)
        self.fetching = False  # the training loop is fetching a batch from its train iterator (likewise)
        self.elastic: dict[str, Any] | None = None  # the epoch being finished on another world size
        self.resuming = False  # this fit resumes from a checkpoint (the loops were restored before it trained)
        self.validated_since_resume = False  # a validation ran in this fit after the restore (see _loops)
        self.trained = False  # the fit loop has set up its data: restores from now on are a tuner's, not a resume
        # the latest two batches fetched from the train loaders in this epoch (the batch check's; see _fetchers)
        self.last_batch: Any = None
        self.previous_batch: Any = None
        self._originals: list[tuple[object, type]] = []  # the objects given an override, and their own classes

    def warn(self, message: str) -> None:
        """Warn once per message (rank zero, through Lightning's channel)."""
        _compat.warn(message, self.trainer, self.warned)

    def in_training_fetch(self) -> bool:
        """Whether the training loop is creating or advancing its train iterator (asked where a loader starts a pass).

        Only those passes are the epoch's order; a loader iterated anywhere else (a user's callback, say) is not
        recorded.
        """
        return self.starting_iterator or self.fetching

    def mix(self, obj: object, mixin: type, part: object) -> None:
        """Put ``mixin`` on ``obj`` (once), giving it ``part`` as ``_midepoch``; :meth:`unmix_all` takes it off."""
        if not isinstance(obj, mixin):
            self.installed(obj, mix_in(obj, mixin))
            vars(obj)["_midepoch"] = part

    def installed(self, obj: object, original: type) -> None:
        """``obj`` was given an override in front of its class ``original``: taken off by :meth:`unmix_all`."""
        self._originals.append((obj, original))

    def unmix_all(self) -> None:
        """Give every object given an override its own class back (the latest first)."""
        for obj, original in reversed(self._originals):
            unmix(obj, original)
        self._originals.clear()
