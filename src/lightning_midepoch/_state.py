"""The checkpoint state of :class:`~lightning_midepoch.MidEpochResume`: its keys, version, loader facts and checks.

The state is one dict stored by Lightning under the callback's ``state_key``. It holds only tensors, ints, floats,
strings, booleans, ``None``, lists and dicts, so it loads with ``torch.load(..., weights_only=True)``. Its size does
not depend on the dataset: a few random states per train loader and per rank (plus, only for a checkpoint taken
inside a gradient accumulation group, the partial gradients).

Its layout is declared once, field by field, in :data:`lightning_midepoch._schema.STATE`: a loaded state is checked
against it (:mod:`lightning_midepoch._validate`) before anything reads it, and :func:`lightning_midepoch._schema.layout`
writes it out with what each field holds. The key strings are the constants below.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    WeightedRandomSampler,
)

from lightning_midepoch.__about__ import __version__
from lightning_midepoch._order import _IndexSamplerRecorder
from lightning_midepoch._sampling import _has_stock_iter

STATE_VERSION = 1

KEY_VERSION = "version"
KEY_PACKAGE_VERSION = "package_version"
KEY_LIGHTNING_VERSION = "lightning_version"
KEY_TORCH_VERSION = "torch_version"
KEY_EPOCH = "epoch"
KEY_FETCHED = "fetched"
KEY_STOPPED = "stopped"
KEY_WORLD_SIZE = "world_size"
KEY_MODE = "mode"
KEY_LOADERS = "loaders"
KEY_RANKS = "ranks"
KEY_RNG = "rng"
KEY_PASSES = "passes"
KEY_GENERATORS = "generators"
KEY_DATASET_STATES = "dataset_states"
KEY_DATASET_GENERATORS = "dataset_generators"
KEY_GRADS = "grads"
KEY_ELASTIC = "elastic"
KEY_WORKERS = "workers"
KEY_LAST_BATCH = "last_batch"
KEY_HOOKS_AFTER = "hooks_after"

KIND_MAP = "map"
KIND_ITERABLE = "iterable"
KIND_STATEFUL = "stateful"
#: A train loader the callback does not understand: left to Lightning, with a warning naming it on a mid-epoch resume.
KIND_FOREIGN = "foreign"


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
    """Classify a train loader: resumed at the sampler level, stateful, iterable-style, or left to Lightning.

    A loader the callback does not understand is :data:`KIND_FOREIGN` (see :func:`foreign_because`). This is the one
    decision of what the callback handles: every part reads it, so a loader is handled whole or not at all.
    """
    if is_stateful(loader):
        return KIND_STATEFUL
    if isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset):
        return KIND_FOREIGN if foreign_because(loader) else KIND_MAP
    return KIND_ITERABLE


def foreign_because(loader: DataLoader[Any]) -> str:
    """Why a map-style DataLoader is left to Lightning (empty where the callback resumes it at the sampler level).

    The callback records and skips a loader's order in its index sampler, below ``DataLoader.__iter__``: a loader
    whose own ``__iter__`` hands out batches some other way (an iterator it made once and reuses), or whose index
    sampler has no length (it repeats for ever), has no pass the callback can count and replay.

    Example:
        >>> from torch.utils.data import Sampler
        >>> foreign_because(DataLoader(range(4), batch_size=2))
        ''
        >>> class Forever(Sampler[int]):
        ...     def __iter__(self):
        ...         while True:
        ...             yield 0
        >>> foreign_because(DataLoader(range(4), sampler=Forever()))
        'its sampler (BatchSampler over Forever) has no length'

    """
    if type(loader).__iter__ is not DataLoader.__iter__:
        return f"{type(loader).__name__} hands out its batches with its own `__iter__`"
    sampler = index_sampler(loader)
    try:
        len(_unwrap(sampler))
    except TypeError:
        return f"its sampler ({describe_order(sampler)[0].split(' (')[0]}) has no length"
    return ""


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
        >>> class Every(Sampler[int]):  # a wrapper: its order is its inner sampler's
        ...     def __init__(self, inner: Sampler[int]) -> None:
        ...         self.inner = inner
        >>> describe_order(Every(RandomSampler(range(4))))
        ('Every over RandomSampler (global torch RNG)', False)

    """
    sampler = _unwrap(sampler)
    name = type(sampler).__name__
    if _has_stock_iter(sampler, BatchSampler):
        inner, determined = describe_order(sampler.sampler)
        return f"{name} over {inner}", determined
    if isinstance(sampler, SequentialSampler):
        return f"{name} (fixed order)", True
    if _has_stock_iter(sampler, DistributedSampler):
        return f"{name} ({f'seed {sampler.seed} + epoch' if sampler.shuffle else 'fixed order'})", True
    if isinstance(sampler, RandomSampler):
        return f"{name} ({'own generator' if sampler.generator is not None else 'global torch RNG'})", False
    wrapped = _wrapped_sampler(sampler)
    if wrapped is not None:
        # a wrapper draws its order from the sampler it wraps (Lightning's DistributedSamplerWrapper, say)
        return f"{name} over {describe_order(wrapped)[0]}", False
    return f"{name} (custom)", False


