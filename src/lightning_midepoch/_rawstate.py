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

from lightning_midepoch import _rng

_WORDS = 624  # Mersenne Twister words, in both generators
_MT_BYTES = 4 * _WORDS + 4  # numpy's mt19937_state {uint32 key[624]; int pos} / Python's {int index; uint32 state[624]}
_GAUSS_BYTES = 16  # numpy's aug_bitgen_t {..., int has_gauss; (padding); double gauss}
_PROBE_GAUSS = 0.123456789012345


def _memory(obj: Any, offset: int, size: int) -> memoryview:
    """A view of ``size`` bytes of the memory of ``obj`` (which the caller keeps alive) at ``offset``."""
    return memoryview((ctypes.c_char * size).from_address(id(obj) + offset)).cast("B")


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
            words = memoryview((ctypes.c_char * _MT_BYTES).from_address(address)).cast("B")
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
