"""Validation of a checkpoint's MidEpochResume state before anything reads it.

A state that was edited or corrupted after it was written must not reach the code that resumes from it, where a
wrong type or size surfaces as a ``KeyError`` or a torch ``RuntimeError`` deep inside a restore, or worse, is read
without an error and resumes inexactly. :func:`checked` checks a loaded state against :data:`STATE`, a schema built
from the small specs below (one line per field), then the facts that tie fields together (:data:`_RULES`), and
answers the first damage with one :class:`DamagedStateError` naming the field, what it should be and what it is.

The schema is the one documented in :mod:`lightning_midepoch._state`. Keys that no release ever omitted are required;
unknown extra keys are allowed everywhere (a later release may add facts without a new state version). Dataset
states are the user's own: only their type is checked.

Example:
    >>> checked({"version": 1, "loaders": [], "ranks": []})["ranks"]
    []
    >>> checked({"version": "1"})
    Traceback (most recent call last):
    ...
    lightning_midepoch._validate.DamagedStateError: ... damaged: `version`: expected an int >= 1, found a str ('1')...

"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from lightning_midepoch import _rng
from lightning_midepoch import _state as S

#: What to do about a damaged state, in every message that reports one.
FIX = (
    "The state was changed after it was written (edited, truncated or corrupted): resume from an earlier checkpoint,"
    " or pass `MidEpochResume(on_mismatch=\"restart_epoch\")` to resume without the callback's state (Lightning's own"
    " state is still restored; the data order and random states are then drawn afresh, as without the callback)."
)

#: Bytes of a CPU ``torch.Generator`` state (a Mersenne Twister and its position).
TORCH_CPU_STATE_BYTES = torch.Generator().get_state().numel()
#: Bytes of a CUDA generator state (torch's Philox seed and offset, two 64-bit words).
TORCH_CUDA_STATE_BYTES = 16
#: 32-bit words of a Mersenne Twister key (numpy's MT19937, python's ``random``).
MT_WORDS = 624


class DamagedStateError(S.MidEpochResumeError):
    """The checkpoint's MidEpochResume state is not what any release writes: ``field`` is the first damage found."""

    def __init__(self, field: str, expected: str, found: str) -> None:
        self.field, self.expected, self.found = field, expected, found
        super().__init__(f"The checkpoint's MidEpochResume state is damaged: {self.problem} {FIX}")

    @property
    def problem(self) -> str:
        """Where the damage is, what the field should be and what it is, in one sentence."""
        where = f"`{self.field}`" if self.field else "the state"
        return f"{where}: expected {self.expected}, found {self.found}."


class _Damage(Exception):
    """Raised inside the checks; :func:`checked` turns it into a :class:`DamagedStateError`."""

    def __init__(self, path: str, expected: str, found: str) -> None:
        super().__init__(path)
        self.path, self.expected, self.found = path, expected, found


_MISSING = object()


def describe(value: object) -> str:
    """A short description of a value found in a state, for error messages.

    Example:
        >>> describe(torch.zeros(3, dtype=torch.uint8)), describe("abc"), describe([1, 2])
        ('a uint8 tensor of shape (3,)', "a str ('abc')", 'a list of 2 items')

    """
    if value is _MISSING:
        return "nothing (the key is missing)"
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"{_a(_dtype_name(value.dtype))} tensor of shape {tuple(value.shape)}"
    if isinstance(value, bool):
        return f"a bool ({value})"
    if isinstance(value, (int, float)):
        return f"an int ({value})" if isinstance(value, int) else f"a float ({value})"
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:37] + "..."
        return f"a str ({text!r})"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {_items(len(value))}" if value else f"an empty {type(value).__name__}"
    if isinstance(value, Mapping):
        return "a dict"
    return f"an object of type {type(value).__name__}"


def _a(word: str) -> str:
    return f"{'an' if word[0] in 'aeio' else 'a'} {word}"  # "a uint8", "an int32"


