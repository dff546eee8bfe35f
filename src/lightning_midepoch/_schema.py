"""The layout of a checkpoint's MidEpochResume state, declared once: what each field is and what it holds.

:data:`STATE` declares the state written under the callback's ``state_key``, field by field, in a small language of
specs (:class:`Int`, :class:`Tensor`, :class:`Record`, ...): each says what a field must be (checked by
:mod:`lightning_midepoch._validate` before anything reads a loaded state, its ``expected`` text naming it in the error
messages) and, through :class:`Field`, what it holds. The readable layout (:func:`layout`) and the table of the API
page (:func:`markdown_table`, ``docs/api.md``, checked by ``tests/test_docs.py``) are written from it.

Keys that no release ever omitted are required; unknown extra keys are allowed everywhere (a later release may add
facts without a new state version). Dataset states are the user's own: only their type is checked.

Example:
    >>> print(layout(_PYTHON))
    version (3): the version of python's state tuple
    state (an int32 tensor of shape (625,) (624 words and a position from 0 to 624)): its Mersenne Twister key
    gauss_next (None or a float): the cached Gaussian of random.gauss
    >>> print(markdown_table().splitlines()[6])
    | `epoch` | an int >= 0 | trainer.current_epoch when saved |

"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from lightning_midepoch import _rng
from lightning_midepoch import _state as S

#: Bytes of a CPU ``torch.Generator`` state (a Mersenne Twister and its position).
TORCH_CPU_STATE_BYTES = torch.Generator().get_state().numel()
#: Bytes of a CUDA generator state (torch's Philox seed and offset, two 64-bit words).
TORCH_CUDA_STATE_BYTES = 16
#: 32-bit words of a Mersenne Twister key (numpy's MT19937, python's ``random``).
MT_WORDS = 624


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


class Field(Spec):
    """A field's spec with what the field holds (``doc``): checked as ``spec``, written out by :func:`layout`."""

    def __init__(self, spec: Spec, doc: str) -> None:
        self.spec, self.doc = spec, doc
        self.expected = spec.expected

    def check(self, value: Any, path: str) -> None:
        self.spec.check(value, path)


def _unwrapped(spec: Spec) -> tuple[Spec, str]:
    return (spec.spec, spec.doc) if isinstance(spec, Field) else (spec, "")


# ---------------------------------------------------------------------------------------------- the schema
F = Field
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
_PYTHON = Record(
    "python's random state",
    version=F(OneOf(3), "the version of python's state tuple"),
    state=F(PythonWords(), "its Mersenne Twister key"),
    gauss_next=F(Optional(Real()), "the cached Gaussian of random.gauss"),
)
_CUDA = List(Tensor(torch.uint8, (TORCH_CUDA_STATE_BYTES,)), what="one CUDA generator state per device")
#: The process-wide states (``_rng.capture_global``).
_GLOBAL = Record(
    "process-wide random states",
    optional={"cuda": F(_CUDA, "CUDA's generators, where CUDA was initialized")},
    torch=F(_TORCH, "torch's CPU generator"),
    numpy=F(_NUMPY, "numpy's global generator (its MT19937 packed, or another bit generator in numpy's layout)"),
    python=F(_PYTHON, "python's random module"),
)
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
_STATES_AT = Record(closed=True, fields={"global": _GLOBAL, "objects": _OBJECTS})
_CHANGED_AT = Record(closed=True, fields={"global": _GLOBAL_CHANGED, "objects": _OBJECTS})

#: A pass record (``_order._PassRecord.state_dict``).
_PASS = Record(
    "a pass record",
    optional={
        "at_first_next": F(
            Optional(_CHANGED_AT), "the states that changed by the pass's first next(), when the order was drawn"
        ),
        "pulled": F(Optional(Int(0)), "how many items the loader had taken from the pass"),
        "exhausted": F(Optional(Bool()), "whether the loader had taken the whole pass"),
        "at_start": F(Optional(_CHANGED_AT), "an iterable dataset's: the states its epoch's iterator started at"),
    },
    epoch=F(Int(0), "the epoch of the pass"),
    index=F(Int(0), "which pass of the epoch (a shorter loader cycles in max_size_cycle mode)"),
    at_iter=F(_STATES_AT, "the states at the pass's iter(): the process-wide ones, and the generators by path"),
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
    optional={
        "settings": F(
            DictOf(Scalar(), what="order settings by 'Class.setting'"),
            "the sampler settings that change the order (not in 0.2.0)",
        )
    },
    kind=F(
        OneOf(S.KIND_MAP, S.KIND_ITERABLE, S.KIND_STATEFUL, S.KIND_FOREIGN),
        "resumed at the sampler level (map), an iterable dataset, a loader with its own state_dict, or left to"
        " Lightning (foreign)",
    ),
    dataset_length=F(Optional(Int(0)), "the dataset's length (map-style)"),
    num_batches=F(Optional(Int(0)), "the loader's batches per epoch (map-style)"),
    batch_size=F(Optional(Int(1)), "the loader's batch_size"),
    drop_last=F(Bool(), "the loader's drop_last"),
    order=F(Str(), "where the order comes from, in words ('BatchSampler over RandomSampler (global torch RNG)')"),
    seed_determined=F(Bool(), "whether the order is fixed, or determined by a seed and the epoch"),
    global_order=F(Optional(_GLOBAL_ORDER), "how the epoch's global order is rebuilt on another number of devices"),
)

