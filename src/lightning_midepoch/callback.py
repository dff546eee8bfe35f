"""The public entry point: the :class:`MidEpochResume` callback."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, get_args

from typing_extensions import override

from lightning_midepoch import _compat
from lightning_midepoch import _state as S
from lightning_midepoch._session import OnMismatch, _Session

if TYPE_CHECKING:
    from lightning.pytorch import Callback as _CallbackBase
    from lightning.pytorch import LightningModule, Trainer


def _callback_bases() -> tuple[type, ...]:
    """Lightning's ``Callback`` from every installed namespace, so that either kind of ``Trainer`` accepts ours."""
    bases = []
    for module in ("lightning.pytorch", "pytorch_lightning"):
        root = module.split(".")[0]
        if importlib.util.find_spec(root) is not None:
            bases.append(importlib.import_module(module).Callback)
    if not bases:  # pragma: no cover - the package requires one of them
        raise ImportError("lightning-midepoch needs `lightning` or `pytorch_lightning`: `pip install lightning`.")
    return tuple(bases)


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
            number of dataloaders, world size). ``"raise"`` (default) stops with a
            :class:`~lightning_midepoch.MidEpochResumeError` saying what differs; ``"restart_epoch"`` warns and
            continues the interrupted epoch from a freshly started order, as stock Lightning does.

    Example:
        >>> import lightning as L
        >>> trainer = L.Trainer(callbacks=[MidEpochResume()], logger=False, enable_progress_bar=False)
        >>> [type(c).__name__ for c in trainer.callbacks if isinstance(c, MidEpochResume)]
        ['MidEpochResume']

    """

    def __init__(self, on_mismatch: OnMismatch = "raise") -> None:
        super().__init__()
        if on_mismatch not in get_args(OnMismatch):
            raise ValueError(f"`on_mismatch` must be one of {list(get_args(OnMismatch))}, got {on_mismatch!r}.")
        self.on_mismatch: OnMismatch = on_mismatch
        self._session: _Session | None = None
        self._loaded: dict[str, Any] | None = None

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        _compat.check_supported(trainer)
        self._uninstall()  # left installed by a fit that ended with an exception
        self._session = _Session(trainer, self.on_mismatch)
        self._session.install()

    @override
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # a checkpoint from the very end of training resumes into no epoch at all: the process still continues
        # from the random states it recorded
        if self._session is not None:
            self._session.restore_live_state()

    @override
    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._session is not None:
            self._session.backward_done = True

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._uninstall()

    def _uninstall(self) -> None:
        if self._session is not None:
            self._session.uninstall()
            self._session = None

    @override
    def state_dict(self) -> dict[str, Any]:
        if self._session is None:
            # outside fit (e.g. a checkpoint saved after training): nothing is in progress
            return {S.KEY_VERSION: S.STATE_VERSION, S.KEY_LOADERS: [], S.KEY_RANKS: []}
        return self._session.state_dict()

    @override
    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        if self._session is None:
            return
        self._session.load_state_dict(state_dict)
