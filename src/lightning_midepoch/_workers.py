"""Random states inside DataLoader worker processes: recorded as the workers produce batches, put back on resume.

With ``num_workers > 0`` a dataset draws its augmentation in worker processes, from the generators each worker seeds
when it starts and advances with every batch it produces. A resumed run continues them exactly when resumed worker
``w`` starts from the states original worker ``w`` had after the last batch of its own that the run consumed before
the checkpoint, and receives the batches original worker ``w`` would have received next.

* **Recording.** While the callback is attached, a train loader with workers gets a composed ``worker_init_fn``
  (:class:`_WorkerInit`: the user's, or Lightning's, runs first) and a wrapped ``collate_fn``
  (:class:`_RecordingCollate`). The wrapper runs in the worker once per batch, right after the user's collate
  function, and copies the worker's states (torch's, numpy's and Python's global generators, and the generators its
  dataset copy owns, searched through the objects it holds at every batch: :func:`_rng.find_dataset_generators`)
  into a ring of slots in shared memory. A slot is keyed by the pass it belongs to (a number the
  main process raises at each pass's first index, while no worker has work) and by the worker's count of batches in
  that pass. Nothing is drawn and nothing travels with the batches: a run that is never resumed draws and produces
  exactly what it does without the callback, and the main process does no work per batch.
* **Saving.** Batches go to the workers in a fixed rotation, so a checkpoint that consumed ``k`` batches of a pass
  that started at batch ``s`` wants from worker ``w`` its slot after ``#{s <= j < k : j % W == w}`` batches of the
  pass, or, where that is none, its latest slot before the pass (its start, or its previous pass with persistent
  workers). Each shared-memory set belongs to one DataLoader iterator, so the workers of a replaced iterator that are
  still finishing prefetched batches never write where the current ones do.
* **Resuming.** The resumed iterator's workers load those states after the init functions ran. A dataset copy that
  creates a generator on its first sample (a per-worker seeding recipe) does not hold it yet: the worker loads one
  sample (an index the original pass loaded) to have it created, then loads the states again. A new iterator hands
  its first batch to worker 0, but the first remaining batch ``k`` went to worker ``k % W``: the resumed pass first
  yields ``k % W`` tasks that only shift the rotation. Each worker knows how many it gets and answers them by
  loading its states again; their results are dropped as soon as the iterator is created, before Lightning fetches.
  They are empty index lists, which reach no code of the dataset, except for a dataset that loads whole batches
  (``__getitems__``), which is never given an empty list: it gets the pass's first batch of indices.
"""

from __future__ import annotations

import contextlib
import hashlib
import pickle
import random
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from lightning_midepoch import _compat, _rng
from lightning_midepoch import _state as S

#: Slots per worker beyond the prefetch factor: a worker runs at most ``prefetch_factor`` batches ahead of those the
#: main process received; the fetcher holds one more, a checkpoint inside a batch runs one again, one is being written.
SPARE_SLOTS = 6
#: The pass number of the slot a worker writes when it starts, before any batch.
BEFORE_BATCHES = -1
#: How long the main process waits for a worker to write a slot it needs (the workers are busy or starting).
WAIT_S = 120.0
# header fields of a slot
_SEQ, _PASS, _COUNT, _SIZE = range(4)
# fields of a worker's start record, and the value of _STARTED for a worker whose init functions raised
_SEED, _DIGEST, _STARTED, _UNRESTORED = range(4)
_FAILED = -1

#: In a worker process: the recorder of the worker's states (set by the composed ``worker_init_fn``).
_RECORDER: _WorkerRecorder | None = None


@dataclass
class _Buffers:
    """The shared memory the workers of one DataLoader iterator write their states into."""

    headers: torch.Tensor  # int64 [workers, slots, 4]: sequence number, pass, batches of the pass, bytes (-n: too big)
    data: torch.Tensor  # uint8 [workers, slots, capacity]
    # int64 [workers, 4]: the worker's seed, a digest of its states after the init functions, 1 (-1: they raised),
    # and (resumed) how many of the saved generators of its dataset copy it could not find
    starts: torch.Tensor
    passes: torch.Tensor  # int64 [1]: the number of the pass the main process is dispatching

    @classmethod
    def allocate(cls, workers: int, slots: int, capacity: int, current_pass: int) -> _Buffers:
        tensors = (
            torch.zeros(workers, slots, 4, dtype=torch.int64),
            torch.zeros(workers, slots, capacity, dtype=torch.uint8),
            torch.zeros(workers, 4, dtype=torch.int64),
            torch.full((1,), current_pass, dtype=torch.int64),
        )
        for tensor in tensors:
            tensor.share_memory_()  # type: ignore[no-untyped-call]
        return cls(*tensors)


