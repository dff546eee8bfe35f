"""Snapshots of numpy's and Python's process-wide generators, cheap enough to take at every batch.

A checkpoint written inside a batch makes Lightning run that batch again, so the resumed run must start it from the
states it started with. Reading numpy's and Python's states the documented way at every batch costs far too much:
``np.random.get_state()`` copies its 624 words one numpy scalar at a time (tens of microseconds) and
``random.getstate()`` builds 625 int objects (several microseconds), against about one microsecond for torch's. Both
generators keep their state in one fixed block of memory, so a snapshot here copies those bytes into a buffer kept
for the purpose (a few hundred nanoseconds, no allocation) and decodes them only when a checkpoint needs them.

Where the bytes lie is not documented, so it is found and checked on a private probe of the same type when a
:class:`BatchStartStates` is created, by comparing with the documented reads (numpy's bit-generator block through its
public ``ctypes.state_address``; the ``has_gauss``/``gauss`` cache and Python's words inside the objects, never past
their ``__basicsize__``). Anything unexpected (another interpreter, a changed layout, a global numpy bit generator
other than MT19937) falls back to the documented reads: slower, and exact all the same.
"""

from __future__ import annotations

import ctypes
import random
import struct
from typing import Any

import numpy as np
import torch

from lightning_midepoch import _rng

_WORDS = 624  # Mersenne Twister words, in both generators
_MT_BYTES = 4 * _WORDS + 4  # numpy's mt19937_state {uint32 key[624]; int pos} / Python's {int index; uint32 state[624]}
_GAUSS_BYTES = 16  # numpy's aug_bitgen_t {..., int has_gauss; (padding); double gauss}
_PROBE_GAUSS = 0.123456789012345


def _memory(obj: Any, offset: int, size: int) -> memoryview:
    """A view of ``size`` bytes of the memory of ``obj`` (which the caller keeps alive) at ``offset``."""
    return _memory_at(id(obj) + offset, size)


def _memory_at(address: int, size: int) -> memoryview:
    """A view of ``size`` bytes of this process's memory at ``address`` (which the caller keeps alive)."""
    return memoryview((ctypes.c_char * size).from_address(address)).cast("B")


def _unique(raw: bytes, needle: bytes) -> int:
    at = raw.find(needle)
    return at if at >= 0 and raw.find(needle, at + 1) < 0 else -1


def _python_index_offset() -> int | None:
    """Where a ``random.Random``'s position and words lie inside the object, checked on two probes; else None."""
    try:
        offsets = set()
        for seed, draws in ((12345, 7), (54321, 700)):
            probe = random.Random(seed)
            for _ in range(draws):
                probe.random()
            internal = probe.getstate()[1]
            raw = ctypes.string_at(id(probe), type(probe).__basicsize__)
            at = _unique(raw, struct.pack(f"={_WORDS}I", *internal[:_WORDS]))
            if at < 4 or struct.unpack_from("=i", raw, at - 4)[0] != internal[_WORDS]:
                return None
            offsets.add(at - 4)
        (offset,) = offsets
        return offset if offset + _MT_BYTES <= type(random._inst).__basicsize__ else None
    except Exception:  # pragma: no cover - another interpreter: the documented read
        return None


def _numpy_gauss_offset() -> int | None:
    """Where a legacy ``RandomState`` keeps its cached gaussian flag and value, checked on two probes; else None."""
    try:
        offsets = set()
        for has_gauss, gauss in ((1, _PROBE_GAUSS), (0, -_PROBE_GAUSS / 3)):
            probe = np.random.RandomState(0)
            state: Any = probe.get_state(legacy=True)
            probe.set_state((*state[:3], has_gauss, gauss))
            raw = ctypes.string_at(id(probe), type(probe).__basicsize__)
            at = _unique(raw, struct.pack("=d", gauss))
            if at < 8 or struct.unpack_from("=i", raw, at - 8)[0] != has_gauss:
                return None
            offsets.add(at - 8)
        (offset,) = offsets
        return offset if offset + _GAUSS_BYTES <= type(np.random.mtrand._rand).__basicsize__ else None
    except Exception:  # pragma: no cover - another numpy: the documented read
        return None


