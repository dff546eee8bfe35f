"""Capture, restore and isolate random number generator states.

Everything here imports only torch (numpy and CUDA are used when present) and converts states to plain tensors,
ints, floats, strings, lists and dicts, so that they survive ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import ctypes  # only to copy the state numpy documents at BitGenerator.ctypes.state_address
import inspect
import random
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

_RNGState = dict[str, Any]

#: Attribute names looked at first for random number generators (the paths earlier releases saved come first).
_OWNER_ATTRS = ("generator", "rng", "_rng", "random_state", "_generator")
#: Attribute names followed first from a batch sampler to the sampler it wraps.
_CHILD_ATTRS = ("sampler", "batch_sampler")
#: How many links of a sampler chain are followed from a root (a DataLoader, its index sampler).
_DEPTH = 6
#: How many links from a dataset the search for its generators follows (a pipeline, its steps, what they hold).
_DATASET_DEPTH = 4
#: Lists, tuples and dicts with at most this many items are searched too (longer ones hold data).
_CONTAINER_ITEMS = 16


def _numpy_array_to_state(array: Any) -> dict[str, Any]:
    return {"ndarray": torch.from_numpy(array.astype("int64")), "dtype": str(array.dtype)}


def _state_to_numpy_array(state: Mapping[str, Any]) -> Any:
    return state["ndarray"].numpy().astype(state["dtype"])


def _encode(value: Any) -> Any:
    """Turn a (nested) numpy bit-generator state into weights-only-safe primitives."""
    if isinstance(value, np.ndarray):
        return _numpy_array_to_state(value)
    if isinstance(value, dict):
        return {key: _encode(item) for key, item in value.items()}
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"ndarray", "dtype"}:
            return _state_to_numpy_array(value)
        return {key: _decode(item) for key, item in value.items()}
    return value


def _pack_words(words: Any) -> torch.Tensor:
    """32-bit generator words (Mersenne Twister keys) stored in an int32 tensor, bit for bit."""
    return torch.from_numpy(np.asarray(words, dtype=np.uint32).view(np.int32).copy())


def _unpack_words(tensor: torch.Tensor) -> Any:
    return tensor.numpy().view(np.uint32)


def _python_state(rng: random.Random | None = None) -> dict[str, Any]:
    return python_state_from((rng or random).getstate())


def python_state_from(raw: tuple[Any, ...]) -> dict[str, Any]:
    """A ``random.getstate()`` result in the saved form."""
    version, internal, gauss_next = raw
    # 624 32-bit words and the position: all below 2**32
    return {"version": version, "state": _pack_words(internal), "gauss_next": gauss_next}


def _set_python_state(state: Mapping[str, Any], rng: random.Random | None = None) -> None:
    internal = tuple(int(word) for word in _unpack_words(state["state"]).tolist())
    (rng or random).setstate((state["version"], internal, state["gauss_next"]))


def _numpy_global_state() -> dict[str, Any]:
    return numpy_state_from(np.random.get_state(legacy=False))


def numpy_state_from(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A ``RandomState.get_state(legacy=False)`` result in the saved form.

    numpy's default MT19937 is packed into a tensor; any other bit generator made the global one
    (``np.random.set_bit_generator``) is kept in numpy's own layout (its arrays as tensors, its integers as Python
    ints, which ``weights_only`` loading accepts).

    Example:
        >>> pcg = np.random.RandomState(np.random.PCG64(3))
        >>> saved = numpy_state_from(pcg.get_state(legacy=False))
        >>> saved["name"], sorted(saved["state"]["state"])
        ('PCG64', ['inc', 'state'])

    """
    if raw["bit_generator"] != "MT19937":
        return {"name": raw["bit_generator"], "state": _encode(dict(raw))}
    return {
        "name": raw["bit_generator"],
        "keys": _pack_words(raw["state"]["key"]),
        "pos": int(raw["state"]["pos"]),
        "has_gauss": int(raw["has_gauss"]),
        "cached_gaussian": float(raw["gauss"]),
    }


