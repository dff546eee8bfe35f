"""The checkpoint state of :class:`~lightning_midepoch.MidEpochResume`: schema, version, facts and validation.

The state is one dict stored by Lightning under the callback's ``state_key``. It holds only tensors, ints, floats,
strings, booleans, ``None``, lists and dicts, so it loads with ``torch.load(..., weights_only=True)``. Its size does
not depend on the dataset: a few random states per train loader and per rank (plus, only for a checkpoint taken
inside a gradient accumulation group, the partial gradients).

Layout (version 1)::

    {
        "version": 1,
        "package_version": str, "lightning_version": str, "torch_version": str,
        "epoch": int,              # trainer.current_epoch when saved
        "fetched": int,            # batches the train fetcher had handed to the loop in this epoch
        "world_size": int,
        "mode": str,               # CombinedLoader mode of the train loaders
        "loaders": [               # one per flattened train loader, facts that must match on resume
            {"kind": "map" | "iterable" | "stateful", "dataset_length": int | None, "num_batches": int | None,
             "batch_size": int | None, "drop_last": bool, "order": str, "seed_determined": bool},
        ],
        "ranks": [                 # indexed by global rank
            {"rng": {...},         # live process-wide states when saved (torch, cuda, numpy, python)
             "passes": [record | None],        # per loader: the states its current pass drew its order from
             "generators": [dict | None],      # per loader: live states of generators its sampler/loader own
             "dataset_states": [dict | None],  # per loader: an IterableDataset's own state_dict(), if it has one
             "grads": {name: tensor} | None},  # partial gradients of an unfinished accumulation group
        ],
    }
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from lightning_midepoch.__about__ import __version__
from lightning_midepoch._order import _IndexSamplerRecorder

STATE_VERSION = 1

KEY_VERSION = "version"
KEY_PACKAGE_VERSION = "package_version"
KEY_LIGHTNING_VERSION = "lightning_version"
KEY_TORCH_VERSION = "torch_version"
KEY_EPOCH = "epoch"
KEY_FETCHED = "fetched"
KEY_WORLD_SIZE = "world_size"
KEY_MODE = "mode"
KEY_LOADERS = "loaders"
KEY_RANKS = "ranks"
KEY_RNG = "rng"
KEY_PASSES = "passes"
KEY_GENERATORS = "generators"
KEY_DATASET_STATES = "dataset_states"
KEY_GRADS = "grads"

KIND_MAP = "map"
KIND_ITERABLE = "iterable"
KIND_STATEFUL = "stateful"


class MidEpochResumeError(RuntimeError):
    """A checkpoint cannot be resumed exactly with the current setup.

    The message says what differs (both values) and how to proceed.
    """


def is_stateful(obj: object) -> bool:
    """Whether ``obj`` saves and restores its own position (``state_dict``/``load_state_dict``).

    Lightning checkpoints such a loader (torchdata's ``StatefulDataLoader``, say) itself.
    """
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def loader_kind(loader: object) -> str:
    """Classify a train loader: one we resume at the sampler level, a stateful one, or an iterable-style one."""
    if is_stateful(loader):
        return KIND_STATEFUL
    if isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset):
        return KIND_MAP
    return KIND_ITERABLE


def index_sampler(loader: DataLoader[Any]) -> Any:
    """The object a DataLoader draws indices from: its batch sampler, or its sampler when ``batch_size=None``."""
    return loader.batch_sampler if loader.batch_sampler is not None else loader.sampler


def _unwrap(sampler: Any) -> Any:
    return sampler.inner if isinstance(sampler, _IndexSamplerRecorder) else sampler


def describe_order(sampler: Any) -> tuple[str, bool]:
    """Describe where a sampler's order comes from.

    Returns:
        A readable description and whether the order is determined without any random state (sequential, or by a
        seed and the epoch), so that it can be reproduced from a checkpoint that recorded nothing.

    Example:
        >>> describe_order(SequentialSampler(range(4)))
        ('SequentialSampler (fixed order)', True)
        >>> describe_order(BatchSampler(RandomSampler(range(4)), 2, False))
        ('BatchSampler over RandomSampler (global torch RNG)', False)

    """
    sampler = _unwrap(sampler)
    name = type(sampler).__name__
    if isinstance(sampler, BatchSampler) and type(sampler).__iter__ is BatchSampler.__iter__:
        inner, determined = describe_order(sampler.sampler)
        return f"{name} over {inner}", determined
    if isinstance(sampler, SequentialSampler):
        return f"{name} (fixed order)", True
    if isinstance(sampler, DistributedSampler):
        how = f"seed {sampler.seed} + epoch" if sampler.shuffle else "fixed order"
        return f"{name} ({how}, rank {sampler.rank} of {sampler.num_replicas})", True
    if isinstance(sampler, RandomSampler):
        return f"{name} ({'own generator' if sampler.generator is not None else 'global torch RNG'})", False
    return f"{name} (custom)", False


def loader_facts(loader: object) -> dict[str, Any]:
    """The facts about a train loader that must not change between saving and resuming an epoch."""
    kind = loader_kind(loader)
    facts: dict[str, Any] = {
        "kind": kind,
        "dataset_length": None,
        "num_batches": None,
        "batch_size": None,
        "drop_last": False,
        "order": type(loader).__name__,
        "seed_determined": False,
    }
    if isinstance(loader, DataLoader):
        facts["batch_size"] = loader.batch_size
        facts["drop_last"] = bool(loader.drop_last)
        if kind == KIND_MAP:
            facts["dataset_length"] = len(loader.dataset)  # type: ignore[arg-type]
            facts["num_batches"] = len(loader)
            facts["order"], facts["seed_determined"] = describe_order(index_sampler(loader))
    return facts


_FACT_NAMES = {
    "dataset_length": "a train dataset of {} samples",
    "batch_size": "batch_size={}",
    "drop_last": "drop_last={}",
    "num_batches": "{} batches per epoch",
    "order": "an order from {}",
}


def check_loaders(saved: Sequence[Mapping[str, Any]], current: Sequence[Mapping[str, Any]], fix: str) -> None:
    """Raise :class:`MidEpochResumeError` if the train loaders differ from the ones the checkpoint was saved with.

    Args:
        saved: Facts stored in the checkpoint, one per loader.
        current: Facts of the loaders now.
        fix: The opt-out to mention in the message.

    """
    if len(saved) != len(current):
        raise MidEpochResumeError(
            f"The checkpoint was saved with {len(saved)} train dataloader(s) but the current run has {len(current)}."
            f" Resume with the same train dataloaders, or {fix}."
        )
    for index, (old, new) in enumerate(zip(saved, current)):
        where = "the train dataloader" if len(saved) == 1 else f"train dataloader {index}"
        if old["kind"] != new["kind"]:
            raise MidEpochResumeError(
                f"The checkpoint was saved with {where} of kind {old['kind']!r} but it is {new['kind']!r} now."
                f" Resume with the same train dataloaders, or {fix}."
            )
        if old["kind"] != KIND_MAP:
            continue
        for key, template in _FACT_NAMES.items():
            if old.get(key) != new.get(key):
                raise MidEpochResumeError(
                    f"The checkpoint was saved with {where} having {template.format(old.get(key))} but the current"
                    f" one has {template.format(new.get(key))}. Resume with the same data and sampler settings,"
                    f" or {fix}."
                )


def check_world_size(saved: int, current: int, fix: str) -> None:
    """Raise :class:`MidEpochResumeError` if an epoch saved on ``saved`` processes is resumed on ``current``."""
    if saved != current:
        raise MidEpochResumeError(
            f"The checkpoint was saved in the middle of an epoch with a world size of {saved} but the current run"
            f" has a world size of {current}. Resume on {saved} device(s), or {fix}."
        )


def migrate(state: Mapping[str, Any]) -> dict[str, Any]:
    """Bring a state saved by any release of this package to the current schema.

    Raises:
        MidEpochResumeError: If the state is from a newer release than the one installed.

    """
    version = state.get(KEY_VERSION)
    if not isinstance(version, int) or version < 1:
        raise MidEpochResumeError(
            f"The checkpoint's MidEpochResume state has no valid version ({version!r}); it was not written by"
            " lightning-midepoch. Resume without the callback, or remove its entry from the checkpoint's callbacks."
        )
    if version > STATE_VERSION:
        raise MidEpochResumeError(
            f"The checkpoint's MidEpochResume state has version {version}, newer than this lightning-midepoch"
            f" ({__version__}) understands (version {STATE_VERSION}). Upgrade lightning-midepoch to resume it."
        )
    return dict(state)
