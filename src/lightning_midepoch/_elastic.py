"""Finishing an interrupted epoch on a different number of devices (elastic resume).

The epoch's *global order* is the sequence all ranks consume together: a ``DistributedSampler``'s permutation
(rebuilt from its seed and the epoch), or on a single device a sequential or random order (re-drawn from the random
states recorded when it was drawn). Ranks take interleaved positions of it, as ``DistributedSampler`` lays them out
(rank ``r`` gets positions ``r, r + W, r + 2W, ...`` of the order padded with repeats, or truncated with
``drop_last``), so after every rank consumed ``c`` samples, positions ``[0, c * W)`` are consumed and the rest
remains. Resuming on ``W'`` devices lays the remaining samples out the same way over ``W'`` ranks. An epoch can be
resumed elastically several times: each stretch run on one world size is a *phase*, applied in turn.

Imports only torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import RandomSampler

from lightning_midepoch import _rng


def global_order(
    spec: Mapping[str, Any], dataset_length: int, epoch: int, record: Mapping[str, Any] | None
) -> list[int]:
    """Rebuild the epoch's global order from the loader's order spec (see ``_state.global_order``).

    Args:
        spec: ``{"kind": "distributed", "seed", "shuffle", ...}``, ``{"kind": "sequential"}`` or
            ``{"kind": "random", "own_generator"}``.
        dataset_length: The dataset's length.
        epoch: The epoch (seeds a shuffling ``DistributedSampler``).
        record: The recorded pass (``_PassRecord.state_dict()``) of a random order on a single device.

    """
    kind = spec["kind"]
    if kind == "sequential" or (kind == "distributed" and not spec["shuffle"]):
        return list(range(dataset_length))
    if kind == "distributed":
        seeded = torch.Generator()
        seeded.manual_seed(int(spec["seed"]) + epoch)
        return [int(i) for i in torch.randperm(dataset_length, generator=seeded).tolist()]
    assert record is not None, "a random order is re-sharded only when recorded (checked by _state.check_elastic)"
    states = {part: {**record["at_iter"][part], **record["at_first_next"][part]} for part in record["at_iter"]}
    generator: torch.Generator | None = None
    if spec["own_generator"]:
        generator = torch.Generator()
        generator.set_state(_sampler_generator_state(spec, states["objects"])["state"])
    with _rng.isolated_global():
        _rng.restore_global(states["global"])
        return [int(i) for i in RandomSampler(range(dataset_length), generator=generator)]


def _sampler_generator_state(spec: Mapping[str, Any], objects: Mapping[str, Any]) -> Mapping[str, Any]:
    """The recorded state of the sampler's own generator (the DataLoader may own another one, drawn from first).

    The spec names its path; a spec saved before it did is read as the walk lays generators out: the loader's own
    first, then its sampler's.
    """
    named = spec.get("generator")
    if named is not None and named in objects:
        return objects[named]  # type: ignore[no-any-return]
    torch_states: dict[str, Mapping[str, Any]] = {
        path: state for path, state in objects.items() if state.get("kind") == "torch"
    }
    for path, state in torch_states.items():
        if path.endswith("sampler.generator"):
            return state
    return next(iter(torch_states.values()))


def per_rank(total: int, world_size: int, drop_last: bool) -> int:
    """How many positions each rank gets when ``total`` samples are laid out over ``world_size`` ranks."""
    return total // world_size if drop_last else math.ceil(total / world_size)


def used_per_rank(samples: int, batch_size: int, batch_drop_last: bool) -> int:
    """How many of a rank's ``samples`` its batches use (a ``BatchSampler`` with ``drop_last`` drops a tail)."""
    return samples - samples % batch_size if batch_drop_last else samples


def remaining(order: Sequence[int], phases: Sequence[Mapping[str, Any]]) -> list[int]:
    """The samples of ``order`` left after each phase consumed ``consumed`` samples on each of its ranks.

    Each phase is ``{"world_size", "drop_last", "batch_size", "batch_drop_last", "consumed"}``. Padding
    (repeated samples) is never part of what remains; samples a phase's layout dropped stay dropped.

    Example:
        >>> phase = {"world_size": 2, "drop_last": False, "batch_size": 1, "batch_drop_last": False, "consumed": 2}
        >>> remaining(list(range(7)), [phase])
        [4, 5, 6]

    """
    left = list(order)
    for phase in phases:
        world_size = int(phase["world_size"])
        samples = per_rank(len(left), world_size, bool(phase["drop_last"]))
        used = used_per_rank(samples, int(phase["batch_size"]), bool(phase["batch_drop_last"]))
        consumed = min(int(phase["consumed"]), used)
        left = left[consumed * world_size : min(used * world_size, len(left))]
    return left


def shard(indices: Sequence[int], rank: int, world_size: int, drop_last: bool) -> list[int]:
    """Rank ``rank``'s positions of ``indices`` laid out as ``DistributedSampler`` lays out an epoch.

    Example:
        >>> shard([10, 11, 12, 13, 14], rank=1, world_size=2, drop_last=False)
        [11, 13, 10]
        >>> shard([10, 11, 12, 13, 14], rank=1, world_size=2, drop_last=True)
        [11, 13]

    """
    total = per_rank(len(indices), world_size, drop_last) * world_size
    padded = list(indices)
    while len(padded) < total:
        padded += list(indices)[: total - len(padded)]
    return padded[rank:total:world_size]


def batched(indices: Sequence[int], batch_size: int, drop_last: bool) -> list[list[int]]:
    """Group indices into batches as ``BatchSampler`` does.

    Example:
        >>> batched([1, 2, 3, 4, 5], 2, drop_last=False)
        [[1, 2], [3, 4], [5]]

    """
    batches = [list(indices[i : i + batch_size]) for i in range(0, len(indices), batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    return batches