def _set_numpy_global_state(state: Mapping[str, Any]) -> None:
    # (numpy >= 1.25 has these; an older one has only its MT19937 as the global generator)
    get_bit_generator = getattr(np.random, "get_bit_generator", None)
    set_bit_generator = getattr(np.random, "set_bit_generator", None)
    kind = getattr(np.random, state["name"])
    if get_bit_generator is not None and set_bit_generator is not None and type(get_bit_generator()) is not kind:
        # the global generator is made of the recorded kind again, as it was when the state was recorded
        set_bit_generator(kind())
    if state["name"] != "MT19937":
        np.random.set_state(_decode(state["state"]))
        return
    keys = _unpack_words(state["keys"])
    np.random.set_state((state["name"], keys, state["pos"], state["has_gauss"], state["cached_gaussian"]))


def capture_global(include_cuda: bool = False) -> _RNGState:
    """Return the states of the process-wide generators: torch (CPU, optionally CUDA), numpy and ``random``.

    Args:
        include_cuda: Also capture the state of every CUDA device's default generator, when CUDA is initialized.

    Example:
        >>> state = capture_global()
        >>> first = torch.rand(1)
        >>> restore_global(state)
        >>> torch.equal(first, torch.rand(1))
        True

    """
    state: _RNGState = {
        "torch": torch.default_generator.get_state(),
        "numpy": _numpy_global_state(),
        "python": _python_state(),
    }
    if include_cuda and torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore_global(state: Mapping[str, Any]) -> int | None:
    """Set the process-wide generators to a state returned by :func:`capture_global`.

    Components missing from ``state`` are left alone. CUDA states are restored only when the number of devices
    matches the number captured.

    Returns:
        None, or the number of CUDA devices this process sees when ``state`` holds CUDA states it did not restore
        (the caller says so: GPU draws then differ).

    """
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "python" in state:
        _set_python_state(state["python"])
    if "numpy" in state:
        _set_numpy_global_state(state["numpy"])
    cuda_states = state.get("cuda")
    if not cuda_states:
        return None
    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if devices != len(cuda_states):
        return devices
    torch.cuda.set_rng_state_all(cuda_states)
    return None


#: Bytes of numpy's ``mt19937_state`` struct (``uint32_t key[624]; int pos``), which ``MT19937.ctypes.state_address``
#: points at; checked against the documented ``MT19937.state`` before it is relied on (:func:`_mt19937_struct_ok`).
_MT19937_STATE_BYTES = 4 * 624 + 4


@cache
def _mt19937_struct_ok() -> bool:
    """Whether numpy's MT19937 state struct is laid out as :data:`_MT19937_STATE_BYTES` assumes (checked once)."""
    probe = np.random.MT19937(12345)
    raw = ctypes.string_at(probe.ctypes.state_address, _MT19937_STATE_BYTES)
    state = probe.state["state"]
    return bool(
        np.array_equal(np.frombuffer(raw[:-4], dtype=np.uint32), state["key"])
        and int(np.frombuffer(raw[-4:], dtype=np.int32)[0]) == int(state["pos"])
    )


def _numpy_global_mark() -> bytes | None:
    """The bytes of the global numpy generator's Mersenne Twister, a cheap test of whether it drew (None: unknown).

    numpy documents ``BitGenerator.ctypes.state_address`` (numpy >= 1.25 gives the global ``RandomState``'s bit
    generator through ``np.random.get_bit_generator()``): copying the struct there costs well under a microsecond,
    where ``np.random.get_state()`` costs tens.
    """
    get_bit_generator = getattr(np.random, "get_bit_generator", None)
    if get_bit_generator is None:  # numpy < 1.25
        return None
    bit_generator = get_bit_generator()
    if type(bit_generator) is not np.random.MT19937 or not _mt19937_struct_ok():
        return None
    return ctypes.string_at(bit_generator.ctypes.state_address, _MT19937_STATE_BYTES)