# ---------------------------------------------------------------------------------------------- in the worker
def _raw_object_state(obj: Any) -> tuple[str, Any]:
    """A generator's state as plain values, cheaply (converted to :mod:`_rng`'s form where it is saved)."""
    if isinstance(obj, torch.Generator):
        return "torch", obj.get_state().numpy().tobytes()
    if isinstance(obj, random.Random):
        return "python", obj.getstate()
    if isinstance(obj, np.random.RandomState):
        return "numpy_legacy", obj.get_state(legacy=False)
    return "numpy", obj.bit_generator.state


def _object_from_raw(kind: str, raw: Any) -> Any:
    """A fresh generator in the state :func:`_raw_object_state` read (to capture it the way :mod:`_rng` does)."""
    if kind == "torch":
        generator = torch.Generator()
        generator.set_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
        return generator
    if kind == "python":
        rng = random.Random()
        rng.setstate(raw)
        return rng
    if kind == "numpy_legacy":
        legacy = np.random.RandomState()
        legacy.set_state(raw)
        return legacy
    numpy_generator = np.random.Generator(getattr(np.random, raw["bit_generator"])())
    numpy_generator.bit_generator.state = raw
    return numpy_generator


class _WorkerRecorder:
    """In one worker process: writes the worker's states into its ring of slots."""

    def __init__(self, worker_id: int, buffers: _Buffers, dataset: Any) -> None:
        self.buffers = buffers
        self.copy = dataset  # this worker's copy of the dataset
        self.objects = _generators(dataset)
        # an iterable dataset's copy in this worker keeps its own position (its state_dict())
        self.dataset = dataset if saves_position(dataset) else None
        # numpy views of this worker's part of the shared memory: writing through them costs nanoseconds per field
        self.headers = buffers.headers[worker_id].numpy()
        self.data = buffers.data[worker_id].numpy()
        self.passes = buffers.passes.numpy()
        self.slots, self.capacity = self.data.shape
        self.seq = 0
        self.current_pass, self.count = BEFORE_BATCHES, 0
        # a resumed worker whose data had run out in the interrupted pass: the states to end that pass with
        self.ended_state: Mapping[str, Any] | None = None
        # a resumed worker: the states it continues from, and how many tasks it answers first by loading them again
        # (they only shift the rotation, see LoaderWorkers.pass_started)
        self.resume_state: Mapping[str, Any] | None = None
        self.prefix = 0

    def raw(self, ended: bool = False) -> bytes:
        # the documented reads (a worker pays them once per batch, beside the work of loading it); the dataset copy
        # is searched again, so that a generator it created since (on its first sample, say) is recorded too
        self.objects = _generators(self.copy)
        torch_state = torch.default_generator.get_state().numpy().tobytes()
        global_states = (random.getstate(), np.random.get_state(legacy=False))
        objects = {path: _raw_object_state(obj) for path, obj in self.objects.items()}
        position = self.dataset.state_dict() if self.dataset is not None else None
        blob = (torch_state, global_states, objects, position, ended)
        return pickle.dumps(blob, protocol=pickle.HIGHEST_PROTOCOL)

    def load(self, state: Mapping[str, Any]) -> list[str]:
        """Put the worker in the saved states: its generators, and its dataset copy's position.

        Returns:
            The saved generators' paths that its dataset copy does not hold (yet).

        """
        self.objects = _generators(self.copy)
        _rng.restore_global(state["global"])
        missing = _rng.restore_objects(self.objects, state["objects"])
        if self.dataset is not None and state.get("dataset") is not None:
            self.dataset.load_state_dict(state["dataset"])
        return missing

    def rehearse(self, sample: Any) -> None:
        """Load one sample and drop it: a dataset copy that creates its generators on its first sample creates them.

        The states it draws from are loaded again right after (:meth:`load`). A dataset that only loads whole batches
        (``__getitems__``) is given a batch of that one sample.
        """
        if callable(getattr(self.copy, "__getitems__", None)):
            self.copy.__getitems__([sample])
        else:
            self.copy[sample]

    def write(self, blob: bytes) -> None:
        self.seq += 1
        header = self.headers[self.seq % self.slots]
        header[_SEQ] = 0  # not readable while it is written
        size = len(blob)
        if size <= self.capacity:
            self.data[self.seq % self.slots, :size] = np.frombuffer(blob, np.uint8)
        else:
            size = -size
        header[_PASS], header[_COUNT], header[_SIZE] = self.current_pass, self.count, size
        header[_SEQ] = self.seq

    def batch_done(self, ended: bool = False) -> None:
        current = int(self.passes[0])
        if current != self.current_pass:
            self.current_pass, self.count = current, 0
        self.count += 1
        self.write(self.raw(ended))


