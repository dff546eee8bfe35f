"""Platforms the other Trainer-level tests do not reach: DataLoader workers started by ``spawn``, and the CUDA code
paths on a machine without CUDA.

* **Spawned workers.** A forked worker inherits the dataset, the collate function and the ``worker_init_fn``; a
  spawned one (macOS's and Windows's default, and a common choice beside CUDA) unpickles them, the last two being the
  callback's picklable wrappers that hold shared-memory tensors. torch shares those with its sharing strategy
  (``file_descriptor`` by default on Linux, ``file_system`` on macOS): both are run here. The runs resume mid-epoch
  and are compared bit for bit with the uninterrupted run, augmentation drawn in the workers included. Workers that
  cannot start fail the fit as they do without the callback, and nothing waits for their states (counted). (The
  uninterrupted runs fork their workers: see :func:`_resume_spawned`.)
* **CUDA on a CPU-only machine.** A checkpoint written on GPUs holds, in each rank's process-wide random states, one
  CUDA generator state (``TORCH_CUDA_STATE_BYTES`` bytes) per device. Resumed in a process that sees another number
  of devices (here: none) the callback warns before training and restores the CPU states: the CPU run stays exact.
  ``lightning-midepoch inspect`` reports such states. A CUDA state of another size is damage. The branches that need
  an initialized CUDA (capturing the states, putting them back onto as many devices) run here against a stand-in
  for ``torch`` that only :mod:`lightning_midepoch._rng` sees; the choice of NCCL's message device against a
  monkeypatched ``torch.cuda``.
"""

from __future__ import annotations

import hashlib
import json
import operator
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from harness import (
    Comparison,
    Config,
    CrashPoint,
    L,
    Model,
    assert_exact,
    checkpoint_path,
    run,
    uninterrupted,
)
from lightning_midepoch import MidEpochResumeError, _inspect, _rng, _saving
from lightning_midepoch import _workers as W
from lightning_midepoch.__main__ import main as command_line
from lightning_midepoch._schema import TORCH_CUDA_STATE_BYTES

#: the exit statuses of ``lightning-midepoch inspect``
EXACT, CAVEATS, NOT_POSSIBLE = (
    _inspect.EXIT_CODES[v] for v in (_inspect.EXACT, _inspect.CAVEATS, _inspect.NOT_POSSIBLE)
)


def _interrupt_and_resume(
    config: Config, crash: CrashPoint, tmp_path: Path, *, oracle: Config | None = None, **resume: Any
) -> Comparison:
    """``harness.interrupt_and_resume`` without its run of stock Lightning, the uninterrupted run that of ``oracle``.

    ``oracle`` (``config`` when None) may differ from ``config`` only in what cannot change a batch or a draw; the
    keyword arguments ``resume`` go to the resumed ``harness.run`` (``extra_callbacks``, say).
    """
    full = uninterrupted(oracle or config, tmp_path / "full")
    interrupted = run(config, tmp_path / "interrupted", crash=crash)
    assert interrupted.crashed, f"the run never reached {crash}"
    if crash.inside_training_step:  # that batch is not in the checkpoint; the resumed run trains it
        interrupted.model.seen.pop()
    ckpt = checkpoint_path(tmp_path / "interrupted", crash)
    return Comparison(full, interrupted, run(config, tmp_path / "resumed", ckpt_path=ckpt, seed=2, **resume))


# ---------------------------------------------------------------------------------------------- spawned workers
#: 20 samples in batches of 2 over 2 workers started by spawn, the harness's augmentation drawn in them
SPAWNED = Config(augment=True, num_workers=2, max_epochs=1, multiprocessing_context="spawn")
#: batch 4 of epoch 0: 5 batches consumed, so the first remaining one went to worker 5 % 2 = 1, not to worker 0
MID = CrashPoint("train_batch_end", epoch=0, batch=4)


@dataclass(frozen=True)
class OwnsNoGenerator(Config):
    """The harness's augmenting dataset without a generator of its own: it draws from the workers' global ones."""

    def make_loader(self, model: Model) -> DataLoader:
        loader = super().make_loader(model)
        loader.dataset.generator = None  # torch.rand(..., generator=None) draws from torch's global generator
        return loader


@pytest.fixture
def file_system_sharing() -> Iterator[None]:
    """torch's ``file_system`` sharing strategy for the test (macOS's default), the previous one restored after."""
    previous = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy("file_system")
    yield
    torch.multiprocessing.set_sharing_strategy(previous)