def _items(count: int) -> str:
    return f"{count} item{'' if count == 1 else 's'}"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _key(path: str, key: object) -> str:
    """``path.key`` for field names, ``path['key']`` for data (generator paths, parameter names)."""
    if isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


# ---------------------------------------------------------------------------------------------- specs
class Spec:
    """What one field of the state must be: :meth:`check` raises :class:`_Damage` where it is not."""

    expected = "anything"

    def check(self, value: Any, path: str) -> None:
        """Check ``value``, found at ``path``."""

    def fail(self, value: object, path: str) -> _Damage:
        return _Damage(path, self.expected, describe(value))


class Int(Spec):
    """An int (not a bool) from ``low``, up to ``high`` if given."""

    def __init__(self, low: int, high: int | None = None) -> None:
        self.low, self.high = low, high
        self.expected = f"an int >= {low}" if high is None else f"an int from {low} to {high}"

    def check(self, value: Any, path: str) -> None:
        if not _is_int(value) or value < self.low or (self.high is not None and value > self.high):
            raise self.fail(value, path)


class Real(Spec):
    expected = "a float"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise self.fail(value, path)


class Bool(Spec):
    expected = "a bool"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, bool):
            raise self.fail(value, path)


class Str(Spec):
    expected = "a str"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, str):
            raise self.fail(value, path)


class Scalar(Spec):
    expected = "a bool, int, float, str or None"

    def check(self, value: Any, path: str) -> None:
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise self.fail(value, path)


class OneOf(Spec):
    """One of a few exact values (of the same type: ``True`` is not ``1``)."""

    def __init__(self, *values: object) -> None:
        self.values = values
        self.expected = " or ".join(repr(value) for value in values)

    def check(self, value: Any, path: str) -> None:
        if not any(type(value) is type(allowed) and value == allowed for allowed in self.values):
            raise self.fail(value, path)


class Optional(Spec):
    """``None``, or what ``spec`` accepts."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.expected = f"None or {spec.expected}"

    def check(self, value: Any, path: str) -> None:
        if value is None:
            return
        try:
            self.spec.check(value, path)
        except _Damage as damage:
            if damage.path != path or damage.found != describe(value):
                raise
            raise self.fail(value, path) from None  # the value as a whole is wrong: say that None would do too


class AnyDict(Spec):
    expected = "a dict"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, Mapping):
            raise self.fail(value, path)


class Tensor(Spec):
    """A tensor of one dtype (or any floating dtype), 1-D of one of ``sizes`` if given."""

    def __init__(self, dtype: torch.dtype | None = None, sizes: tuple[int, ...] = (), what: str = "") -> None:
        self.dtype, self.sizes = dtype, sizes
        kind = _dtype_name(dtype) if dtype is not None else "floating-point"
        shape = f" of shape ({' or '.join(map(str, sizes))},)" if sizes else ""
        self.expected = f"{_a(kind)} tensor{shape}" + (f" ({what})" if what else "")

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, torch.Tensor):
            raise self.fail(value, path)
        dtype_ok = value.dtype == self.dtype if self.dtype is not None else value.dtype.is_floating_point
        shape_ok = not self.sizes or (value.dim() == 1 and value.numel() in self.sizes)
        if not (dtype_ok and shape_ok):
            raise self.fail(value, path)


class PythonWords(Tensor):
    """python's ``random`` state: 624 Mersenne Twister words and the position (at most 624), as int32."""

    def __init__(self) -> None:
        super().__init__(torch.int32, (MT_WORDS + 1,), what=f"{MT_WORDS} words and a position from 0 to {MT_WORDS}")

    def check(self, value: Any, path: str) -> None:
        super().check(value, path)
        if not 0 <= int(value[-1]) <= MT_WORDS:
            raise _Damage(path, self.expected, f"a position of {int(value[-1])}")


class List(Spec):
    """A list (not a str, not a tuple) of items that ``item`` accepts."""

    def __init__(self, item: Spec, what: str = "") -> None:
        self.item = item
        self.expected = f"a list{f' ({what})' if what else ''}"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, list):
            raise self.fail(value, path)
        for index, item in enumerate(value):
            self.item.check(item, f"{path}[{index}]")