def _wrapped_sampler(sampler: Any) -> Any:
    """The sampler a custom sampler keeps as an attribute, or in an object it keeps (a dataset made of a sampler)."""

    def other(value: Any) -> bool:
        return isinstance(value, Sampler) and value is not sampler

    own = _first_attribute(sampler, other)
    if own is not None:
        return own
    holder = _first_attribute(
        sampler, lambda value: not isinstance(value, type) and _first_attribute(value, other) is not None
    )
    return None if holder is None else _first_attribute(holder, other)


def _first_attribute(obj: Any, predicate: Callable[[Any], bool]) -> Any:
    """The first of ``obj``'s attributes (``vars(obj)``, in their order) for which ``predicate`` is true, or None.

    Example:
        >>> class Wrapper:
        ...     def __init__(self):
        ...         self.name, self.inner, self.size = "w", [1], 2
        >>> _first_attribute(Wrapper(), lambda value: isinstance(value, (int, list)))
        [1]

    """
    attrs = getattr(obj, "__dict__", None)
    values = attrs.values() if isinstance(attrs, dict) else ()
    return next((value for value in values if predicate(value)), None)


def global_order(index_sampler: Any) -> dict[str, Any] | None:
    """How the epoch's global order can be rebuilt on another number of devices, or None if it cannot.

    The global order is what all ranks together consume: a ``DistributedSampler``'s permutation (from its seed and
    the epoch), or on a single device a sequential or random order (re-drawn from the recorded random states).

    Example:
        >>> global_order(BatchSampler(DistributedSampler(range(8), num_replicas=2, rank=0, seed=3), 2, False))
        {'kind': 'distributed', 'seed': 3, 'shuffle': True, 'drop_last': False, 'batch_drop_last': False}
        >>> global_order(BatchSampler(RandomSampler(range(8)), 2, False))
        {'kind': 'random', 'own_generator': False, 'batch_drop_last': False, 'generator': None}
        >>> global_order(BatchSampler(RandomSampler(range(8), replacement=True), 2, False)) is None
        True

    """
    sampler = _unwrap(index_sampler)
    batch_drop_last = False
    if _has_stock_iter(sampler, BatchSampler):
        batch_drop_last = bool(sampler.drop_last)
        sampler = sampler.sampler
    if _has_stock_iter(sampler, DistributedSampler):
        return {
            "kind": "distributed",
            "seed": sampler.seed,
            "shuffle": bool(sampler.shuffle),
            "drop_last": bool(sampler.drop_last),
            "batch_drop_last": batch_drop_last,
        }
    if _has_stock_iter(sampler, SequentialSampler):
        return {"kind": "sequential", "batch_drop_last": batch_drop_last}
    if (
        _has_stock_iter(sampler, RandomSampler)
        and not sampler.replacement
        and sampler.num_samples == len(sampler.data_source)
    ):
        return {
            "kind": "random",
            "own_generator": sampler.generator is not None,
            "batch_drop_last": batch_drop_last,
            "generator": _generator_path(index_sampler, sampler.generator),
        }
    return None


def _generator_path(recorder: Any, generator: Any) -> str | None:
    """Under which path a recorder records ``generator`` (the loader may own another one), if it records it."""
    if generator is None or not isinstance(recorder, _IndexSamplerRecorder):
        return None
    return next((path for path, found in recorder.rng_objects.items() if found is generator), None)


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
        "global_order": None,
        "settings": {},
    }
    if isinstance(loader, DataLoader):
        facts["batch_size"] = loader.batch_size
        facts["drop_last"] = bool(loader.drop_last)
        if kind == KIND_MAP:
            facts["dataset_length"] = len(loader.dataset)  # type: ignore[arg-type]
            facts["num_batches"] = len(loader)
            facts["order"], facts["seed_determined"] = describe_order(index_sampler(loader))
            facts["global_order"] = global_order(index_sampler(loader))
            facts["settings"] = order_settings(index_sampler(loader))
    return facts