class BatchStartStates:
    """numpy's and Python's process-wide states at the latest :meth:`take`, taken cheaply and decoded on demand.

    Example:
        >>> states = BatchStartStates()
        >>> states.take()
        >>> expected = (np.random.rand(), random.random())
        >>> _rng.restore_global(states.states())
        >>> (np.random.rand(), random.random()) == expected
        True

    """

    def __init__(self) -> None:
        self._python_offset = _python_index_offset()
        self._gauss_offset = _numpy_gauss_offset()
        self._python = memoryview(bytearray(_MT_BYTES))
        self._gauss_next: float | None = None
        self._numpy = memoryview(bytearray(_MT_BYTES))
        self._numpy_gauss = memoryview(bytearray(_GAUSS_BYTES))
        self._python_source: memoryview | None = None
        if self._python_offset is not None:
            self._python_source = _memory(random._inst, self._python_offset, _MT_BYTES)
        self._bit_generator: Any = None  # numpy's global bit generator the views below read (kept alive here)
        self._numpy_sources: tuple[memoryview, memoryview] | None = None  # its words, and the gaussian cache
        self._slow: dict[str, Any] = {}  # states read the documented way where the fast way does not apply
        self.fast = self._python_source is not None and self._gauss_offset is not None
        self.taken = False

    def _follow_numpy(self) -> tuple[memoryview, memoryview] | None:
        """The views of the current global bit generator's bytes; None where it is not a Mersenne Twister."""
        rand = np.random.mtrand._rand
        bit_generator = rand._bit_generator
        if bit_generator is self._bit_generator:
            return self._numpy_sources
        self._bit_generator = bit_generator
        self._numpy_sources = None
        if self._gauss_offset is not None and isinstance(bit_generator, np.random.MT19937):
            address = bit_generator.ctypes.state_address
            words = _memory_at(address, _MT_BYTES)
            self._numpy_sources = (words, _memory(rand, self._gauss_offset, _GAUSS_BYTES))
        return self._numpy_sources

    def take(self) -> None:
        """Copy the states as they are now (called at every batch start)."""
        self.taken = True
        self._slow.clear()
        if self._python_source is not None:
            self._python[:] = self._python_source
            self._gauss_next = random._inst.gauss_next  # type: ignore[attr-defined]
        else:  # pragma: no cover - another interpreter
            self._slow["python"] = _rng._python_state()
        sources = self._follow_numpy()
        if sources is not None:
            self._numpy[:], self._numpy_gauss[:] = sources
        else:
            self._slow["numpy"] = _rng._numpy_global_state()

    def states(self) -> dict[str, Any]:
        """The states of the latest :meth:`take` in :func:`lightning_midepoch._rng.capture_global`'s form."""
        return decode(self.raw())

    def raw(self) -> tuple[Any, ...]:
        """The latest :meth:`take` as plain bytes, floats and dicts, for :func:`decode` (in this or another process).

        A DataLoader worker sends its states this way: copying them costs about as little as taking them.
        """
        return (bytes(self._python), self._gauss_next, bytes(self._numpy), bytes(self._numpy_gauss), dict(self._slow))


def decode(raw: tuple[Any, ...]) -> dict[str, Any]:
    """The states a :meth:`BatchStartStates.raw` holds, in :func:`lightning_midepoch._rng.capture_global`'s form."""
    python, gauss_next, numpy_words, numpy_gauss, slow = raw
    result = dict(slow)
    if "python" not in result:
        words = np.frombuffer(python, dtype=np.uint32)
        internal = (*words[1:].tolist(), int(np.frombuffer(python, dtype=np.int32)[0]))
        result["python"] = {
            "version": random.Random.VERSION,
            "state": _rng._pack_words(internal),
            "gauss_next": gauss_next,
        }
    if "numpy" not in result:
        has_gauss, gauss = struct.unpack_from("=i4xd", numpy_gauss)
        result["numpy"] = {
            "name": "MT19937",
            "keys": _rng._pack_words(np.frombuffer(numpy_words, dtype=np.uint32)[:_WORDS]),
            "pos": int(np.frombuffer(numpy_words, dtype=np.int32)[_WORDS]),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(gauss),
        }
    return result


# torch's CPU generator. ``Generator.get_state()`` allocates a 5,056-byte tensor and serializes the engine into it
# (the legacy layout below): inside a training loop, with cold caches, that costs several microseconds per batch and
# pushes the step's own data out of the cache. The engine's state lies in one block of the generator's C++ object
# (``CPUGeneratorImpl``: the Mersenne Twister's seed, position and words, then the cached normal samples), which the
# Python object points to; it is found on a probe generator, read safely through /proc/self/mem first, and checked
# field by field against ``get_state()`` (also with each cached normal sample set through ``set_state``).