def _resume_spawned(config: Config, tmp_path: Path) -> None:
    """Interrupt at :data:`MID` and resume, both in spawned workers, and compare with the uninterrupted run.

    The uninterrupted run forks its workers: a spawned fit costs 5 to 8 s on two cores (each worker imports Lightning
    with the harness, for the dataset's class), a forked one a fraction of a second, and the start method changes no
    draw: torch seeds a worker from the loader's base seed and its id, and a spawned worker unpickles the dataset in
    the state a forked one inherits. The interrupted run's first batches are compared with the forked run's too.
    """
    comparison = _interrupt_and_resume(config, MID, tmp_path, oracle=replace(config, multiprocessing_context=None))
    for result in (comparison.interrupted, comparison.resumed):
        assert result.trainer.train_dataloader.multiprocessing_context.get_start_method() == "spawn"
    assert_exact(comparison)


def test_spawned_workers_resume_exactly_with_the_default_sharing_strategy(tmp_path):
    """The callback's shared-memory tensors reach spawned workers under the platform's default sharing strategy.

    The dataset owns no ``torch.Generator``: under ``file_descriptor`` (Linux's default) spawned workers cannot
    unpickle one, with or without the callback (pytorch/pytorch#146828: the state tensor its ``__reduce__`` returns
    is freed, and its descriptor closed, before the worker process starts). The next test covers such a dataset.
    """
    config = OwnsNoGenerator(augment=True, num_workers=2, max_epochs=1, multiprocessing_context="spawn")
    _resume_spawned(config, tmp_path)


def test_spawned_persistent_workers_resume_exactly_and_continue_into_the_next_epoch(file_system_sharing, tmp_path):
    """Persistent spawned workers, whose dataset copies own a ``torch.Generator`` too, exact into epoch 1.

    Under ``file_system`` (the fixture): under Linux's default ``file_descriptor`` a spawned worker cannot unpickle a
    dataset that owns a ``torch.Generator``, even without the callback (pytorch/pytorch#146828, see the test above).
    """
    _resume_spawned(replace(SPAWNED, persistent_workers=True, max_epochs=2), tmp_path)


class _FailsToUnpickle:
    """Unpickles by computing ``1 / 0``: a spawned worker given it dies before it starts (as with #146828)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return operator.truediv, (1, 0)


@dataclass(frozen=True)
class WorkersCannotStart(Config):
    """Spawned workers that die while they unpickle the dataset (a torch-only one: they die within a second or two)."""

    def make_loader(self, model: Model) -> DataLoader:
        size, generator = self.dataset_size, torch.Generator().manual_seed(0)
        x, y = torch.randn(size, 4, generator=generator), torch.randn(size, 1, generator=generator)
        dataset = TensorDataset(torch.arange(size), x, y)
        dataset.poison = _FailsToUnpickle()
        return DataLoader(dataset, batch_size=2, num_workers=2, multiprocessing_context="spawn")


def _fails_as_stock_does(config: Config, tmp_path: Path, callback: bool) -> None:
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid\(s\) .*\) exited unexpectedly"):
        run(config, tmp_path, callback=callback)


def test_workers_that_cannot_start_fail_the_fit_without_a_wait_for_them(monkeypatch, tmp_path):
    """Lightning runs the callback's ``on_exception`` before the DataLoader's error reaches the caller: the states the
    callback keeps then are read without waiting for the workers, which are dead. Counted, not timed: each look for a
    worker's state is one look, never a poll (with a wait, a missing state is looked for every millisecond)."""
    looks: list[int] = []
    waits: list[int] = []
    find, wait_for = W.LoaderWorkers._find, W.LoaderWorkers._wait_for

    def counted_find(self: W.LoaderWorkers, worker: int, batches: int) -> Any:
        looks.append(worker)
        return find(self, worker, batches)

    def counted_wait_for(self: W.LoaderWorkers, worker: int, batches: int) -> Any:
        waits.append(worker)
        return wait_for(self, worker, batches)

    monkeypatch.setattr(W.LoaderWorkers, "_find", counted_find)
    monkeypatch.setattr(W.LoaderWorkers, "_wait_for", counted_wait_for)
    monkeypatch.setattr(W, "WAIT_S", 5.0)  # (a regression fails the count; this keeps it from taking minutes)
    _fails_as_stock_does(WorkersCannotStart(), tmp_path / "stock", callback=False)
    _fails_as_stock_does(WorkersCannotStart(), tmp_path / "ours", callback=True)
    assert waits  # the states were asked for, once per worker
    assert len(looks) == len(waits)