class DictOf(Spec):
    """A dict from str keys (paths, names) to values that ``value`` accepts."""

    def __init__(self, value: Spec, what: str = "") -> None:
        self.value = value
        self.expected = f"a dict{f' ({what})' if what else ''}"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, Mapping):
            raise self.fail(value, path)
        for key, item in value.items():
            if not isinstance(key, str):
                raise _Damage(path, f"{self.expected} with str keys", f"a key that is {describe(key)}")
            self.value.check(item, f"{path}[{key!r}]")


class Record(Spec):
    """A dict with these fields (``optional`` ones may be absent).

    Other keys are ignored, unless the record is ``closed``: where the code reads every key (the parts of a pass
    record's states, an encoded numpy array), an unknown one is damage.
    """

    def __init__(
        self,
        what: str = "",
        *,
        optional: Mapping[str, Spec] | None = None,
        closed: bool = False,
        fields: Mapping[str, Spec] | None = None,
        **named: Spec,
    ) -> None:
        self.fields, self.optional = {**(fields or {}), **named}, dict(optional or {})
        self.what, self.closed = what, closed
        self.expected = f"{what} (a dict)" if what else "a dict"

    def extended(self, **fields: Spec) -> Record:
        """The same record with more required fields."""
        return Record(self.what, optional=self.optional, closed=self.closed, fields={**self.fields, **fields})

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, Mapping):
            raise self.fail(value, path)
        for key, spec in self.fields.items():
            spec.check(value.get(key, _MISSING), _key(path, key))
        for key, spec in self.optional.items():
            if key in value:
                spec.check(value[key], _key(path, key))
        unknown = [key for key in value if key not in self.fields and key not in self.optional]
        if self.closed and unknown:
            known = ", ".join(map(repr, [*self.fields, *self.optional]))
            raise _Damage(_key(path, unknown[0]), f"no such key (this dict holds only {known})", "one")


class Tagged(Spec):
    """A dict whose ``tag`` field says which record it is (``{"kind": "torch", ...}``)."""

    def __init__(self, tag: str, records: Mapping[str, Record], what: str = "") -> None:
        self.tag, self.records = tag, records
        self.expected = f"{what} (a dict)" if what else "a dict"
        self.tag_spec = OneOf(*records)

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, Mapping):
            raise self.fail(value, path)
        self.tag_spec.check(value.get(self.tag, _MISSING), _key(path, self.tag))
        self.records[value[self.tag]].check(value, path)


class NumpyBitGenerator(Spec):
    """The state of a numpy bit generator (``Generator.bit_generator.state``), as ``_rng`` encodes it.

    Its layout depends on the bit generator: it is checked by giving it to a new one of that kind.
    """

    expected = "the state of a numpy bit generator (a dict naming it in 'bit_generator')"

    def check(self, value: Any, path: str) -> None:
        name = value.get("bit_generator") if isinstance(value, Mapping) else None
        kind = getattr(np.random, name, None) if isinstance(name, str) else None
        if not (isinstance(kind, type) and issubclass(kind, np.random.BitGenerator)):
            raise self.fail(value, path)
        try:
            kind().state = _rng._decode(value)
        except Exception as error:  # whatever numpy refuses, whichever way it says so
            raise _Damage(path, f"a state numpy's {name} accepts", f"one it refuses ({error})") from None


# ---------------------------------------------------------------------------------------------- the schema
_TORCH = Tensor(torch.uint8, (TORCH_CPU_STATE_BYTES,), what="a CPU generator's state")
_NUMPY_MT19937 = Record(
    "numpy's global state",
    name=OneOf("MT19937"),
    keys=Tensor(torch.int32, (MT_WORDS,)),
    pos=Int(0, MT_WORDS),
    has_gauss=Int(0, 1),
    cached_gaussian=Real(),
)