_TORCH_STATE_BYTES = 5056  # CPUGeneratorImplState: the legacy THGeneratorState, then the float normal cache
_TORCH_HEADER = struct.Struct("=QiiQ")  # the_initial_seed, left, seeded, next
_TORCH_WORDS_AT = _TORCH_HEADER.size  # uint64 state[624]
_TORCH_NORMAL = struct.Struct("=dddi")  # normal_x, normal_y (the cached double), normal_rho, normal_is_valid
_TORCH_NORMAL_AT = _TORCH_WORDS_AT + 8 * _WORDS
_TORCH_FLOAT = struct.Struct("=f?")  # next_float_normal_sample, is_next_float_normal_sample_valid
_TORCH_FLOAT_AT = _TORCH_NORMAL_AT + 32
# ... and in the engine: uint64 seed_; int left_; bool seeded_; uint32 next_; uint32 state_[624]; then
# optional<float> next_float_normal_sample_; optional<double> next_double_normal_sample_
_ENGINE_HEADER = struct.Struct("=Qi?3xI")
_ENGINE_FLOAT = struct.Struct("=f?")
_ENGINE_DOUBLE = struct.Struct("=d?")
_ENGINE_FLOAT_AT = (_ENGINE_HEADER.size + 4 * _WORDS + 7) // 8 * 8  # after the engine (its size a multiple of 8)
_ENGINE_DOUBLE_AT = (_ENGINE_FLOAT_AT + 8 + 7) // 8 * 8  # aligned to 8, after the float's value and flag
_ENGINE_BYTES = _ENGINE_DOUBLE_AT + _ENGINE_DOUBLE.size
_IMPL_SCAN = 4096  # bytes of the C++ object searched for the engine


def _torch_fields(state: bytes) -> tuple[Any, ...]:
    """What a ``get_state()`` state means (its padding bytes left out), for comparisons."""
    seed, left, seeded, next_ = _TORCH_HEADER.unpack_from(state, 0)
    _, normal_y, _, normal_valid = _TORCH_NORMAL.unpack_from(state, _TORCH_NORMAL_AT)
    float_sample, float_valid = _TORCH_FLOAT.unpack_from(state, _TORCH_FLOAT_AT)
    words = state[_TORCH_WORDS_AT:_TORCH_NORMAL_AT]
    return (
        seed,
        left,
        bool(seeded),
        next_,
        words,
        bool(normal_valid),
        normal_y if normal_valid else None,
        bool(float_valid),
        float_sample if float_valid else None,
    )


def _torch_state(engine: bytes | memoryview) -> torch.Tensor:
    """The ``get_state()`` state of the engine bytes read from a generator (see :class:`TorchBatchStart`)."""
    seed, left, seeded, next_ = _ENGINE_HEADER.unpack_from(engine, 0)
    float_sample, float_valid = _ENGINE_FLOAT.unpack_from(engine, _ENGINE_FLOAT_AT)
    double_sample, double_valid = _ENGINE_DOUBLE.unpack_from(engine, _ENGINE_DOUBLE_AT)
    state = bytearray(_TORCH_STATE_BYTES)
    _TORCH_HEADER.pack_into(state, 0, seed, left, int(seeded), next_)
    words = np.frombuffer(engine, dtype=np.uint32, count=_WORDS, offset=_ENGINE_HEADER.size)
    state[_TORCH_WORDS_AT:_TORCH_NORMAL_AT] = words.astype(np.uint64).tobytes()
    _TORCH_NORMAL.pack_into(state, _TORCH_NORMAL_AT, 0.0, double_sample if double_valid else 0.0, 0.0, double_valid)
    _TORCH_FLOAT.pack_into(state, _TORCH_FLOAT_AT, float_sample if float_valid else 0.0, float_valid)
    return torch.frombuffer(state, dtype=torch.uint8)


def _readable(address: int, size: int) -> bytes | None:
    """``size`` bytes at ``address`` of this process, or None where they cannot be read (never a crash)."""
    try:
        with open("/proc/self/mem", "rb", buffering=0) as memory:
            memory.seek(address)
            data = memory.read(size)
    except (OSError, ValueError, OverflowError):
        return None
    return data if len(data) == size else None


