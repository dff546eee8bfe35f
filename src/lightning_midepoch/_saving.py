"""The callback's checkpoint state at one moment, and the exchange that brings every rank's part into it.

A checkpoint can be written while ``fit`` runs or after it ended (``trainer.save_checkpoint`` once ``fit`` returned
or raised). The session therefore keeps a :class:`Snapshot` of the moment training stopped: a checkpoint written
later records where the run stopped and the random states it had then, not what the process did afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lightning_midepoch import _state as S


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


def gather(rank_state: dict[str, Any], rank: int, world_size: int, own_only: bool) -> list[dict[str, Any] | None]:
    """Every rank's state in global rank order, on rank 0, which writes the checkpoint; other ranks get their own.

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
    # sent to the writing rank only, so that no rank holds every rank's partial gradients; tensors travel as bytes
    # (pickling a tensor calls torch.save, which no rank but the writing one calls in stock Lightning)
    received: list[Any] | None = [None] * world_size if rank == 0 else None
    torch.distributed.gather_object(_to_wire(rank_state), received, dst=0)
    if received is None:
        return states
    return [_from_wire(state) for state in received]


@dataclass(frozen=True)
class _WireTensor:
    """A tensor as plain bytes, dtype and shape."""

    data: bytes
    dtype: str
    shape: tuple[int, ...]


def _to_wire(obj: Any) -> Any:
    """Replace every tensor in nested dicts, lists and tuples by a :class:`_WireTensor`.

    Example:
        >>> wire = _to_wire({"a": [torch.arange(3, dtype=torch.bfloat16)]})
        >>> wire["a"][0].dtype, wire["a"][0].shape
        ('bfloat16', (3,))
        >>> _from_wire(wire)
        {'a': [tensor([0., 1., 2.], dtype=torch.bfloat16)]}

    """
    if isinstance(obj, torch.Tensor):
        tensor = obj.detach().cpu().contiguous()
        raw = tensor.reshape(-1).view(torch.uint8) if tensor.numel() else tensor.new_empty(0, dtype=torch.uint8)
        return _WireTensor(raw.numpy().tobytes(), str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))
    if isinstance(obj, dict):
        return {key: _to_wire(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_wire(value) for value in obj)
    return obj


def _from_wire(obj: Any) -> Any:
    """The inverse of :func:`_to_wire`."""
    if isinstance(obj, _WireTensor):
        dtype = getattr(torch, obj.dtype)
        if not obj.data:
            return torch.empty(obj.shape, dtype=dtype)
        # a new writable buffer, which the tensor keeps alive
        return torch.frombuffer(bytearray(obj.data), dtype=torch.uint8).view(dtype).reshape(obj.shape)
    if isinstance(obj, dict):
        return {key: _from_wire(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_from_wire(value) for value in obj)
    return obj