#: One DataLoader worker's states (``_workers.LoaderWorkers.state_dict``).
_WORKER = Record(
    "a worker's states",
    state=F(
        Optional(
            Record(
                "a worker's random states",
                optional={"dataset": AnyDict(), "ended": Bool()},
                fields={"global": _GLOBAL, "objects": _OBJECTS},
            )
        ),
        "its random states after the last batch it produced",
    ),
    seed=F(Int(-(2**63), 2**63 - 1), "the seed torch gave it"),
    init_digest=F(Int(0), "a digest of the states its worker_init_fn left"),
)
#: A train loader's DataLoader workers' states.
_WORKERS = Record(
    "a loader's worker states",
    optional={
        "after_pass": F(List(_WORKER, what="one per worker"), "persistent workers at an epoch's end"),
        "next_worker": F(Int(0), "the worker the next batch comes from"),
        "sample": F(Int(0), "an index the pass loaded (a resumed worker may load it once, to create its generators)"),
    },
    num_workers=F(Int(1), "the loader's num_workers"),
    workers=F(List(_WORKER, what="one per worker"), "each worker's states"),
)

#: The batch check's entry (``_saving.Saver._last_batch``): a batch's fingerprint, the states it was loaded from.
_LAST_BATCH = Record(
    "the batch check's entry",
    optional={
        S.KEY_DATASET_GENERATORS: F(
            List(Optional(_OBJECTS), what="one dict of generator states or None per loader"),
            "the generators of datasets read in the main process, as it was loaded",
        )
    },
    fingerprint=F(
        Record(
            "a batch's fingerprint",
            digest=Str(),
            leaves=DictOf(Str(), what="a description of each part of the batch"),
        ),
        "the last batch trained, fingerprinted",
    ),
    rng=F(_GLOBAL, "the process-wide states it was loaded from"),
)
_PER_LOADER = "per train dataloader"
#: One rank's states; ``None`` for a rank whose states could not be gathered.
_RANK = Optional(
    Record(
        "a rank's states",
        optional={
            S.KEY_WORKERS: F(
                List(Optional(_WORKERS), what="one entry or None per train dataloader"),
                f"{_PER_LOADER}: its DataLoader workers' states (not in 0.2.0)",
            ),
            S.KEY_DATASET_GENERATORS: F(
                List(Optional(_OBJECTS), what="one dict of generator states or None per train dataloader"),
                f"{_PER_LOADER} read in the main process: its dataset's own generators' states (not in 0.2.0)",
            ),
            S.KEY_LAST_BATCH: F(
                Optional(_LAST_BATCH),
                "the batch check: the last batch trained and the states it was loaded from; the data positions are"
                " then those before it (a resumed run loads it again, compares it and drops it)",
            ),
        },
        rng=F(_GLOBAL, "the live process-wide random states when saved"),
        passes=F(
            List(Optional(_PASS), what="one pass record or None per train dataloader"),
            f"{_PER_LOADER}: the states its current pass drew its order from",
        ),
        generators=F(
            List(Optional(_OBJECTS), what="one dict of generator states or None per train dataloader"),
            f"{_PER_LOADER}: the live states of the generators its sampler and loader own",
        ),
        dataset_states=F(
            List(Optional(AnyDict()), what="one dataset state or None per train dataloader"),
            f"{_PER_LOADER}: an iterable dataset's own state_dict(), if it has one",
        ),
        grads=F(
            Optional(DictOf(Tensor(), what="partial gradients by parameter name")),
            "the partial gradients of an unfinished accumulation group",
        ),
    )
)

#: How one world size lays an epoch out (``_planning.elastic_layout``).
_LAYOUT = Record(world_size=Int(1), drop_last=Bool(), batch_size=Int(1), batch_drop_last=Bool())
#: An epoch being finished on another world size (an elastic resume: ``_planning``).
_ELASTIC = Record(
    "an elastic epoch",
    epoch=F(Int(0), "the epoch"),
    spec=F(_GLOBAL_ORDER, "its global order"),
    dataset_length=F(Int(0), "the dataset's length"),
    record=F(Optional(_PASS), "the pass record a random order is rebuilt from"),
    phases=F(
        List(_LAYOUT.extended(consumed=Int(0)), what="the stretches of the epoch run so far"),
        "the completed stretches of the epoch, each on its world size",
    ),
    current=F(_LAYOUT.extended(batch_offset=Int(0)), "the current stretch"),
)