class _GlobalNumpy(Spec):
    """numpy's global state: its default MT19937 packed, or another bit generator in numpy's layout (``_rng``)."""

    expected = _NUMPY_MT19937.expected
    other = Record("numpy's global state", name=Str(), state=NumpyBitGenerator())

    def check(self, value: Any, path: str) -> None:
        named = value.get("name") if isinstance(value, Mapping) else None
        (_NUMPY_MT19937 if named == "MT19937" or not isinstance(named, str) else self.other).check(value, path)


_NUMPY = _GlobalNumpy()
_PYTHON = Record("python's random state", version=OneOf(3), state=PythonWords(), gauss_next=Optional(Real()))
_CUDA = List(Tensor(torch.uint8, (TORCH_CUDA_STATE_BYTES,)), what="one CUDA generator state per device")
#: The process-wide states (``_rng.capture_global``).
_GLOBAL = Record("process-wide random states", optional={"cuda": _CUDA}, torch=_TORCH, numpy=_NUMPY, python=_PYTHON)
#: Only those that changed since the pass's ``iter()`` (``_PassRecord.capture_first_next``).
_GLOBAL_CHANGED = Record("process-wide random states", optional={**_GLOBAL.fields, **_GLOBAL.optional})

#: A generator object's state (``_rng._object_state``).
_OBJECT = Tagged(
    "kind",
    {
        # samplers and loaders draw their indices on the CPU: their generators are CPU ones
        "torch": Record(state=_TORCH),
        "python": Record(state=_PYTHON),
        "numpy_legacy": Record(
            state=Record(
                "a RandomState's state",
                bit_generator=OneOf("MT19937"),
                state=Record(
                    key=Record(closed=True, ndarray=Tensor(torch.int64, (MT_WORDS,)), dtype=OneOf("uint32")),
                    pos=Int(0, MT_WORDS),
                ),
                has_gauss=Int(0, 1),
                gauss=Real(),
            )
        ),
        "numpy": Record(state=NumpyBitGenerator()),
    },
    what="a generator's state",
)
_OBJECTS = DictOf(_OBJECT, what="generator states by path")

#: A pass record (``_order._PassRecord.state_dict``).
_PASS = Record(
    "a pass record",
    optional={
        "at_first_next": Optional(Record(closed=True, fields={"global": _GLOBAL_CHANGED, "objects": _OBJECTS})),
        "pulled": Optional(Int(0)),
        "exhausted": Optional(Bool()),
        "at_start": Optional(Record(closed=True, fields={"global": _GLOBAL_CHANGED, "objects": _OBJECTS})),
    },
    epoch=Int(0),
    index=Int(0),
    at_iter=Record(closed=True, fields={"global": _GLOBAL, "objects": _OBJECTS}),
)

#: How an epoch's global order is rebuilt (``_state.global_order``).
_GLOBAL_ORDER = Tagged(
    "kind",
    {
        "distributed": Record(seed=Int(-(2**63), 2**64 - 1), shuffle=Bool(), drop_last=Bool(), batch_drop_last=Bool()),
        "sequential": Record(batch_drop_last=Bool()),
        "random": Record(optional={"generator": Optional(Str())}, own_generator=Bool(), batch_drop_last=Bool()),
    },
    what="an order spec",
)

#: A train loader's facts (``_state.loader_facts``); facts added later are not checked here.
_LOADER = Record(
    "a train dataloader's facts",
    optional={"settings": DictOf(Scalar(), what="order settings by 'Class.setting'")},
    kind=OneOf(S.KIND_MAP, S.KIND_ITERABLE, S.KIND_STATEFUL, S.KIND_FOREIGN),
    dataset_length=Optional(Int(0)),
    num_batches=Optional(Int(0)),
    batch_size=Optional(Int(1)),
    drop_last=Bool(),
    order=Str(),
    seed_determined=Bool(),
    global_order=Optional(_GLOBAL_ORDER),
)