#: The settings of torch's samplers that change the order they give (besides the dataset and the random states).
_ORDER_SETTINGS: tuple[tuple[type, tuple[str, ...]], ...] = (
    (BatchSampler, ("batch_size", "drop_last")),
    (WeightedRandomSampler, ("num_samples", "replacement")),
    (RandomSampler, ("num_samples", "replacement")),
    (DistributedSampler, ("shuffle", "seed", "drop_last")),
)


def order_settings(sampler: Any) -> dict[str, Any]:
    """The settings of the samplers along a chain that change the order, as ``{"Class.setting": value}``.

    Example:
        >>> order_settings(BatchSampler(RandomSampler(range(8), replacement=True), 2, False))
        {'BatchSampler.batch_size': 2, 'BatchSampler.drop_last': False, 'RandomSampler.num_samples': 8, \
'RandomSampler.replacement': True}

    """
    settings: dict[str, Any] = {}
    for _ in range(8):  # a chain of wrappers, bounded
        sampler = _unwrap(sampler)
        for cls, names in _ORDER_SETTINGS:
            if isinstance(sampler, cls):
                for name in names:
                    value = getattr(sampler, name, None)
                    if isinstance(value, (bool, int, float, str)) or value is None:
                        settings.setdefault(f"{cls.__name__}.{name}", value)
                break
        inner = sampler.sampler if _has_stock_iter(sampler, BatchSampler) else _wrapped_sampler(sampler)
        if inner is None:
            break
        sampler = inner
    return settings


#: The facts compared, in this order (the sampler settings before the number of batches they change), and how the
#: error names them ("settings" are named one by one).
_FACT_NAMES = {
    "dataset_length": "a train dataset of {} samples",
    "batch_size": "batch_size={}",
    "drop_last": "drop_last={}",
    "order": "an order from {}",
    "settings": "",
    "num_batches": "{} batches per epoch",
}


def loader_position(mode: str, consumed: int, length: int, recorded_pass: int | None = None) -> tuple[int, int]:
    """Which pass of a loader the epoch's ``consumed``-th batch came from, and how far into that pass it was.

    In ``max_size_cycle`` mode a loader shorter than the epoch restarts when exhausted; a loader exactly exhausted at
    the checkpoint is still in its finished pass (it restarts at the next fetch, as it would have), unless the
    checkpoint recorded (``recorded_pass``, this epoch's) that its next pass had started.

    Example:
        >>> loader_position("max_size_cycle", 6, 3), loader_position("max_size_cycle", 7, 3)
        ((1, 3), (2, 1))
        >>> loader_position("max_size_cycle", 6, 3, recorded_pass=2)  # written inside batch 6, which started pass 2
        (2, 0)

    """
    if mode == "max_size_cycle" and length > 0 and consumed > 0:
        index = (consumed - 1) // length
        if recorded_pass == index + 1 and consumed == recorded_pass * length:
            # written inside the batch whose fetch started the next pass: Lightning fetches that batch again, and it
            # must come from that pass (recorded), not from a pass started afresh
            return recorded_pass, 0
        return index, consumed - index * length
    if mode == "max_size":
        return 0, min(consumed, length)
    return 0, consumed


#: Facts that depend on the number of devices (the sampler Lightning injects, the batches per rank).
_PER_WORLD_SIZE = ("num_batches", "order", "settings")