def _impl_address(generator: torch.Generator) -> int | None:
    """Where the C++ object of ``generator`` lies (the pointer the Python object holds after its header)."""
    if type(generator).__basicsize__ < 24:  # pragma: no cover - another torch
        return None
    address = struct.unpack("=Q", ctypes.string_at(id(generator) + 16, 8))[0]
    return address if address and address % 8 == 0 else None


def _engine_offset(generator: torch.Generator) -> int | None:
    """Where the engine lies inside ``generator``'s C++ object, found by its words and checked; else None."""
    address = _impl_address(generator)
    memory = _readable(address, _IMPL_SCAN) if address is not None else None
    if memory is None:
        return None
    state = _state_bytes(generator)
    words = np.frombuffer(state, dtype=np.uint64, count=_WORDS, offset=_TORCH_WORDS_AT).astype(np.uint32).tobytes()
    at = _unique(memory, words)
    offset = at - _ENGINE_HEADER.size
    if at < 0 or offset < 0 or offset + _ENGINE_BYTES > _IMPL_SCAN:
        return None
    return offset


def _engine_view(generator: torch.Generator, offset: int) -> memoryview | None:
    """The live engine bytes of ``generator``, if they read as its ``get_state()``; else None."""
    address = _impl_address(generator)
    if address is None or _readable(address + offset, _ENGINE_BYTES) is None:
        return None
    view = _memory_at(address + offset, _ENGINE_BYTES)
    return view if _torch_fields(bytes(_torch_state(view).numpy())) == _torch_fields(_state_bytes(generator)) else None


def _state_bytes(generator: torch.Generator) -> bytes:
    return bytes(generator.get_state().numpy())


def _torch_engine_offset() -> int | None:
    """The engine's offset in a CPU generator's C++ object, checked on probes in every state it can be in."""
    try:
        probe = torch.Generator()
        probe.manual_seed(20260401)
        torch.rand(5, generator=probe)
        offset = _engine_offset(probe)
        if offset is None:
            return None
        # every field, with and without each cached normal sample (set through set_state: a real state)
        base = bytearray(_state_bytes(probe))
        for normal_valid, float_valid in ((1, 0), (0, 1), (1, 1), (0, 0)):
            _TORCH_NORMAL.pack_into(
                base, _TORCH_NORMAL_AT, 0.0, _PROBE_GAUSS if normal_valid else 0.0, 0.0, normal_valid
            )
            _TORCH_FLOAT.pack_into(base, _TORCH_FLOAT_AT, -0.25 if float_valid else 0.0, bool(float_valid))
            probe.set_state(torch.frombuffer(bytearray(base), dtype=torch.uint8))
            if _engine_view(probe, offset) is None:
                return None
        for _ in range(3):  # positions across a regeneration of the words
            torch.rand(400, generator=probe)
            if _engine_view(probe, offset) is None:
                return None
        return offset
    except Exception:  # pragma: no cover - another torch: the documented read
        return None


class TorchBatchStart:
    """torch's process-wide states at the latest :meth:`take` (CPU, and CUDA when initialized), taken cheaply.

    The CPU generator's engine is copied as raw bytes into a buffer kept for the purpose (no allocation) and turned
    into a ``get_state()`` state only when a checkpoint needs it. Where its bytes cannot be found and checked (another
    torch, another platform), ``get_state()`` is read instead: slower, and exact all the same.

    Example:
        >>> states = TorchBatchStart()
        >>> states.take()
        >>> expected = torch.rand(3)
        >>> torch.set_rng_state(states.states()["torch"])
        >>> torch.equal(torch.rand(3), expected)
        True

    """

    def __init__(self) -> None:
        offset = _torch_engine_offset()
        self._source = _engine_view(torch.default_generator, offset) if offset is not None else None
        self._engine = memoryview(bytearray(_ENGINE_BYTES))
        self._slow: dict[str, Any] = {}
        self.fast = self._source is not None

    def take(self) -> None:
        """Copy the states as they are now (called at every batch start)."""
        if self._source is not None:
            self._engine[:] = self._source
        else:
            self._slow["torch"] = torch.default_generator.get_state()
        if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            self._slow["cuda"] = list(torch.cuda.get_rng_state_all())
        elif "cuda" in self._slow:
            del self._slow["cuda"]

    def states(self) -> dict[str, Any]:
        """The states of the latest :meth:`take` in :func:`lightning_midepoch._rng.capture_global`'s form."""
        if self._source is None:
            return dict(self._slow)
        return {"torch": _torch_state(bytes(self._engine)), **self._slow}