#: One DataLoader worker's states (``_workers.LoaderWorkers.state_dict``).
_WORKER = Record(
    "a worker's states",
    state=Optional(
        Record(
            "a worker's random states",
            optional={"dataset": AnyDict(), "ended": Bool()},
            fields={"global": _GLOBAL, "objects": _OBJECTS},
        )
    ),
    seed=Int(-(2**63), 2**63 - 1),
    init_digest=Int(0),
)
#: A train loader's DataLoader workers' states.
_WORKERS = Record(
    "a loader's worker states",
    optional={"after_pass": List(_WORKER, what="one per worker"), "next_worker": Int(0), "sample": Int(0)},
    num_workers=Int(1),
    workers=List(_WORKER, what="one per worker"),
)

#: The batch check's entry (``_saving.Saver._last_batch``): a batch's fingerprint, the states it was loaded from.
_LAST_BATCH = Record(
    "the batch check's entry",
    optional={
        S.KEY_DATASET_GENERATORS: List(Optional(_OBJECTS), what="one dict of generator states or None per loader")
    },
    fingerprint=Record(
        "a batch's fingerprint", digest=Str(), leaves=DictOf(Str(), what="a description of each part of the batch")
    ),
    rng=_GLOBAL,
)
#: One rank's states; ``None`` for a rank whose states could not be gathered.
_RANK = Optional(
    Record(
        "a rank's states",
        optional={
            S.KEY_WORKERS: List(Optional(_WORKERS), what="one entry or None per train dataloader"),
            S.KEY_DATASET_GENERATORS: List(
                Optional(_OBJECTS), what="one dict of generator states or None per train dataloader"
            ),
            S.KEY_LAST_BATCH: Optional(_LAST_BATCH),
        },
        rng=_GLOBAL,
        passes=List(Optional(_PASS), what="one pass record or None per train dataloader"),
        generators=List(Optional(_OBJECTS), what="one dict of generator states or None per train dataloader"),
        dataset_states=List(Optional(AnyDict()), what="one dataset state or None per train dataloader"),
        grads=Optional(DictOf(Tensor(), what="partial gradients by parameter name")),
    )
)

#: How one world size lays an epoch out (``_planning.elastic_layout``).
_LAYOUT = Record(world_size=Int(1), drop_last=Bool(), batch_size=Int(1), batch_drop_last=Bool())
#: An epoch being finished on another world size (``_session._start_elastic_epoch``).
_ELASTIC = Record(
    "an elastic epoch",
    epoch=Int(0),
    spec=_GLOBAL_ORDER,
    dataset_length=Int(0),
    record=Optional(_PASS),
    phases=List(_LAYOUT.extended(consumed=Int(0)), what="the stretches of the epoch run so far"),
    current=_LAYOUT.extended(batch_offset=Int(0)),
)

#: A state that records a position (see ``_state``'s layout); ``stopped`` arrived after 0.1.0.
STATE = Record(
    "the MidEpochResume state",
    optional={S.KEY_STOPPED: Bool()},
    fields={
        S.KEY_VERSION: Int(1),
        S.KEY_PACKAGE_VERSION: Str(),
        S.KEY_LIGHTNING_VERSION: Str(),
        S.KEY_TORCH_VERSION: Str(),
        S.KEY_EPOCH: Int(0),
        S.KEY_FETCHED: Int(0),
        S.KEY_WORLD_SIZE: Int(1),
        S.KEY_MODE: Str(),
        S.KEY_ELASTIC: Optional(_ELASTIC),
        S.KEY_LOADERS: List(_LOADER, what="one dict of facts per train dataloader"),
        S.KEY_RANKS: List(_RANK, what="one entry per rank"),
    },
)
#: The keys of a state written before the trainer trained with the callback (``_state.empty_state``).
_EMPTY_KEYS = {S.KEY_VERSION, S.KEY_LOADERS, S.KEY_RANKS, S.KEY_STOPPED}