#: A state that records a position; ``stopped`` arrived after 0.1.0, ``hooks_after`` after 0.2.0.
STATE = Record(
    "the MidEpochResume state",
    optional={
        S.KEY_STOPPED: F(
            Bool(),
            "saved after the training loop stopped before the epoch's end (max_steps, max_time, should_stop): a"
            " resume continues that epoch (False where absent)",
        ),
        S.KEY_HOOKS_AFTER: F(
            List(Str(), what="hooks named 'Class.on_train_batch_end'"),
            "(after 0.2.0, only where one is named) the on_train_batch_end hooks that ran after the checkpoint in"
            " its batch: a resume does not run them",
        ),
    },
    fields={
        S.KEY_VERSION: F(Int(1), f"the state's version ({S.STATE_VERSION}); older states are migrated when loaded"),
        S.KEY_PACKAGE_VERSION: F(Str(), "the lightning-midepoch that wrote it"),
        S.KEY_LIGHTNING_VERSION: F(Str(), "the Lightning that wrote it"),
        S.KEY_TORCH_VERSION: F(Str(), "the torch that wrote it"),
        S.KEY_EPOCH: F(Int(0), "trainer.current_epoch when saved"),
        S.KEY_FETCHED: F(Int(0), "how many batches of the epoch the train fetcher had handed to the loop"),
        S.KEY_WORLD_SIZE: F(Int(1), "the number of processes"),
        S.KEY_MODE: F(Str(), "the CombinedLoader mode of the train loaders"),
        S.KEY_ELASTIC: F(Optional(_ELASTIC), "an epoch being finished on another number of devices, or None"),
        S.KEY_LOADERS: F(
            List(_LOADER, what="one dict of facts per train dataloader"),
            f"{_PER_LOADER}: the facts that must match on resume",
        ),
        S.KEY_RANKS: F(
            List(_RANK, what="one entry per rank"),
            "per process (by global rank): its random states, its loaders' passes and partial gradients; None for"
            " a rank whose states could not be gathered",
        ),
    },
)
#: Parts of the state that recur, written out once each by :func:`layout` (and named where they recur).
_PARTS: dict[str, Spec] = {
    "random states": _GLOBAL,
    "changed random states": _GLOBAL_CHANGED,
    "generator states": _OBJECTS,
    "pass record": _PASS,
    "order spec": _GLOBAL_ORDER,
}
#: The keys of a state written before the trainer trained with the callback (``_state.empty_state``).
EMPTY_KEYS = {S.KEY_VERSION, S.KEY_LOADERS, S.KEY_RANKS, S.KEY_STOPPED}


# ---------------------------------------------------------------------------------------------- written out
def _inner(spec: Spec) -> Iterator[tuple[str, Spec, bool]]:
    """The fields under a spec: ``(label, spec, optional)``, through lists, dicts and ``None``-or."""
    spec, _ = _unwrapped(spec)
    if isinstance(spec, Optional):
        yield from _inner(spec.spec)
    elif isinstance(spec, List):
        yield ("[i]", spec.item, False)
    elif isinstance(spec, DictOf):
        yield ("[name]", spec.value, False)
    elif isinstance(spec, Record):
        for key, field in spec.fields.items():
            yield key, field, False
        for key, field in spec.optional.items():
            yield key, field, True
    elif isinstance(spec, Tagged):
        for tag, record in spec.records.items():
            yield f"{spec.tag}={tag!r}", record, False


def _part(spec: Spec) -> str | None:
    """The name of the recurring part a field is (or is ``None`` or), if it is one."""
    spec, _ = _unwrapped(spec)
    spec = spec.spec if isinstance(spec, Optional) else spec
    return next((name for name, part in _PARTS.items() if part is spec), None)


def layout(spec: Spec | None = None) -> str:
    """The layout of the state (or of a part of it): one line per field, what it must be and what it holds.

    A field a state may lack is marked ``(optional)``; ``[i]`` stands for the items of a list, ``[name]`` for the
    values of a dict. A part that recurs (the random states, say) is written out once, after the rest, under its name.
    """
    lines = _fields(STATE if spec is None else spec, 0)
    if spec is None:
        for name, part in _PARTS.items():
            lines += ["", f"<{name}>:", *_fields(part, 1)]
    return "\n".join(lines)


def _fields(spec: Spec, indent: int) -> list[str]:
    lines = []
    for label, field, optional in _inner(spec):
        inner, doc = _unwrapped(field)
        part = _part(field)
        text = f"{'  ' * indent}{label} ({inner.expected}){' (optional)' if optional else ''}"
        text = f"{text}: {doc}" if doc else text
        lines.append(f"{text} (see <{part}>)" if part else text)
        if not part:
            lines += _fields(field, indent + 1)
    return lines


def markdown_table() -> str:
    """The table of the state's top-level fields on the API page (``docs/api.md``)."""
    rows = ["| Key | Type | Holds |", "|---|---|---|"]
    for label, field, optional in _inner(STATE):
        inner, doc = _unwrapped(field)
        rows.append(f"| `{label}`{' (optional)' if optional else ''} | {inner.expected} | {doc} |")
    return "\n".join(rows)