def _generators(dataset: Any) -> dict[str, Any]:
    """The generators a dataset (copy) owns, by path (see :func:`_rng.find_dataset_generators`)."""
    return _rng.find_dataset_generators(dataset) if dataset is not None else {}


class _WorkerInit:
    """A train loader's ``worker_init_fn`` while the callback is attached: the user's first, then the recording.

    On resume it carries the states each worker continues from (only while the resumed iterator starts them).
    """

    def __init__(self, user_fn: Callable[[int], Any] | None, buffers: _Buffers) -> None:
        self.user_fn = user_fn
        self.buffers = buffers
        self.payloads: list[Mapping[str, Any] | None] | None = None

    def __call__(self, worker_id: int) -> None:
        try:
            self._start(worker_id)
        except BaseException:
            # torch hands the error to the main process with the worker's first batch, as without the callback:
            # nothing waits for this worker's start
            self.buffers.starts[worker_id, _STARTED] = _FAILED
            raise

    def _start(self, worker_id: int) -> None:
        global _RECORDER
        if self.user_fn is not None:
            self.user_fn(worker_id)
        info = get_worker_info()
        recorder = _WorkerRecorder(worker_id, self.buffers, info.dataset if info is not None else None)
        blob = recorder.raw()
        # the states the init functions leave depend only on the worker's seed and id, unless one reads something
        # else (the clock, say): a resumed worker compares with what the original recorded for the same seed
        digest = int.from_bytes(hashlib.blake2b(blob, digest_size=7).digest(), "little")
        payload = self.payloads[worker_id] if self.payloads is not None and worker_id < len(self.payloads) else None
        unrestored = 0
        if payload is not None:
            state = payload["state"]
            missing = recorder.load(state)  # before the worker starts iterating its copy of the dataset
            sample = payload.get("sample")
            if missing and sample is not None and recorder.dataset is None:
                # generators the original copy created on its first sample: this copy creates them now, from the
                # states loaded, which are loaded again into everything once they exist
                # (the worker must start whatever the sample does: the generators still missing are reported)
                with contextlib.suppress(Exception):
                    recorder.rehearse(sample)
                missing = recorder.load(state)
            unrestored = len(missing)
            ended = recorder.dataset is not None and bool(state.get("ended"))
            if ended:
                recorder.ended_state = state
            recorder.resume_state, recorder.prefix = state, int(payload.get("prefix", 0))
            blob = recorder.raw(ended)
        recorder.write(blob)
        self.buffers.starts[worker_id, _SEED] = info.seed if info is not None else 0
        self.buffers.starts[worker_id, _DIGEST] = digest
        self.buffers.starts[worker_id, _UNRESTORED] = unrestored
        self.buffers.starts[worker_id, _STARTED] = 1
        _RECORDER = recorder


class _RecordingCollate:
    """A train loader's ``collate_fn`` while the callback is attached: the user's, then the worker's states.

    For an iterable dataset, a batch shorter than ``batch_size`` is the worker's last of the pass (torch's fetcher
    collates what is left when the dataset runs out): the slot says so. A resumed worker whose data had run out in the
    interrupted pass ends the resumed pass at its first batch, as the uninterrupted worker's pass had ended: it puts
    its generators and its copy's position back as they were saved, so that its next pass (persistent workers) starts
    from them, and raises ``StopIteration``, which torch's worker loop takes as the end of its iterable dataset.
    """

    def __init__(self, inner: Callable[[Any], Any], batch_size: int | None = None) -> None:
        self.inner = inner
        self.batch_size = batch_size

    def __call__(self, batch: Any) -> Any:
        recorder = _RECORDER
        if recorder is None:  # in the main process (or a worker of a loader started without the composed init)
            return self.inner(batch)
        if recorder.prefix:
            # a task that shifts the rotation of a resumed pass (its result is dropped): whatever loading it drew
            # from (a dataset that loads whole batches is given real indices) is undone
            recorder.prefix -= 1
            recorder.load(recorder.resume_state)  # type: ignore[arg-type]
            return None
        if recorder.ended_state is not None:
            state, recorder.ended_state = recorder.ended_state, None
            recorder.load(state)
            raise StopIteration
        result = self.inner(batch)
        recorder.batch_done(self.batch_size is not None and isinstance(batch, list) and len(batch) < self.batch_size)
        return result