# ---------------------------------------------------------------------------------------------- CUDA states on CPU
#: no workers; the model's dropout and hooks draw from the CPU generators; two epochs
CPU = Config(max_epochs=2)
#: a checkpoint between batches (live states), inside a batch (the batch's start states), at an epoch's start
MOMENTS = {
    "between-batches": CrashPoint("train_batch_end", epoch=0, batch=4),
    "inside-a-batch": CrashPoint("before_backward", epoch=0, batch=6),
    "epoch-start": CrashPoint("train_epoch_start", epoch=1),
}


def _visible_devices() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _rank_rng(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's process-wide random states in a checkpoint (``ranks[r]["rng"]`` of the MidEpochResume entry)."""
    return checkpoint["callbacks"]["MidEpochResume"]["ranks"][0]["rng"]


def _with_cuda_states(ckpt: Path, states: list[torch.Tensor], name: str = "cuda.ckpt") -> Path:
    """A copy of ``ckpt`` as if written on GPUs: its rank's random states hold ``states`` as the CUDA ones."""
    checkpoint = torch.load(ckpt, weights_only=True)
    if not torch.cuda.is_initialized():  # (a test before may have, where there is a GPU: pin_memory does)
        assert "cuda" not in _rank_rng(checkpoint)  # none captured where CUDA was never initialized
    _rank_rng(checkpoint)["cuda"] = states
    path = ckpt.with_name(name)
    torch.save(checkpoint, path)
    return path


class _WarningsAtFirstBatch(L.Callback):
    """How many warnings ``recorder`` (``pytest.warns``) held when the resumed run started its first batch."""

    def __init__(self, recorder: pytest.WarningsRecorder) -> None:
        self.recorder = recorder
        self.count: int | None = None

    def on_train_batch_start(self, *args: Any) -> None:
        if self.count is None:
            self.count = len(self.recorder.list)


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_cuda_states_for_devices_this_process_lacks_warn_before_training_and_the_cpu_run_stays_exact(moment, tmp_path):
    crash = MOMENTS[moment]
    full = uninterrupted(CPU, tmp_path / "full")
    interrupted = run(CPU, tmp_path / "interrupted", crash=crash)
    assert interrupted.crashed
    if crash.inside_training_step:
        interrupted.model.seen.pop()
    devices = _visible_devices()  # 0 here: the checkpoint holds one device more than this process sees
    cuda_states = [torch.zeros(TORCH_CUDA_STATE_BYTES, dtype=torch.uint8)] * (devices + 1)
    ckpt = _with_cuda_states(checkpoint_path(tmp_path / "interrupted", crash), cuda_states)
    expected = (
        f"The checkpoint holds the CUDA random states of {devices + 1} device(s) but this process sees {devices}:"
        " they are not restored"
    )
    checker = pytest.warns(UserWarning, match=re.escape(expected))
    at_first_batch = _WarningsAtFirstBatch(checker)
    with checker as recorded:
        resumed = run(CPU, tmp_path / "resumed", ckpt_path=ckpt, seed=2, extra_callbacks=[at_first_batch])
    assert at_first_batch.count is not None
    before_training = [str(warning.message) for warning in recorded.list[: at_first_batch.count]]
    assert len([message for message in before_training if expected in message]) == 1
    assert_exact(Comparison(full, interrupted, resumed))


def test_inspect_reports_the_cuda_states(tmp_path, capsys):
    crash = MOMENTS["between-batches"]
    assert run(CPU, tmp_path, crash=crash).crashed
    plain = checkpoint_path(tmp_path, crash)
    with_cuda = _with_cuda_states(plain, [torch.zeros(TORCH_CUDA_STATE_BYTES, dtype=torch.uint8)])
    inspected = subprocess.run(
        [sys.executable, "-m", "lightning_midepoch", "inspect", str(with_cuda)], capture_output=True, text=True
    )
    assert inspected.returncode in (EXACT, CAVEATS), inspected.stderr
    (rng_line,) = [line for line in inspected.stdout.splitlines() if line.startswith("RNG states:")]
    assert rng_line.split(":", 1)[1].strip() == "present for every rank (1 of 1), CUDA included"
    reports = {}
    for path in (plain, with_cuda):  # --json, in this process
        capsys.readouterr()
        assert command_line(["inspect", "--json", str(path)]) in (EXACT, CAVEATS)
        reports[path] = json.loads(capsys.readouterr().out)["rng"]
    assert reports[plain] == {"ranks_present": [0], "ranks_missing": [], "all_present": True, "cuda": False}
    assert reports[with_cuda] == {"ranks_present": [0], "ranks_missing": [], "all_present": True, "cuda": True}


def test_a_cuda_state_of_another_size_is_damage_the_resume_stops_on_before_training(tmp_path, capsys):
    crash = MOMENTS["between-batches"]
    assert run(CPU, tmp_path / "interrupted", crash=crash).crashed
    short = torch.zeros(TORCH_CUDA_STATE_BYTES // 2, dtype=torch.uint8)  # not a Philox seed and offset
    ckpt = _with_cuda_states(checkpoint_path(tmp_path / "interrupted", crash), [short])
    capsys.readouterr()
    assert command_line(["inspect", str(ckpt)]) == NOT_POSSIBLE
    assert "`ranks[0].rng.cuda[0]`" in capsys.readouterr().out
    models: list[Model] = []
    with pytest.raises(MidEpochResumeError, match=re.escape("ranks[0].rng.cuda[0]")):
        run(CPU, tmp_path / "resumed", ckpt_path=ckpt, seed=2, before_fit=lambda trainer, model: models.append(model))
    assert models[0].seen == []


# ---------------------------------------------------------------------------------------------- a stand-in CUDA
def _fake_cuda_state() -> torch.Tensor:
    """The stand-in device's generator state: a digest of torch's CPU generator state, taken at the same moment."""
    digest = hashlib.blake2b(torch.default_generator.get_state().numpy().tobytes(), digest_size=16).digest()
    return torch.frombuffer(bytearray(digest), dtype=torch.uint8)


class _TorchWithOneCudaDevice:
    """``torch`` as :mod:`lightning_midepoch._rng` sees it: CUDA built and initialized, one device, whose generator
    state mirrors the CPU generator's (so a CUDA state saved at another moment than the CPU state shows)."""

    def __init__(self) -> None:
        self.restored: list[list[torch.Tensor]] = []
        self.cuda = SimpleNamespace(
            is_available=lambda: True,
            is_initialized=lambda: True,
            device_count=lambda: 1,
            get_rng_state_all=lambda: [_fake_cuda_state()],
            set_rng_state_all=self.restored.append,
        )
        self.backends = SimpleNamespace(cuda=SimpleNamespace(is_built=lambda: True))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


class _RestoredAtFirstBatch(L.Callback):
    def __init__(self, fake: _TorchWithOneCudaDevice) -> None:
        self.fake = fake
        self.restored: list[list[torch.Tensor]] | None = None

    def on_train_batch_start(self, *args: Any) -> None:
        if self.restored is None:
            self.restored = list(self.fake.restored)


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_cuda_states_are_saved_with_the_cpu_states_and_put_back_on_as_many_devices(moment, monkeypatch, tmp_path):
    """The states of an initialized CUDA are those of the moment the CPU states are (live, a batch's start, an
    epoch's start) and go back onto as many devices before training; the CPU run stays exact."""
    fake = _TorchWithOneCudaDevice()
    monkeypatch.setattr(_rng, "torch", fake)
    crash = MOMENTS[moment]
    at_first_batch = _RestoredAtFirstBatch(fake)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        comparison = _interrupt_and_resume(CPU, crash, tmp_path, extra_callbacks=[at_first_batch])
    assert not [warning for warning in caught if "CUDA" in str(warning.message)]  # the devices match
    saved = _rank_rng(torch.load(checkpoint_path(tmp_path / "interrupted", crash), weights_only=True))
    (cuda,) = saved["cuda"]
    digest = hashlib.blake2b(saved["torch"].numpy().tobytes(), digest_size=16).digest()
    assert cuda.tolist() == list(digest)  # taken with the CPU state it was saved with
    assert at_first_batch.restored is not None
    assert [[state.tolist() for state in states] for states in at_first_batch.restored] == [[cuda.tolist()]]
    assert_exact(comparison)


@pytest.mark.parametrize(
    ("backend", "cuda", "expected"),
    [("gloo", True, "cpu"), ("mpi", True, "cpu"), ("nccl", False, "cpu"), ("nccl", True, "cuda:3")],
)
def test_the_device_messages_between_ranks_lie_on(backend, cuda, expected, monkeypatch):
    """gloo and MPI move CPU tensors, NCCL CUDA tensors only (a 2-rank gloo gather runs in test_distributed)."""
    monkeypatch.setattr(torch.distributed, "get_backend", lambda *args: backend)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert _saving._message_device() == torch.device(expected)