def check_loaders(
    saved: Sequence[Mapping[str, Any]], current: Sequence[Mapping[str, Any]], fix: str, same_world_size: bool = True
) -> None:
    """Raise :class:`MidEpochResumeError` if the train loaders differ from the ones the checkpoint was saved with.

    Args:
        saved: Facts stored in the checkpoint, one per loader.
        current: Facts of the loaders now.
        fix: The opt-out to mention in the message.
        same_world_size: Whether the run has as many devices as the one that saved; otherwise the facts that depend
            on the number of devices are not compared.

    """
    if len(saved) != len(current):
        raise MidEpochResumeError(
            f"The checkpoint was saved with {len(saved)} train dataloader(s) but the current run has {len(current)}."
            f" Resume with the same train dataloaders, or {fix}."
        )
    for index, (old, new) in enumerate(zip(saved, current, strict=False)):
        where = "the train dataloader" if len(saved) == 1 else f"train dataloader {index}"
        if old["kind"] != new["kind"]:
            raise MidEpochResumeError(
                f"The checkpoint was saved with {where} of kind {old['kind']!r} but it is {new['kind']!r} now."
                f" Resume with the same train dataloaders, or {fix}."
            )
        if old["kind"] != KIND_MAP:
            continue
        for key, template in _FACT_NAMES.items():
            # a fact an earlier release did not save is not compared
            if key not in old or (not same_world_size and key in _PER_WORLD_SIZE):
                continue
            if key == "settings":
                _check_settings(old[key], new.get(key) or {}, where, fix)
            elif old[key] != new.get(key):
                raise MidEpochResumeError(
                    f"The checkpoint was saved with {where} having {template.format(old[key])} but the current"
                    f" one has {template.format(new.get(key))}. Resume with the same data and sampler settings,"
                    f" or {fix}."
                )


def _check_settings(old: Mapping[str, Any], new: Mapping[str, Any], where: str, fix: str) -> None:
    for key, value in old.items():
        if key in new and new[key] != value:
            cls, name = key.rsplit(".", 1)
            raise MidEpochResumeError(
                f"The checkpoint was saved with {where} having {cls}({name}={value!r}) but the current one has"
                f" {cls}({name}={new[key]!r}). Resume with the same sampler settings, or {fix}."
            )


def check_mode(saved: str | None, current: str, fix: str) -> None:
    """Raise :class:`MidEpochResumeError` if the train loaders are combined in another mode than when saved.

    Example:
        >>> check_mode("max_size_cycle", "min_size", "pass the opt-out")
        Traceback (most recent call last):
        ...
        lightning_midepoch._state.MidEpochResumeError: The checkpoint was saved with the train dataloaders combined \
in mode 'max_size_cycle' but the current run combines them in mode 'min_size'. Resume with the same \
CombinedLoader mode, or pass the opt-out.

    """
    if saved and saved != current:
        raise MidEpochResumeError(
            f"The checkpoint was saved with the train dataloaders combined in mode {saved!r} but the current run"
            f" combines them in mode {current!r}. Resume with the same CombinedLoader mode, or {fix}."
        )


def check_elastic(
    saved: Sequence[Mapping[str, Any]], saved_world_size: int, world_size: int, fix: str, recorded: bool = True
) -> None:
    """Raise :class:`MidEpochResumeError` unless an interrupted epoch can be finished on another number of devices.

    That takes a single map-style train loader whose epoch order can be rebuilt (see :func:`global_order`), sharded
    by a ``DistributedSampler`` if it was saved on more than one device, or ``recorded`` if it is random.
    """
    why = ""
    spec = saved[0].get("global_order") if len(saved) == 1 else None
    if len(saved) != 1:
        why = f"it has {len(saved)} train dataloaders (only a single one can be re-sharded)"
    elif saved[0]["kind"] != KIND_MAP:
        why = f"its train dataloader is of kind {saved[0]['kind']!r}"
    elif spec is None:
        why = f"its train dataloader's order ({saved[0]['order']}) has no global order to re-shard"
    elif saved_world_size > 1 and spec["kind"] != "distributed":
        why = f"its {saved_world_size} ranks did not shard one order with a DistributedSampler ({saved[0]['order']})"
    elif spec["kind"] == "random" and not recorded:
        why = "the random order of the interrupted epoch was not recorded"
    if why:
        raise MidEpochResumeError(
            f"The checkpoint was saved in the middle of an epoch with a world size of {saved_world_size} but the"
            f" current run has a world size of {world_size}, and that epoch cannot be re-sharded: {why}."
            f" Resume on {saved_world_size} device(s), or {fix}."
        )


def empty_state() -> dict[str, Any]:
    """The state of a trainer that has not trained with the callback: it records no position.

    Example:
        >>> records_position(migrate(empty_state()))
        False

    """
    return {KEY_VERSION: STATE_VERSION, KEY_LOADERS: [], KEY_RANKS: []}


def records_position(state: Mapping[str, Any]) -> bool:
    """Whether a (migrated) state records where a run was; :func:`empty_state` does not."""
    return KEY_WORLD_SIZE in state


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
    return {KEY_STOPPED: False, **state}