# ---------------------------------------------------------------------------------------------- in the main process
def _decode(blob: bytes) -> dict[str, Any]:
    """A slot's states in the checkpoint's form (``{"global": ..., "objects": ...}``, weights-only safe)."""
    torch_state, (python, numpy), objects, position, ended = pickle.loads(blob)  # written by this package's workers
    global_state = {
        "torch": torch.frombuffer(bytearray(torch_state), dtype=torch.uint8),
        "numpy": _rng.numpy_state_from(numpy),
        "python": _rng.python_state_from(python),
    }
    rebuilt = {path: _object_from_raw(kind, raw) for path, (kind, raw) in objects.items()}
    state: dict[str, Any] = {"global": global_state, "objects": _rng.capture_objects(rebuilt)}
    if position is not None:
        state["dataset"] = position
    if ended:
        state["ended"] = True
    return state


def saves_position(dataset: Any) -> bool:
    """An iterable dataset that saves and restores its own position (each worker's copy has its own)."""
    return isinstance(dataset, IterableDataset) and S.is_stateful(dataset)


class _Rotated:
    """An iterable dataset's pass read in workers: each batch's worker written down, the resumed pass's rotation kept.

    The DataLoader iterator takes batches from its workers in turn, starting at worker 0, and leaves a worker out of
    the rotation once its copy of the dataset is exhausted (shards of different lengths). The worker that produced
    each batch is reported by the iterator (:func:`_compat.report_batch_workers`; without it the stock rotation is
    assumed) and appended to ``sources``, which is how a checkpoint knows each worker's share of the consumed batches.

    A resumed pass continues the uninterrupted run's rotation at worker ``first``: batches read from the workers
    before their turn wait here (a few per worker). When a worker's turn comes but the iterator went round its
    workers without it (another worker's batch arrives while one of that worker's waits), its data ran out: the
    rotation leaves it out, as the uninterrupted run did. The iterator's reset (persistent workers, next epoch) starts
    the stock rotation again.
    """

    def __init__(
        self,
        iterator: Any,
        workers: int,
        first: int | None,
        sources: bytearray,
        report: Callable[[Any, Callable[[int], None]], bool] = _compat.report_batch_workers,
    ) -> None:
        self._midepoch_iterator = iterator
        self._midepoch_workers = workers
        self._midepoch_turn = first  # the worker whose batch comes next; None: the stock rotation
        self._midepoch_sources = sources
        self._midepoch_from = 0  # the worker of the batch the iterator returned last (reported)
        self._midepoch_read = 0  # batches read from the iterator in this pass
        self._midepoch_waiting: dict[int, deque[Any]] = {}
        self._midepoch_ended: set[int] = set()  # workers whose data ran out in this pass
        # `report` asks the iterator to report each batch's worker to `arrived`; it says whether it will
        self._midepoch_reported = report(iterator, self.arrived)

    def __iter__(self) -> _Rotated:
        return self

    def __len__(self) -> int:
        return len(self._midepoch_iterator)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._midepoch_iterator, name)

    def _reset(self, *args: Any, **kwargs: Any) -> Any:
        self._midepoch_turn, self._midepoch_read = None, 0
        self._midepoch_waiting, self._midepoch_ended = {}, set()
        return self._midepoch_iterator._reset(*args, **kwargs)

    def arrived(self, worker: int) -> None:
        self._midepoch_from = worker

    def _read(self) -> tuple[int, Any]:
        batch = next(self._midepoch_iterator)
        worker = self._midepoch_from if self._midepoch_reported else self._midepoch_read % self._midepoch_workers
        self._midepoch_read += 1
        return worker, batch

    def _after(self, worker: int) -> int:
        """The worker after ``worker`` in the rotation (one whose data has not run out, if any)."""
        workers = self._midepoch_workers
        for step in range(1, workers + 1):
            candidate = (worker + step) % workers
            if candidate not in self._midepoch_ended:
                return candidate
        return (worker + 1) % workers

    def _first_waiting(self, turn: int) -> int:
        workers = self._midepoch_workers
        for step in range(workers):
            if self._midepoch_waiting.get((turn + step) % workers):
                return (turn + step) % workers
        raise StopIteration

    def __next__(self) -> Any:
        turn = self._midepoch_turn
        if turn is None:
            worker, batch = self._read()
            self._midepoch_sources.append(worker)
            return batch
        waiting = self._midepoch_waiting
        try:
            while not waiting.get(turn):
                worker, batch = self._read()
                if worker != turn and waiting.get(worker):
                    self._midepoch_ended.add(turn)
                    turn = self._after(turn)
                waiting.setdefault(worker, deque()).append(batch)
        except StopIteration:
            turn = self._first_waiting(turn)  # every worker's data ran out: the rest in the rotation's order
        self._midepoch_turn = self._after(turn)
        self._midepoch_sources.append(turn)
        return waiting[turn].popleft()


