"""The resume checks itself: the last batch trained before a checkpoint, loaded again by the resumed run and compared.

The callback makes a resume exact by finding every random state that shapes the data and restoring it. Whatever it
cannot find (a generator at module level, one a library keeps to itself), it cannot restore, and without a check
nothing would say so. A checkpoint written after a finished batch therefore carries a fingerprint of that batch, the
last one the training loop was handed before it, taken when the checkpoint is written (the run keeps a reference to
the batch, nothing more: it fetches, draws and loads nothing that it would not without the callback). The saved data
positions of that checkpoint are those a checkpoint written inside the batch has: a resumed run starts its pass one
batch early, as it does for such a checkpoint, loads that batch again from the random states it was loaded with,
compares it with the fingerprint, drops it, and continues from the states the checkpoint was written with. A resume
costs one batch load more; a run that is never resumed, nothing but the fingerprint at each checkpoint.

What is compared: the batch's structure (dicts by key, lists, tuples, named tuples and dataclasses by field) and its
leaves. Tensors and numpy arrays by dtype, shape and a SHA-256 of their bytes; ``str`` and ``bytes`` by a SHA-256;
numbers, ``bool`` and ``None`` by value; any other object by its type's name only.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

import numpy as np
import torch

from lightning_midepoch import _rng

#: What the resumed run does when the batch it loads again differs from the checkpoint's fingerprint.
VerifyBatch = Literal["warn", "raise", "off"]
#: Leaves described one by one in a fingerprint (a batch with more is compared beyond them by its digest alone).
LEAVES = 64
#: Hex digits kept of each SHA-256: a chance collision is out of the question at 64 bits per leaf.
_HEX = 16


def fingerprint(batch: Any) -> dict[str, Any]:
    """A fingerprint of a batch: a digest of the whole and a description of each part (see the module's docstring).

    The result holds only strings and dicts, so that it survives ``torch.load(..., weights_only=True)``.

    Example:
        >>> first = fingerprint({"image": torch.ones(2, 3), "label": [1, "cat"]})
        >>> first["leaves"]["['image']"].startswith("tensor float32 [2, 3] sha256:")
        True
        >>> differences(first, fingerprint({"image": torch.ones(2, 3), "label": [1, "dog"]}))
        ["['label'][1]"]

    """
    digest = hashlib.sha256()
    leaves: dict[str, str] = {}
    for path, description in _describe(batch, ""):
        digest.update(f"{path}={description};".encode())
        if len(leaves) < LEAVES:
            leaves[path] = description
    return {"digest": digest.hexdigest()[:32], "leaves": leaves}


def differences(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """The parts of the batch (paths, ``""`` for the batch itself) whose fingerprints differ; empty if none do."""
    if saved["digest"] == now["digest"]:
        return []
    before, after = saved["leaves"], now["leaves"]
    paths = [path for path in before if before[path] != after.get(path)]
    paths += [path for path in after if path not in before]
    return paths or [f"(a part beyond the first {LEAVES})"]


def _sha(data: Any) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()[:_HEX]


def _tensor(value: torch.Tensor) -> str:
    tensor = value.detach()
    shape = list(tensor.shape)
    try:
        data = tensor.cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    except (RuntimeError, TypeError):  # a sparse, quantized or nested tensor: compared by dtype and shape only
        return f"tensor {tensor.layout} {str(tensor.dtype).removeprefix('torch.')} {shape}"
    return f"tensor {str(tensor.dtype).removeprefix('torch.')} {shape} {_sha(data)}"


def _array(value: np.ndarray[Any, Any]) -> str:
    if value.dtype.hasobject:  # its items are Python objects: their bytes are addresses
        return f"ndarray {value.dtype} {list(value.shape)}"
    return f"ndarray {value.dtype} {list(value.shape)} {_sha(np.ascontiguousarray(value).view(np.uint8))}"


def _describe(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """``(path, description)`` of every part of ``value``, containers before their items."""
    if isinstance(value, torch.Tensor):
        yield path, _tensor(value)
    elif isinstance(value, np.ndarray):
        yield path, _array(value)
    elif isinstance(value, str):
        yield path, f"str {_sha(value.encode('utf-8', 'surrogatepass'))}"
    elif isinstance(value, (bytes, bytearray)):
        yield path, f"bytes {_sha(bytes(value))}"
    elif value is None or isinstance(value, (bool, int, float, complex, np.generic)):
        yield path, f"{type(value).__name__} {value!r}"
    elif isinstance(value, Mapping):
        yield path, f"{type(value).__name__} of {len(value)}"
        for key, item in value.items():
            yield from _describe(item, f"{path}[{key!r}]")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        yield path, type(value).__name__
        for field in dataclasses.fields(value):
            yield from _describe(getattr(value, field.name), f"{path}.{field.name}")
    elif isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        yield path, type(value).__name__
        for name, item in zip(value._fields, value, strict=True):
            yield from _describe(item, f"{path}.{name}")
    elif isinstance(value, (list, tuple)):
        yield path, f"{type(value).__name__} of {len(value)}"
        for index, item in enumerate(value):
            yield from _describe(item, f"{path}[{index}]")
    else:
        yield path, f"object {type(value).__module__}.{type(value).__qualname__}"


class BatchCheck:
    """Loads the last batch trained before the checkpoint again, at the resumed run's start, and compares it.

    Armed by the resume planner (:meth:`expect`) before it starts the resumed iterator, one batch before where the
    epoch continues; the ``CombinedLoader`` override hands it the iterator as soon as it is created
    (:meth:`refetch`), before anything else fetches from it; the planner then has the ranks agree on the outcome
    (:meth:`conclude`), which every rank reaches.

    Args:
        verify: ``"warn"`` or ``"raise"`` when the batches differ (``"off"``: the batch is loaded again, not compared).
        report: Called with the message, and whether to raise, once every rank knows the outcome.
        agree: Under DDP, every rank's outcome from this rank's (True: its batch differs); the ranks call it together.

    """

    def __init__(
        self,
        verify: VerifyBatch,
        report: Callable[[str, bool], None],
        agree: Callable[[bool], list[bool]],
    ) -> None:
        self.verify = verify
        self.report = report
        self.agree = agree
        self.pending: Refetch | None = None  # the batch to load again when the resumed iterator is created
        self.differ: list[str] = []  # the parts of the batch loaded again that differ from the fingerprint
        self.where = ""  # the batch, as a message names it

    def expect(self, refetch: Refetch | None, where: str) -> None:
        """Load a batch again from the next iterator created (None: none, on a rank that saved none)."""
        self.pending, self.differ, self.where = refetch, [], where

    def refetch(self, fetch: Callable[[], Any]) -> None:
        """The resumed iterator was created: load the pending batch from it, compare it, drop it."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        with _rng.isolated_global():  # (the run continues from the states the checkpoint restored)
            pending.set_states()
            batch = fetch()
        if self.verify != "off":
            self.differ = differences(pending.fingerprint, fingerprint(batch))

    def conclude(self) -> None:
        """Every rank's outcome, then the warning or error (every rank calls this, once the check is armed)."""
        differ, self.differ = self.differ, []
        if self.verify == "off":
            return
        outcomes = self.agree(bool(differ))
        if not any(outcomes):
            return
        ranks = [rank for rank, differs in enumerate(outcomes) if differs]
        on_ranks = f" on rank(s) {', '.join(map(str, ranks))}" if len(outcomes) > 1 else ""
        parts = f" (differing: {', '.join(differ[:8])})" if differ else ""
        self.report(
            f"The last batch trained before the checkpoint, {self.where}, loaded again by the resumed run, differs from"
            f" the one the checkpoint's run trained on{on_ranks}{parts}: the resumed run is not the uninterrupted one."
            " Likely causes: random state the callback cannot reach (a generator created at module level, or kept"
            " where MidEpochResume does not look), or a dataset or transform that changed since the checkpoint (or a"
            " training step that changed its batch in place). Hold the generator on the dataset (or its transforms),"
            " or seed it from the worker's seed for each sample (see the docs' page 'Data pipelines', section 'A resume"
            " that checks itself').",
            self.verify == "raise",
        )


def outcomes_of_ranks(differs: bool, rank: int, world_size: int, strategy: Any) -> list[bool]:
    """Every rank's outcome of the batch check from this rank's (True: its batch differs), for :class:`BatchCheck`.

    Under DDP one collective through the trainer's strategy (a sum of one flag per rank), which every rank reaches at
    the resumed epoch's start; on one process, this rank's own.

    Example:
        >>> outcomes_of_ranks(True, rank=0, world_size=1, strategy=None)
        [True]

    """
    if world_size <= 1:
        return [differs]
    flags = [0] * world_size
    flags[rank] = int(differs)
    reduced = strategy.reduce(torch.tensor(flags, device=strategy.root_device), reduce_op="sum")
    return [bool(flag) for flag in reduced.tolist()]


@dataclasses.dataclass(frozen=True)
class Refetch:
    """The batch a resumed run loads again: its saved fingerprint, and how to set the states it was loaded with."""

    fingerprint: Mapping[str, Any]
    set_states: Callable[[], None]