class BatchStartStates:
    """The process-wide generators' states at the latest :meth:`take` (before each fetch of a training batch).

    A checkpoint written inside a batch, or after a fetch that loaded samples in the main process, makes a resumed run
    fetch that batch again, from the states it started with. Every state is read through its documented interface:
    torch's ``get_state()`` (about a microsecond), Python's ``random.getstate()`` (several microseconds: the one read
    that costs) and numpy's ``get_state(legacy=False)`` (tens of microseconds), which is read only where it can have
    changed since the latest take: its Mersenne Twister moved (:func:`_numpy_global_mark`), or it held a cached
    gaussian, which ``np.random.randn`` and friends can use up without moving the twister.

    Example:
        >>> states = BatchStartStates()
        >>> states.take()
        >>> expected = (np.random.rand(), random.random(), torch.rand(3))
        >>> restore_global(states.states())
        >>> drawn = (np.random.rand(), random.random(), torch.rand(3))
        >>> drawn[:2] == expected[:2] and torch.equal(drawn[2], expected[2])
        True

    """

    def __init__(self) -> None:
        # a torch built without CUDA can never initialize it: then not asked at every batch
        self._cuda_built = torch.backends.cuda.is_built()  # type: ignore[no-untyped-call]
        self._torch = torch.Tensor()
        self._cuda: list[torch.Tensor] | None = None
        self._python: tuple[Any, ...] = ()
        self._numpy: dict[str, Any] = {}
        self._numpy_mark: bytes | None = None
        self.take()  # (so that states() always has states to give)
        self.taken = False  # ... but no batch has started yet

    def take(self) -> None:
        """Read the states as they are now."""
        self.taken = True
        self._torch = torch.default_generator.get_state()
        self._cuda = None
        if self._cuda_built and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            self._cuda = list(torch.cuda.get_rng_state_all())
        self._python = random.getstate()
        mark = _numpy_global_mark()
        if mark is None or mark != self._numpy_mark or not self._numpy or self._numpy["has_gauss"]:
            self._numpy = np.random.get_state(legacy=False)
            self._numpy_mark = mark

    def states(self) -> dict[str, Any]:
        """The states of the latest :meth:`take`, in :func:`capture_global`'s form."""
        states = {
            "torch": self._torch,
            "numpy": numpy_state_from(self._numpy),
            "python": python_state_from(self._python),
        }
        if self._cuda is not None:
            states["cuda"] = self._cuda
        return states


@contextmanager
def isolated_global() -> Iterator[None]:
    """Run a block without letting it change the process-wide CPU generators (torch, numpy, ``random``).

    Example:
        >>> before = torch.get_rng_state()
        >>> with isolated_global():
        ...     _ = torch.rand(3)
        >>> torch.equal(before, torch.get_rng_state())
        True

    """
    state = capture_global()
    try:
        yield
    finally:
        restore_global(state)


def after_seed_draw(state: torch.Tensor) -> torch.Tensor:
    """The torch CPU generator's state after a DataLoader iterator, created from ``state``, drew its base seed.

    Example:
        >>> before = torch.get_rng_state()
        >>> _ = iter(torch.utils.data.DataLoader(range(3)))
        >>> torch.equal(after_seed_draw(before), torch.get_rng_state())
        True

    """
    generator = torch.Generator()
    generator.set_state(state)
    torch.empty((), dtype=torch.int64).random_(generator=generator)  # as torch's _BaseDataLoaderIter draws it
    return generator.get_state()


def _is_rng_object(value: Any) -> bool:
    if isinstance(value, (torch.Generator, random.Random)):
        return True
    return isinstance(value, (np.random.Generator, np.random.RandomState))


def _attributes(obj: Any) -> dict[str, Any]:
    attrs = getattr(obj, "__dict__", None)
    return attrs if isinstance(attrs, dict) else {}


def _members(obj: Any) -> list[tuple[str, Any]]:
    """An object's attributes (the usual names first, then the others by name) and the items of its short containers.

    The order is fixed by the names alone, so that the same objects get the same paths when a run is resumed.
    """
    attrs = _attributes(obj)
    first = [name for name in (*_OWNER_ATTRS, *_CHILD_ATTRS) if name in attrs]
    members: list[tuple[str, Any]] = []
    for name in first + sorted(name for name in attrs if name not in first):
        value = attrs[name]
        members.append((name, value))
        # a few samplers or generators kept together (a sampler that chains others); long ones hold data, not those
        if _is_short(value):
            items = value.items() if isinstance(value, dict) else enumerate(value)
            members += [(f"{name}.{key}", item) for key, item in items]
    return members


