"""Snapshots of the process-wide generators (torch's CPU one, numpy's, Python's), cheap enough to take at every batch.

A checkpoint written inside a batch makes Lightning run that batch again, so the resumed run must start it from the
states it started with. Reading the states the documented way at every batch costs far too much:
``np.random.get_state()`` copies its 624 words one numpy scalar at a time (tens of microseconds),
``random.getstate()`` builds 625 int objects (several microseconds) and torch's ``get_state()`` allocates a 5 KB
tensor. Each generator keeps its state in one fixed block of memory, so a snapshot here copies those bytes into a
buffer kept for the purpose (no allocation) and decodes them only when a checkpoint needs them.

A block is copied only when it changed since the latest copy. Most batches leave a generator untouched (a model
without dropout draws nothing from torch's in its step; few training loops draw from numpy's or Python's), and
copying 7.5 KB of cold memory at every batch costs more than anything else the callback does per step. Whether a
block changed is read from its position and four of its 624 words next to it (see :class:`_KeptCopy`).

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
_MTRAND: Any = np.random.mtrand  # holds numpy's global RandomState (`_rand`)


def _memory(obj: Any, offset: int, size: int) -> memoryview:
    """A view of ``size`` bytes of the memory of ``obj`` (which the caller keeps alive) at ``offset``."""
    return _memory_at(id(obj) + offset, size)


def _memory_at(address: int, size: int) -> memoryview:
    """A view of ``size`` bytes of this process's memory at ``address`` (which the caller keeps alive)."""
    return memoryview((ctypes.c_char * size).from_address(address)).cast("B")


def _unique(raw: bytes, needle: bytes) -> int:
    at = raw.find(needle)
    return at if at >= 0 and raw.find(needle, at + 1) < 0 else -1


#: How many of the Mersenne Twister's 624 words are read to tell whether its block changed. Every word changes when
#: the words are regenerated or seeded, so those next to the position are read: the same cache line or two.
_SAMPLED_WORDS = 4

Spans = list[tuple[int, int]]


def _mt_marks(position_at: int, words_at: int, first_word: int) -> Spans:
    """The spans of a Mersenne Twister's block that tell whether it changed: its position and a few of its words.

    Spans closer than a cache line are read as one (the bytes between only add to what is compared).

    >>> _mt_marks(position_at=0, words_at=4, first_word=1), _mt_marks(position_at=2496, words_at=0, first_word=0)
    ([(0, 24)], [(2496, 2500), (0, 16)])
    """
    words_from = words_at + 4 * first_word
    position, words = (position_at, position_at + 4), (words_from, words_from + 4 * _SAMPLED_WORDS)
    if max(position[0], words[0]) - min(position[1], words[1]) < 64:
        return [(min(position[0], words[0]), max(position[1], words[1]))]
    return [position, words]


class _KeptCopy:
    """Copies of blocks of memory, kept in buffers of their own and renewed only when a block changed.

    Whether one changed is read from a few spans of each (its marks): a generator's position, which moves with every
    draw, and four of its words, which stay as they are until the words are regenerated (after 624 draws) or the
    generator is seeded or set, and then all change. A regeneration or a new state that left all four words as they
    were (and the position) would go unnoticed; for the generators' own seeding and regeneration the odds are
    2^-128, far below those of a hardware fault. A batch start thus reads a few cache lines, where copying the blocks
    read and wrote 7.5 KB, cold at every batch; the marks are joined in one call, and compared as one ``bytes``.

    Example:
        >>> block = bytearray(range(20))
        >>> kept = _KeptCopy([(memoryview(block), [(0, 4)])])
        >>> kept.refresh(); block[0] = 99; kept.refresh(); kept.buffers[0][0]
        99
        >>> block[10] = 7; kept.refresh(); kept.buffers[0][10]  # not in the marks (bytes 0 to 3): not noticed
        10

    """

    __slots__ = ("buffers", "last", "marks", "sources")

    def __init__(self, blocks: list[tuple[memoryview, Spans]]) -> None:
        self.sources = [source for source, _ in blocks]
        self.buffers = [memoryview(bytearray(len(source))) for source in self.sources]
        self.marks = [source[start:end] for source, spans in blocks for start, end in spans]
        self.last: bytes | None = None  # the marks at the latest copy

    def refresh(self) -> None:
        """Copy the blocks if one changed since the latest copy."""
        now = b"".join(self.marks)
        if now != self.last:
            self.copy(now)

    def copy(self, marks: bytes) -> None:
        """Copy the blocks, whose marks (joined) are now ``marks``."""
        for buffer, source in zip(self.buffers, self.sources):
            buffer[:] = source
        self.last = marks


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
#: The engine's spans that tell whether it changed: its seed, position (left_, seeded_, next_) and first words, and
#: both cached normal samples with their flags
_ENGINE_MARKS = [(0, _ENGINE_HEADER.size + 4 * _SAMPLED_WORDS), (_ENGINE_FLOAT_AT, _ENGINE_BYTES)]
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
    """The ``get_state()`` state of the engine bytes read from a generator (see :class:`BatchStartStates`)."""
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