# ---------------------------------------------------------------------------------------------- cross-field rules
def _ranks_match_world_size(state: Mapping[str, Any]) -> None:
    # fewer entries than ranks: the states could not be exchanged (no process group when the file was written)
    ranks, world_size = state[S.KEY_RANKS], state[S.KEY_WORLD_SIZE]
    if not 1 <= len(ranks) <= world_size or all(rank is None for rank in ranks):
        count = "1 entry" if world_size == 1 else f"1 to {world_size} entries"
        raise _Damage(
            S.KEY_RANKS,
            f"a list of {count} (world_size is {world_size}), at least one of them a dict",
            describe(ranks) + (", all None" if ranks else ""),
        )


def _rank_lists_match_loaders(state: Mapping[str, Any]) -> None:
    loaders = len(state[S.KEY_LOADERS])
    for rank, rank_state in enumerate(state[S.KEY_RANKS]):
        for key in (S.KEY_PASSES, S.KEY_GENERATORS, S.KEY_DATASET_STATES, S.KEY_DATASET_GENERATORS):
            if rank_state is not None and key in rank_state and len(rank_state[key]) != loaders:
                raise _Damage(
                    f"{S.KEY_RANKS}[{rank}].{key}",
                    f"a list of {_items(loaders)}, one per train dataloader (`{S.KEY_LOADERS}` has {loaders})",
                    describe(rank_state[key]),
                )


def _map_loaders_have_sizes(state: Mapping[str, Any]) -> None:
    for index, facts in enumerate(state[S.KEY_LOADERS]):
        for key in ("dataset_length", "num_batches"):
            if facts["kind"] == S.KIND_MAP and facts[key] is None:
                raise _Damage(f"{S.KEY_LOADERS}[{index}].{key}", "an int for a map-style dataloader", "None")


def _has_torch_generator(record: Mapping[str, Any]) -> bool:
    objects = {**record["at_iter"]["objects"], **record["at_first_next"]["objects"]}
    return any(state["kind"] == "torch" for state in objects.values())


def _check_random_record(
    spec: Mapping[str, Any] | None, record: Mapping[str, Any] | None, path: str, rebuilt: bool = False
) -> None:
    """A random order rebuilt from a pass record needs the states of its first draw, and its generator's.

    A pass record may lack the first draw (a checkpoint written before the pass's first ``next()``): a resume then
    draws it, and an elastic resume refuses it with a clear error; the record of an epoch already finished
    elastically (``rebuilt``) is always rebuilt.
    """
    if spec is None or spec["kind"] != "random" or record is None:
        return
    if record.get("at_first_next") is None:
        if rebuilt:
            found = describe(record.get("at_first_next", _MISSING))
            raise _Damage(_key(path, "at_first_next"), "the states of a random order's first draw (a dict)", found)
        return
    if spec["own_generator"] and not _has_torch_generator(record):
        raise _Damage(
            _key(_key(path, "at_iter"), "objects"),
            "the state of the torch generator its order spec says the sampler owns",
            "no torch generator state",
        )


def _random_orders_recorded(state: Mapping[str, Any]) -> None:
    specs = [facts["global_order"] for facts in state[S.KEY_LOADERS]]
    for rank, rank_state in enumerate(state[S.KEY_RANKS]):
        for index, record in enumerate(rank_state[S.KEY_PASSES] if rank_state is not None else []):
            _check_random_record(specs[index], record, f"{S.KEY_RANKS}[{rank}].{S.KEY_PASSES}[{index}]")


def _elastic_matches_loaders(state: Mapping[str, Any]) -> None:
    elastic = state[S.KEY_ELASTIC]
    if elastic is None:
        return
    if elastic["spec"]["kind"] == "random" and elastic["record"] is None:
        raise _Damage(f"{S.KEY_ELASTIC}.record", "the pass record a random order is rebuilt from", "None")
    _check_random_record(elastic["spec"], elastic["record"], f"{S.KEY_ELASTIC}.record", rebuilt=True)
    loaders = state[S.KEY_LOADERS]
    length = loaders[0]["dataset_length"] if len(loaders) == 1 else None
    if elastic["dataset_length"] != length:
        raise _Damage(
            f"{S.KEY_ELASTIC}.dataset_length",
            f"the dataset length of the single train dataloader ({length})",
            describe(elastic["dataset_length"]),
        )