def _is_short(value: Any) -> bool:
    return isinstance(value, (list, tuple, dict)) and len(value) <= _CONTAINER_ITEMS


def _is_link(name: str, value: Any) -> bool:
    """Whether the walk follows ``value``: a sampler, or an object that keeps one (a dataset made of a sampler)."""
    if value is None or _is_rng_object(value):
        return False
    if name in _CHILD_ATTRS or isinstance(value, Sampler):
        return True
    if isinstance(value, (type, Iterator)):  # a class, or a live iterator (a DataLoader's): not part of the chain
        return False
    return any(isinstance(attribute, Sampler) for attribute in _attributes(value).values())


def _is_part(name: str, value: Any) -> bool:
    """Whether the search through a dataset follows ``value``: an object of its own (a transform, a pipeline's step).

    Plain Python objects only: not data (tensors, arrays), not classes, functions, modules or live iterators.
    """
    if value is None or _is_rng_object(value) or isinstance(value, (torch.Tensor, np.ndarray)):
        return False
    if isinstance(value, (type, Iterator, types.ModuleType)) or inspect.isroutine(value):
        return False
    return bool(_attributes(value))


def _walk(
    roots: Mapping[str, Any], depth: int | None, follow: Callable[[str, Any], bool] | None = None
) -> tuple[dict[str, Any], list[str]]:
    depth = _DEPTH if depth is None else depth
    follow = _is_link if follow is None else follow
    found: dict[str, Any] = {}
    beyond: list[str] = []
    seen: set[int] = set()
    levels: dict[int, int] = {}  # the lowest level each object was visited at

    def visit(path: str, obj: Any, level: int) -> None:
        if levels.get(id(obj), depth + 1) <= level:
            return
        levels[id(obj)] = level
        members = _members(obj)
        for name, value in members:
            if _is_rng_object(value) and id(value) not in seen:
                seen.add(id(value))
                found[f"{path}.{name}"] = value
        for name, value in members:
            if not follow(name, value):
                continue
            if level == depth:
                beyond.append(f"{path}.{name}")
            else:
                visit(f"{path}.{name}", value, level + 1)

    for root_name, root in roots.items():
        visit(root_name, root, 0)
    return found, beyond


def find_rng_objects(roots: Mapping[str, Any], depth: int | None = None) -> dict[str, Any]:
    """Find the random number generator objects kept along the sampler chains of data-loading objects.

    Walks the attributes of each root and of the samplers it wraps, at any depth up to ``depth``: a batch sampler's
    ``sampler``, a wrapper's inner sampler (Lightning's ``DistributedSamplerWrapper`` keeps the user's sampler in a
    dataset it wraps), a few samplers kept in a list. The same generator reached twice is reported once, under its
    first path; paths depend only on attribute names, so they are the same when the run is resumed.

    Args:
        roots: Named objects to search, e.g. ``{"loader": dataloader, "index_sampler": batch_sampler}``.
        depth: How many links of a chain to follow (default ``_DEPTH``).

    Returns:
        A mapping from a dotted path such as ``"index_sampler.sampler.generator"`` to the generator object.

    Example:
        >>> from torch.utils.data import BatchSampler, RandomSampler
        >>> generator = torch.Generator()
        >>> batches = BatchSampler(RandomSampler(range(4), generator=generator), 2, drop_last=False)
        >>> list(find_rng_objects({"index_sampler": batches}))
        ['index_sampler.sampler.generator']

    """
    return _walk(roots, depth)[0]