def _batches(loader: Any) -> int:
    """The batches of a pass of a map-style loader (``len``), or a number no position reaches if it has none."""
    try:
        return len(loader)
    except TypeError:
        return 2**62


def worker_batches(start: int, end: int, worker: int, workers: int) -> int:
    """How many of a pass's batches ``start <= j < end`` went to ``worker`` (batch ``j`` goes to ``j % workers``).

    Example:
        >>> [worker_batches(3, 8, w, 3) for w in range(3)]  # batches 3..7: workers 0, 1, 2, 0, 1
        [2, 2, 1]

    """
    if end <= start:
        return 0
    return (end - 1 - worker) // workers - (start - 1 - worker) // workers


class LoaderWorkers:
    """One train loader's worker recording: installed on the loader, read at checkpoints, armed on resume."""

    def __init__(self, index: int, loader: Any, observing: Callable[[], bool] = lambda: True) -> None:
        self.index = index
        self.loader = loader
        self.observing = observing  # whether the training loop is creating its iterator (its fetcher's)
        self.wait_s = WAIT_S  # how long a checkpoint waits for a worker's state (see state_dict)
        self.workers = int(loader.num_workers)
        self.slots = int(loader.prefetch_factor or 2) + SPARE_SLOTS
        probe = _WorkerRecorder.__new__(_WorkerRecorder)
        probe.copy = loader.dataset
        probe.dataset = loader.dataset if saves_position(loader.dataset) else None
        # room for generators the copies create in the workers, too (a numpy Mersenne Twister takes about 5 kB)
        self.capacity = 2 * len(probe.raw()) + 65536
        self.current_pass = 0
        self.pass_start = 0  # the pass's first batch (its consumed batches were skipped on resume)
        self.dropped = 0  # results of empty index lists to drop from the next iterator
        self.iterable = saves_position(loader.dataset)
        self.rotate_from: int | None = None  # an iterable's resumed iterator: the worker its first batch comes from
        self.next_pass_start = 0  # an iterable's next pass starts here (its resumed pass: the first batch not consumed)
        self.pass_turn = 0  # an iterable's current pass: the worker its first batch came from
        self.sources = bytearray()  # an iterable's current pass: the worker of each batch, in the order returned
        self.prefix = 0  # tasks the next pass yields first, to shift its rotation (their results are dropped)
        self.shifted = 0  # ... and those the current pass yielded
        # a dataset that loads whole batches (``__getitems__``) is given real indices to shift with: never an empty list
        self.batches_only = callable(getattr(loader.dataset, "__getitems__", None))
        self.sample: int | None = None  # an index of the current pass: a resumed worker may load it once (rehearse)
        # whether the training loop's workers were started through this recording: not where its iterator was
        # created before the callback's setup (`trainer.estimated_stepping_batches` read earlier), whose workers
        # never write a state that a checkpoint could wait for
        self.started = False
        self.buffers = _Buffers.allocate(self.workers, self.slots, self.capacity, self.current_pass)
        self.originals = (loader.worker_init_fn, loader.collate_fn)
        self.init = _WorkerInit(loader.worker_init_fn, self.buffers)
        loader.worker_init_fn = self.init
        batch_size = loader.batch_size if self.iterable and not loader.drop_last else None
        loader.collate_fn = _RecordingCollate(loader.collate_fn, batch_size)
        _compat.wrap_iterator_creation(loader, self._new_iterator)

    def detach(self) -> None:
        """Give the loader its own ``worker_init_fn`` and ``collate_fn`` back."""
        self.loader.worker_init_fn, self.loader.collate_fn = self.originals
        _compat.unwrap_iterator_creation(self.loader)

    def _new_iterator(self, create: Callable[[], Any]) -> Any:
        if not self.observing():
            return self._other_iterator(create)
        # a new iterator starts new workers: they write into memory of their own
        self.buffers = _Buffers.allocate(self.workers, self.slots, self.capacity, self.current_pass)
        self.init.buffers = self.buffers
        self.started = True
        iterator = create()
        if self.iterable:
            first, self.rotate_from = self.rotate_from, None
            return _Rotated(iterator, self.workers, first, self.sources)
        dropped, self.dropped = self.dropped, 0
        for _ in range(dropped):
            next(iterator)
        return iterator

    def _other_iterator(self, create: Callable[[], Any]) -> Any:
        """An iterator the training loop does not use (a callback peeking at ``trainer.train_dataloader``).

        Its workers start from their own states and write into memory no checkpoint reads: a checkpoint only ever
        waits for the workers of the training loop's iterator.
        """
        init = self.init
        buffers, payloads = init.buffers, init.payloads
        init.buffers, init.payloads = _Buffers.allocate(self.workers, self.slots, self.capacity, BEFORE_BATCHES), None
        try:
            return create()
        finally:
            init.buffers, init.payloads = buffers, payloads

    def pass_started(self, skip: int, first: Any = None) -> list[Any]:
        """At the first index of a pass (no worker has work then): number it; returns the tasks to yield first.

        Those shift a resumed pass's rotation: empty index lists, which reach no code of the dataset, or, for a
        dataset that loads whole batches, the pass's first batch of indices (its copy in the worker is put back in
        its states right after). ``first`` is the pass's first item (None: the pass is empty).
        """
        self.current_pass += 1
        self.buffers.passes[0] = self.current_pass
        self.pass_start = skip
        self.pass_turn = self.rotate_from or 0
        del self.sources[:]
        prefix, self.prefix = self.prefix, 0
        self.shifted = prefix
        index = first[0] if isinstance(first, list) and first else first
        if isinstance(index, int) and not isinstance(index, bool):
            self.sample = index
        if not self.batches_only:
            return [[]] * prefix
        # (a pass with nothing left is not shifted: see arm)
        return [first if first is not None else [self.sample]] * prefix

    # ------------------------------------------------------------------ saving
    def state_dict(self, consumed: int, pass_ended: bool = False, wait: bool = True) -> dict[str, Any]:
        """The states each worker continues from after ``consumed`` batches of the current pass.

        With persistent workers at a pass's end (``pass_ended``) the workers also produced the batches prefetched
        beyond the last one trained (an epoch cut short by ``limit_train_batches``, say), which the uninterrupted
        run discarded: the next pass continues from their states after those (``"after_pass"``). Without ``wait``
        (while the fit handles an exception: the workers may be gone, or never have started), or where the workers
        were not started through this recording, a state not written yet is recorded as missing at once.
        """
        self.wait_s = WAIT_S if wait and self.started else 0.0
        workers = []
        for worker in range(self.workers):
            batches = self._batches_of(worker, consumed)
            blob = self._wait_for(worker, batches)
            seed, digest, *_ = self.buffers.starts[worker].tolist()
            workers.append(
                {"state": _decode(blob) if blob is not None else None, "seed": int(seed), "init_digest": int(digest)}
            )
        state: dict[str, Any] = {"num_workers": self.workers, "workers": workers}
        if self.sample is not None:
            state["sample"] = self.sample
        if self.iterable:
            taken = consumed - self.pass_start
            last = self.sources[taken - 1] if 0 < taken <= len(self.sources) else None
            state["next_worker"] = (last + 1) % self.workers if last is not None else self.pass_turn
        sent = _compat.tasks_sent(self.loader) if pass_ended and self.loader.persistent_workers else None
        if sent is not None and not self.iterable:
            end = self.pass_start + sent - self.shifted
            if end > consumed:
                after = [
                    self._wait_for(worker, worker_batches(self.pass_start, end, worker, self.workers))
                    for worker in range(self.workers)
                ]
                state["after_pass"] = [
                    {**entry, "state": _decode(blob) if blob is not None else None}
                    for entry, blob in zip(workers, after, strict=True)
                ]
        return state

    def _batches_of(self, worker: int, consumed: int) -> int:
        """How many of its batches in the current pass ``worker`` produced for the first ``consumed`` batches."""
        if self.iterable:  # the rotation leaves out workers whose data ran out: the batches' workers are known
            return self.sources.count(worker, 0, max(consumed - self.pass_start, 0))
        return worker_batches(self.pass_start, consumed, worker, self.workers)

    def _find(self, worker: int, batches: int) -> bytes | bool | None:
        """The slot after ``batches`` batches of the current pass (0: the latest before it).

        Returns:
            Its bytes; None where the worker's states did not fit its slot or were overwritten already (not expected:
            a worker runs at most ``prefetch_factor`` batches ahead); False where the worker has not written it yet.

        """
        headers = [h for h in self.buffers.headers[worker].tolist() if h[_SEQ] > 0]
        in_pass = [h[_COUNT] for h in headers if h[_PASS] == self.current_pass]
        if batches > 0:
            matches = [h for h in headers if h[_PASS] == self.current_pass and h[_COUNT] == batches]
            later = any(count > batches for count in in_pass)
        else:
            earlier = [h for h in headers if h[_PASS] != self.current_pass]
            matches = [max(earlier)] if earlier else []
            later = bool(in_pass)
        if not matches:
            return None if later else False
        seq, _, _, size = matches[0]
        if size < 0:
            return None
        slot = seq % self.slots
        blob = self.buffers.data[worker, slot, :size].numpy().tobytes()
        return blob if int(self.buffers.headers[worker, slot, _SEQ]) == seq else False

    def _wait_for(self, worker: int, batches: int) -> bytes | None:
        deadline = time.monotonic() + self.wait_s
        while True:
            found = self._find(worker, batches)
            if found is not False:
                return found  # type: ignore[return-value]
            if time.monotonic() > deadline:
                return None
            time.sleep(0.001)

    # ------------------------------------------------------------------ resuming
    def arm(self, saved: Mapping[str, Any], skip: int, continues_pass: bool) -> str | None:
        """Make the next iterator's workers continue the saved ones; returns why not, if they cannot."""
        if saved["num_workers"] != self.workers:
            return (
                f"the checkpoint was written with num_workers={saved['num_workers']} and the loader now has"
                f" num_workers={self.workers}"
            )
        if not continues_pass and saved.get("after_pass") is not None:
            saved = {**saved, "workers": saved["after_pass"]}  # a new pass: after everything the workers produced
        if any(worker["state"] is None for worker in saved["workers"]):
            return "the checkpoint holds no states for some of its workers (they were not recorded in time)"
        # a pass with nothing left (a checkpoint after its last batch) yields no batch a rotation would route
        shift = skip % self.workers if continues_pass and skip < _batches(self.loader) else 0
        if self.iterable:
            if not continues_pass:
                return "its dataset's position at the end of an epoch is not recorded (it is read in workers)"
            self.init.payloads = list(saved["workers"])
            # written by 0.3.0 and later; before, the stock rotation was assumed
            self.rotate_from, self.next_pass_start = saved.get("next_worker", shift), skip
            return None
        if shift and self.loader.batch_sampler is None:
            return "it has no batch sampler (batch_size=None), so its resumed batches cannot go to the same workers"
        # worker w < shift answers one task first (see pass_started); a generator its copy creates on its first
        # sample is created from `sample` (see _WorkerInit)
        sample = saved.get("sample")
        self.init.payloads = [
            {**worker, "prefix": int(index < shift), "sample": sample} for index, worker in enumerate(saved["workers"])
        ]
        self.prefix = self.dropped = shift
        return None

    def resumed(self) -> tuple[str | None, list[int]]:
        """After the resumed iterator was created: stop loading states.

        Returns:
            A problem the workers found (or None), and the workers that had not started ``WAIT_S`` seconds after the
            iterator was created: they still load their states when they start (they hold them since they were
            forked), but what they find is not known before training.

        """
        payloads, self.init.payloads = self.init.payloads, None
        if payloads is None:
            return None, []
        deadline = time.monotonic() + WAIT_S
        starts = self.buffers.starts
        while not bool(starts[:, _STARTED].all()) and time.monotonic() < deadline:
            time.sleep(0.001)
        unchecked = [
            worker for worker, payload in enumerate(payloads) if payload is not None and not starts[worker, _STARTED]
        ]
        for worker, payload in enumerate(payloads):
            seed, digest, started, unrestored = starts[worker].tolist()
            if payload is not None and started == 1 and seed == payload["seed"] and digest != payload["init_digest"]:
                return (
                    f"its worker_init_fn left worker {worker} in other random states than the original worker's with"
                    " the same seed (it seeds from something other than its worker id and seed, such as the clock)"
                ), unchecked
            if payload is not None and started == 1 and unrestored:
                paths = sorted(set(payload["state"]["objects"]))
                return (
                    f"worker {worker}'s copy of its dataset holds none of {unrestored} of the generators the original"
                    f" worker's copy drew from ({', '.join(paths)}), even after loading a first sample (it creates"
                    " them later, or under other names)"
                ), unchecked
        return None, unchecked