def _workers_match_their_count(state: Mapping[str, Any]) -> None:
    # a missing worker would start from fresh states on resume: silently inexact
    loaders = len(state[S.KEY_LOADERS])
    for rank, rank_state in enumerate(state[S.KEY_RANKS]):
        entries = rank_state.get(S.KEY_WORKERS) if rank_state is not None else None
        path = f"{S.KEY_RANKS}[{rank}].{S.KEY_WORKERS}"
        if entries is not None and len(entries) > loaders:
            expected = f"a list of at most {_items(loaders)}, one per train dataloader"
            expected += f" (`{S.KEY_LOADERS}` has {loaders})"
            raise _Damage(path, expected, describe(entries))
        for index, entry in enumerate(entries or []):
            if entry is None:
                continue
            count, entry_path = entry["num_workers"], f"{path}[{index}]"
            for key in ("workers", "after_pass"):
                if key in entry and len(entry[key]) != count:
                    expected = f"a list of {_items(count)}, one per worker (num_workers is {count})"
                    raise _Damage(_key(entry_path, key), expected, describe(entry[key]))
            if entry.get("next_worker", 0) >= count:
                expected = f"a worker id from 0 to {count - 1} (num_workers is {count})"
                raise _Damage(_key(entry_path, "next_worker"), expected, describe(entry["next_worker"]))


#: Facts that tie fields together, checked in turn once every field has the right type.
_RULES: tuple[Callable[[Mapping[str, Any]], None], ...] = (
    _ranks_match_world_size,
    _rank_lists_match_loaders,
    _map_loaders_have_sizes,
    _random_orders_recorded,
    _elastic_matches_loaders,
    _workers_match_their_count,
)


# ---------------------------------------------------------------------------------------------- entry points
def _is_empty(state: Mapping[str, Any]) -> bool:
    """Whether a state is the one a trainer writes before it trained with the callback (it records nothing)."""
    return set(state) <= _EMPTY_KEYS and all(state.get(key) == [] for key in (S.KEY_LOADERS, S.KEY_RANKS))


def _damaged(error: _Damage) -> DamagedStateError:
    return DamagedStateError(error.path, error.expected, error.found)


def checked(state: object) -> dict[str, Any]:
    """The state of a checkpoint brought to the current schema, once it is known to be intact.

    Raises:
        DamagedStateError: Naming the first field that no release of this package writes that way.
        MidEpochResumeError: If the state comes from a newer release (see :func:`~lightning_midepoch._state.migrate`).

    """
    try:
        Record(fields={S.KEY_VERSION: Int(1)}).check(state, "")
    except _Damage as error:
        raise _damaged(error) from None
    migrated = S.migrate(state)  # type: ignore[arg-type]
    try:
        if not _is_empty(migrated):
            STATE.check(migrated, "")
            for rule in _RULES:
                rule(migrated)
    except _Damage as error:
        raise _damaged(error) from None
    return migrated


def check_grads(state: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Check every rank's partial gradients of an intact state against the model's parameter shapes.

    Raises:
        DamagedStateError: If a gradient names no parameter of the model or has another shape than its parameter.

    """
    for rank, rank_state in enumerate(state[S.KEY_RANKS]):
        grads = rank_state[S.KEY_GRADS] if rank_state is not None else None
        for name, grad in (grads or {}).items():
            path = f"{S.KEY_RANKS}[{rank}].{S.KEY_GRADS}[{name!r}]"
            if name not in shapes:
                expected = "the gradient of one of the model's parameters"
                raise DamagedStateError(path, expected, "no parameter of that name")
            if tuple(grad.shape) != tuple(shapes[name]):
                raise DamagedStateError(
                    path, f"a tensor of shape {tuple(shapes[name])} (the parameter's)", describe(grad)
                )