def find_dataset_generators(dataset: Any, root: str = "dataset") -> dict[str, Any]:
    """Find the random number generators a dataset owns, through the objects it holds.

    Its attributes, the attributes of the objects it holds (a transform pipeline, each of the pipeline's steps), and
    the items of short lists, tuples and dicts among them, up to :data:`_DATASET_DEPTH` links from the dataset. Only
    attribute access: nothing is called. A dataset read in workers is searched in each worker at every batch, so that
    a generator its copy creates there (on its first sample, say) is found too.

    Example:
        >>> class Jitter:
        ...     def __init__(self) -> None:
        ...         self.rng = np.random.default_rng(0)
        >>> class Compose:
        ...     def __init__(self, *steps: object) -> None:
        ...         self.transforms = list(steps)
        >>> class Images(torch.utils.data.Dataset):
        ...     def __init__(self) -> None:
        ...         self.transform = Compose(Jitter(), Jitter())
        ...         self.generators = {"crop": torch.Generator()}
        >>> sorted(find_dataset_generators(Images()))
        ['dataset.generators.crop', 'dataset.transform.transforms.0.rng', 'dataset.transform.transforms.1.rng']

    """
    return _walk({root: dataset}, _DATASET_DEPTH, _is_part)[0]


def out_of_reach(roots: Mapping[str, Any], depth: int | None = None) -> list[str]:
    """The paths where :func:`find_rng_objects` stops although the chain goes on: generators beyond are not found.

    Example:
        >>> from torch.utils.data import BatchSampler, RandomSampler
        >>> out_of_reach({"index_sampler": BatchSampler(RandomSampler(range(4)), 2, drop_last=False)}, depth=0)
        ['index_sampler.sampler']

    """
    return _walk(roots, depth)[1]


def _object_state(obj: Any) -> Any:
    if isinstance(obj, torch.Generator):
        return {"kind": "torch", "state": obj.get_state()}
    if isinstance(obj, random.Random):
        return {"kind": "python", "state": _python_state(obj)}
    if isinstance(obj, np.random.RandomState):
        return {"kind": "numpy_legacy", "state": _encode(obj.get_state(legacy=False))}
    return {"kind": "numpy", "state": _encode(obj.bit_generator.state)}


def _set_object_state(obj: Any, state: Mapping[str, Any]) -> None:
    kind = state["kind"]
    if kind == "torch":
        obj.set_state(state["state"])
    elif kind == "python":
        _set_python_state(state["state"], obj)
    elif kind == "numpy_legacy":
        obj.set_state(_decode(state["state"]))
    else:
        obj.bit_generator.state = _decode(state["state"])


def capture_objects(objects: Mapping[str, Any]) -> dict[str, Any]:
    """Return the states of generator objects found by :func:`find_rng_objects`, keyed by path."""
    return {path: _object_state(obj) for path, obj in objects.items()}


def restore_objects(objects: Mapping[str, Any], states: Mapping[str, Any]) -> list[str]:
    """Set generator objects to captured states, matching them by path.

    Returns:
        The paths present in ``states`` that have no matching object now (so the caller can report them).

    """
    missing = []
    for path, state in states.items():
        obj = objects.get(path)
        if obj is None:
            missing.append(path)
            continue
        _set_object_state(obj, state)
    return missing


def changed(state: Mapping[str, Any], since: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``state`` that differ from ``since`` (states are stored once when nothing drew in between)."""
    return {key: value for key, value in state.items() if key not in since or not states_equal(value, since[key])}


def states_equal(first: Any, second: Any) -> bool:
    """Compare two captured states (nested dicts, lists and tensors) for exact equality."""
    if isinstance(first, torch.Tensor) or isinstance(second, torch.Tensor):
        return (
            isinstance(first, torch.Tensor)
            and isinstance(second, torch.Tensor)
            and first.shape == second.shape
            and torch.equal(first, second)
        )
    if isinstance(first, Mapping) and isinstance(second, Mapping):
        return first.keys() == second.keys() and all(states_equal(first[k], second[k]) for k in first)
    if isinstance(first, (list, tuple)) and isinstance(second, (list, tuple)):
        return len(first) == len(second) and all(states_equal(a, b) for a, b in zip(first, second, strict=True))
    return bool(first == second)