class WorkerStates:
    """The worker recordings of one trainer's train loaders."""

    def __init__(self) -> None:
        self.loaders: dict[int, LoaderWorkers] = {}

    def attach(
        self, loaders: Sequence[Any], recorders: Sequence[Any], observing: Callable[[], bool] = lambda: True
    ) -> None:
        """Record the workers of every map-style train loader that has them (its index sampler is recorded).

        ``observing`` says whether the training loop is creating its train iterator: only that iterator's workers
        are recorded (see :meth:`LoaderWorkers._other_iterator`).
        """
        self.detach()
        for index, (loader, recorder) in enumerate(zip(loaders, recorders, strict=True)):
            if not isinstance(loader, DataLoader):  # a list of batches, a generator: nothing runs in workers
                continue
            iterable = recorder is None and S.loader_kind(loader) == S.KIND_ITERABLE and saves_position(loader.dataset)
            # (in_order=False: batches go to whichever worker is free, so a worker's share of them is not known; the
            # session warns that such a loader cannot resume exactly)
            in_order = getattr(loader, "in_order", True) is not False
            if (recorder is not None or iterable) and loader.num_workers > 0 and in_order:
                workers = LoaderWorkers(index, loader, observing)
                self.loaders[index] = workers
                if recorder is not None:
                    recorder.on_pass = workers.pass_started

    def epoch_started(self) -> None:
        """The train iterator is (re)created: a new pass of the iterable datasets read in workers."""
        for workers in self.loaders.values():
            if workers.iterable:
                workers.pass_started(workers.next_pass_start)
                workers.next_pass_start = 0

    def detach(self) -> None:
        for workers in self.loaders.values():
            workers.detach()
        self.loaders = {}

    def arm(self, index: int, saved: Mapping[str, Any] | None, skip: int, continues_pass: bool) -> str | None:
        """Make loader ``index``'s next workers continue the saved ones (see :meth:`LoaderWorkers.arm`).

        Returns:
            Why they cannot, or None.

        """
        workers = self.loaders.get(index)
        if workers is None:
            if saved is not None and saved["num_workers"] > 0:
                return f"the checkpoint was written with num_workers={saved['num_workers']} and the loader now has none"
            return None
        if saved is None:
            return (
                "the checkpoint recorded no worker states for it (it was written with num_workers=0, or by"
                " lightning-midepoch 0.2.0 or earlier)"
            )
        if _compat.workers_started(workers.loader):
            return "its persistent workers were already running before this fit resumed"
        return workers.arm(saved, skip, continues_pass)

    def resumed(self) -> dict[int, tuple[str | None, list[int]]]:
        """After the resumed iterator was created: per loader, what :meth:`LoaderWorkers.resumed` reports (if any)."""
        reports = {index: workers.resumed() for index, workers in self.loaders.items()}
        return {index: report for index, report in reports.items() if report != (None, [])}

    def state_dict(
        self, positions: Mapping[int, int], epoch_ended: bool = False, wait: bool = True
    ) -> list[dict[str, Any] | None]:
        """Per loader, its workers' states after ``positions[index]`` batches of its current pass."""
        count = max([*self.loaders, -1]) + 1
        return [
            self.loaders[index].state_dict(positions[index], epoch_ended, wait)
            if index in self.loaders and index in positions
            else None
            for index in range(count)
        ]


def persist(recorder: Any, loader: Any) -> bool:
    """Whether a new pass of this loader reuses the workers of the previous one (persistent workers)."""
    return recorder is not None and loader.num_workers > 0 and bool(loader.persistent_workers)


def saved_entry(rank_state: Mapping[str, Any] | None, index: int) -> Mapping[str, Any] | None:
    """A loader's saved worker states in a rank's state (None: none recorded)."""
    entries = rank_state.get(S.KEY_WORKERS) if rank_state is not None else None
    return entries[index] if entries is not None and index < len(entries) else None