class BatchStartStates:
    """The process-wide generators' states at the latest :meth:`take`, taken cheaply and decoded on demand.

    numpy's and Python's; and with ``torch_cpu``, torch's CPU generator and (where initialized) CUDA's. One
    :class:`_KeptCopy` watches every block read as raw bytes, so that a batch start reads all their marks at once.

    Example:
        >>> states = BatchStartStates(torch_cpu=True)
        >>> states.take()
        >>> expected = (np.random.rand(), random.random(), torch.rand(3))
        >>> _rng.restore_global(states.states())
        >>> drawn = (np.random.rand(), random.random(), torch.rand(3))
        >>> drawn[:2] == expected[:2] and torch.equal(drawn[2], expected[2])
        True

    """

    def __init__(self, torch_cpu: bool = False) -> None:
        self._gauss_offset = _numpy_gauss_offset()
        self._gauss_next: float | None = None
        # (the module's functions are bound to this instance when it is imported)
        self._random: Any = random._inst
        self._rand: Any = _MTRAND._rand  # numpy's global RandomState (set_bit_generator replaces what it draws from)
        python_offset = _python_index_offset()
        self._python: tuple[memoryview, Spans] | None = None
        if python_offset is not None:
            # (not word 0: seeding sets it to the same value whatever the seed)
            marks = _mt_marks(position_at=0, words_at=4, first_word=1)
            self._python = (_memory(self._random, python_offset, _MT_BYTES), marks)
        self._torch = torch_cpu
        self._engine: tuple[memoryview, Spans] | None = None
        if torch_cpu:
            offset = _torch_engine_offset()
            source = _engine_view(torch.default_generator, offset) if offset is not None else None
            self._engine = (source, _ENGINE_MARKS) if source is not None else None
        # a torch built without CUDA can never initialize it: then not asked at every batch
        self._cuda = torch_cpu and torch.backends.cuda.is_built()  # type: ignore[no-untyped-call]
        self._bit_generator: Any = None  # numpy's global bit generator the copies read (kept alive here)
        self._numpy = False  # whether the copies read it (an MT19937)
        self._documented = True  # some state is read the documented way at every take (see _follow_numpy)
        self._kept = _KeptCopy([])  # every block read as raw bytes ...
        self._buffers: dict[str, memoryview] = {}  # ... and their copies, by name
        self._slow: dict[str, Any] = {}  # states read the documented way where the fast way does not apply
        self.fast = self._python is not None and self._gauss_offset is not None
        self.fast_torch = self._engine is not None
        self.taken = False

    def _follow_numpy(self) -> bool:
        """Read the current global numpy generator from now on; whether its bytes are read (an MT19937)."""
        rand = self._rand
        self._bit_generator = bit_generator = rand._bit_generator
        blocks = {name: block for name, block in (("python", self._python), ("torch", self._engine)) if block}
        self._numpy = self._gauss_offset is not None and isinstance(bit_generator, np.random.MT19937)
        self._documented = self._python is None or not self._numpy or (self._torch and self._engine is None)
        self._slow.clear()  # (what was read the documented way before may be read raw now)
        if self._numpy:
            assert self._gauss_offset is not None
            words = _memory_at(bit_generator.ctypes.state_address, _MT_BYTES)
            blocks["numpy"] = (words, _mt_marks(position_at=4 * _WORDS, words_at=0, first_word=_WORDS - _SAMPLED_WORDS))
            blocks["numpy_gauss"] = (_memory(rand, self._gauss_offset, _GAUSS_BYTES), [(0, _GAUSS_BYTES)])
        self._kept = _KeptCopy(list(blocks.values()))
        self._buffers = dict(zip(blocks, self._kept.buffers))
        return self._numpy

    def take(self) -> None:
        """Copy the states as they are now, where they changed (called at every batch start)."""
        self.taken = True
        if self._rand._bit_generator is not self._bit_generator:
            self._follow_numpy()
        kept = self._kept
        now = b"".join(kept.marks)  # (kept.refresh(), inline: this runs at every batch)
        if now != kept.last:
            kept.copy(now)
        if self._python is not None:
            self._gauss_next = self._random.gauss_next
        if self._documented or (self._cuda and torch.cuda.is_initialized()):  # type: ignore[no-untyped-call]
            self._take_documented()

    def _take_documented(self) -> None:
        """The states read the documented way: where the raw reads do not apply, and CUDA's."""
        slow = self._slow
        slow.clear()
        if self._python is None:  # pragma: no cover - another interpreter
            slow["python"] = _rng._python_state()
        if not self._numpy:
            slow["numpy"] = _rng._numpy_global_state()
        if self._torch and self._engine is None:
            slow["torch"] = torch.default_generator.get_state()
        if self._cuda and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            slow["cuda"] = list(torch.cuda.get_rng_state_all())

    def states(self) -> dict[str, Any]:
        """The states of the latest :meth:`take` in :func:`lightning_midepoch._rng.capture_global`'s form."""
        result = decode(self.raw())
        if "torch" in self._buffers:
            result["torch"] = _torch_state(bytes(self._buffers["torch"]))
        return result

    def raw(self) -> tuple[Any, ...]:
        """The latest :meth:`take` of numpy's and Python's states as plain bytes, floats and dicts, for :func:`decode`.

        A DataLoader worker sends its states this way (in this or another process): copying them costs about as
        little as taking them.
        """
        python = bytes(self._buffers["python"]) if "python" in self._buffers else b""
        numpy_words = bytes(self._buffers["numpy"]) if "numpy" in self._buffers else b""
        numpy_gauss = bytes(self._buffers["numpy_gauss"]) if "numpy_gauss" in self._buffers else bytes(_GAUSS_BYTES)
        return (python, self._gauss_next, numpy_words, numpy_gauss, dict(self._slow))


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
