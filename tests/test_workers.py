"""Randomness drawn inside DataLoader workers resumes exactly: batches, augmented inputs and weights, bit for bit.

The dataset (``harness.AugmentedDataset``) draws from torch's, numpy's and Python's global generators and from a
generator it owns, in every ``__getitem__``; each batch's augmented inputs are part of what the runs compare.

The larger matrix (every worker count with both worker lifetimes, every checkpoint moment, more loader settings)
carries the ``workers_matrix`` marker; ``make test-workers`` runs all of it. ``make test`` runs the unmarked cases (a
spread over the same settings) and 3 marked ones, another 3 each run: ``MIDEPOCH_WORKERS_SAMPLE=3`` keeps 3 of the
collected marked cases, chosen by ``MIDEPOCH_WORKERS_SEED`` (``tests/conftest.py``; pytest's header prints the seed,
and the same seed runs the same cases again), and deselects the others. ``make pythons`` and ``make floor`` run none.
"""

from __future__ import annotations

import copy
import io
import pickle
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import harness
from harness import (
    UNCHECKED_RELEASE,
    Comparison,
    Config,
    CountingIterable,
    CrashPoint,
    L,
    RunResult,
    assert_exact,
    checkpoint_path,
    interrupt_and_resume,
    resume_repeatedly,
    run,
    uninterrupted,
)
from lightning_midepoch import _workers as W

#: 20 samples in batches of 2: 10 batches per epoch, handed to the workers in rotation; two epochs.
AUGMENTED = Config(augment=True, num_workers=2, max_epochs=2)
#: batch 4 of epoch 0: 5 batches consumed, so the first remaining one went to worker 5 % num_workers, not worker 0
MID = CrashPoint("train_batch_end", epoch=0, batch=4)
matrix = pytest.mark.workers_matrix


def _lifetime(persistent: bool) -> str:
    return "persistent" if persistent else "fresh"


@pytest.mark.parametrize(
    ("num_workers", "persistent"),
    [
        (2, False),
        (3, True),
        pytest.param(1, False, marks=matrix),
        pytest.param(1, True, marks=matrix),
        pytest.param(2, True, marks=matrix),
        pytest.param(3, False, marks=matrix),
        pytest.param(4, False, marks=matrix),
        pytest.param(4, True, marks=matrix),
    ],
    ids=lambda value: str(value),
)
def test_mid_epoch_resume_continues_every_worker(num_workers, persistent, tmp_path):
    config = replace(AUGMENTED, num_workers=num_workers, persistent_workers=persistent)
    assert_exact(interrupt_and_resume(config, MID, tmp_path))


MOMENTS = {
    "last_batch": (CrashPoint("train_batch_end", epoch=0, batch=9), {}),
    "epoch_end": (CrashPoint("train_epoch_end", epoch=0), {}),
    "epoch_start": (CrashPoint("train_epoch_start", epoch=1), {}),
    "in_batch": (CrashPoint("before_backward", epoch=0, batch=5), {}),
    "validation": (CrashPoint("validation_end", epoch=0, batch=3), {"validation": True, "val_check_interval": 4}),
    "accumulation": (CrashPoint("after_backward", epoch=0, batch=4), {"accumulate_grad_batches": 2}),
    "model_checkpoint": (CrashPoint("model_checkpoint", step=13, every=13), {}),
    "epoch_1": (CrashPoint("train_batch_end", epoch=1, batch=6), {}),
    # the workers produced batches prefetched beyond the epoch's last one; persistent ones carry on after them
    "limited_epoch_end": (CrashPoint("train_epoch_end", epoch=0), {"limit_train_batches": 7}),
}
DEFAULT_MOMENTS = {
    ("epoch_end", True),
    ("in_batch", False),
    ("validation", True),
    ("model_checkpoint", True),
    ("limited_epoch_end", True),
}


@pytest.mark.parametrize(
    ("moment", "persistent"),
    [
        pytest.param(name, persistent, marks=() if (name, persistent) in DEFAULT_MOMENTS else matrix)
        for name in MOMENTS
        for persistent in (False, True)
    ],
    ids=lambda value: _lifetime(value) if isinstance(value, bool) else value,
)
def test_every_checkpoint_moment_continues_the_workers(moment, persistent, tmp_path):
    crash, settings = MOMENTS[moment]
    config = replace(AUGMENTED, num_workers=3, persistent_workers=persistent, **settings)
    assert_exact(interrupt_and_resume(config, crash, tmp_path))


def test_several_resumes_in_one_epoch(tmp_path):
    crashes = [CrashPoint("train_batch_end", epoch=0, batch=batch) for batch in (1, 4, 8)]
    assert_exact(resume_repeatedly(replace(AUGMENTED, persistent_workers=True), crashes, tmp_path))


@pytest.mark.parametrize(
    "settings",
    [
        {"prefetch_factor": 3, "pin_memory": True},
        pytest.param({"prefetch_factor": 1}, marks=matrix),
        {"seed_workers": True},
        {"worker_init": "seeding"},
        pytest.param({"worker_init": "seeding", "persistent_workers": True, "seed_workers": True}, marks=matrix),
    ],
    ids=lambda settings: "-".join(f"{key}={value}" for key, value in settings.items()),
)
def test_loader_settings_and_worker_init_functions(settings, tmp_path):
    config = replace(AUGMENTED, num_workers=3, **settings)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*pin_memory.*")  # no accelerator on the test machine
        assert_exact(interrupt_and_resume(config, MID, tmp_path))


# ---------------------------------------------------------------------------------------------- warnings
def _resume_warnings(saved: Config, current: Config, tmp_path: Path, crash: CrashPoint = MID) -> tuple[list[str], Any]:
    assert run(saved, tmp_path / "interrupted", crash=crash).crashed
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = run(current, tmp_path / "resumed", ckpt_path=checkpoint_path(tmp_path / "interrupted", crash), seed=2)
    return [str(warning.message) for warning in caught], resumed


def test_another_number_of_workers_warns_naming_the_loader(tmp_path):
    messages, _ = _resume_warnings(AUGMENTED, replace(AUGMENTED, num_workers=3), tmp_path)
    matching = [m for m in messages if "Train dataloader 0 loads its batches in 3 worker process(es)" in m]
    assert len(matching) == 1
    assert "written with num_workers=2 and the loader now has num_workers=3" in matching[0]


def test_a_worker_init_function_seeding_from_the_clock_warns(tmp_path):
    config = replace(AUGMENTED, worker_init="clock")
    messages, _ = _resume_warnings(config, config, tmp_path)
    matching = [m for m in messages if "seeds from something other than its worker id and seed" in m]
    assert len(matching) == 1
    assert "Train dataloader 0" in matching[0]


def test_no_warning_when_the_workers_continue(tmp_path):
    messages, _ = _resume_warnings(AUGMENTED, AUGMENTED, tmp_path)
    assert not [m for m in messages if "worker process" in m]


def test_an_iterable_dataset_without_state_read_in_workers_warns_that_its_epoch_restarts(tmp_path):
    config = Config(iterable="plain", iterable_workers=2, max_epochs=1)
    messages, _ = _resume_warnings(config, config, tmp_path, CrashPoint("train_batch_end", epoch=0, batch=3))
    matching = [m for m in messages if "Train dataloader 0 iterates over an IterableDataset (CountingIterable)" in m]
    assert len(matching) == 1
    assert "restarts its iteration from the beginning" in matching[0]


# ---------------------------------------------------------------------------------------------- iterable datasets
#: a stateful IterableDataset sharded over 2 workers by worker id, augmented in them: 10 batches of 2 per epoch
ITERABLE = Config(iterable="stateful", iterable_workers=2, augment=True, max_epochs=2)


@pytest.mark.parametrize("batch", [2, 5], ids=["resumes-at-worker-1", "resumes-at-worker-0"])
def test_a_stateful_iterable_dataset_read_in_workers_continues_each_workers_position(batch, tmp_path):
    assert_exact(interrupt_and_resume(ITERABLE, CrashPoint("train_batch_end", epoch=0, batch=batch), tmp_path))


def test_a_stateful_iterable_dataset_in_persistent_workers_stays_exact_in_later_epochs(tmp_path):
    """Persistent workers keep their dataset copies and generators into the epochs after the resumed one."""
    config = replace(ITERABLE, persistent_workers=True, max_epochs=3)
    assert_exact(interrupt_and_resume(config, CrashPoint("train_batch_end", epoch=0, batch=2), tmp_path))


#: shards of different lengths over 3 workers (7, 5 and 4 samples): batches from workers 0 1 2 0 1 2 0 1 0
UNEVEN = replace(ITERABLE, iterable_workers=3, uneven_shards=True)


@pytest.mark.parametrize(
    ("batch", "persistent"),
    [(3, False), (7, False), (7, True)],
    ids=["before-a-worker-runs-out", "after-a-worker-ran-out", "after-a-worker-ran-out-persistent"],
)
def test_workers_running_out_of_data_one_after_another_keep_the_rotation(batch, persistent, tmp_path):
    """The DataLoader leaves a worker whose shard ran out out of its rotation: a resume does as well."""
    config = replace(UNEVEN, persistent_workers=persistent, max_epochs=3 if persistent else 2)
    assert_exact(interrupt_and_resume(config, CrashPoint("train_batch_end", epoch=0, batch=batch), tmp_path))


# ---------------------------------------------------------------------------------------------- the rotation
def _round_robin(counts: list[int], first: int) -> list[int]:
    """The workers of a pass's batches: in turn from ``first``, leaving out those whose data ran out."""
    left, order, worker = list(counts), [], first
    while any(left):
        if left[worker]:
            order.append(worker)
            left[worker] -= 1
        worker = (worker + 1) % len(left)
    return order


class _FakeIterator:
    """A DataLoader iterator over workers with ``counts`` batches each, reporting each batch's worker."""

    def __init__(self, counts: list[int]) -> None:
        self.order = iter(_round_robin(counts, 0))
        self.produced = [0] * len(counts)
        self.report: Any = None

    def __next__(self) -> tuple[int, int]:
        worker = next(self.order)
        self.produced[worker] += 1
        self.report(worker)
        return worker, self.produced[worker]


@given(
    counts=st.lists(st.integers(0, 6), min_size=1, max_size=4),
    first=st.integers(0, 3),
    reported=st.booleans(),
)
def test_a_resumed_pass_continues_the_rotation_leaving_out_exhausted_workers(counts, first, reported):
    first %= len(counts)
    if not reported:  # without the workers' ids the stock rotation is assumed: exact while no worker runs out
        counts = [max(counts)] * len(counts)
    iterator = _FakeIterator(counts)
    sources = bytearray()

    def report(iterator: _FakeIterator, arrived: Callable[[int], None]) -> bool:
        iterator.report = arrived
        return reported

    rotated = W._Rotated(iterator, len(counts), first, sources, report=report)
    batches = list(rotated)
    expected = _round_robin(counts, first)
    assert [worker for worker, _ in batches] == expected
    assert list(sources) == expected
    for worker in range(len(counts)):  # each worker's batches in its own order
        assert [n for w, n in batches if w == worker] == list(range(1, counts[worker] + 1))


# ---------------------------------------------------------------------------------------------- the user's loader
class _CopiesTheLoader(L.Callback):
    """Pickles and deep-copies the train loader in the middle of the fit (a user's datamodule might)."""

    def __init__(self) -> None:
        self.copies: list[Any] = []
        self.reached: list[str] = []  # what of the fit a pickled copy carries (stock's carries none of it)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == 3:
            loader = trainer.train_dataloader
            self.copies = [pickle.loads(pickle.dumps(loader)), copy.deepcopy(loader)]
            reached = self.reached

            class Finder(pickle.Pickler):
                def persistent_id(self, obj: Any) -> None:
                    if isinstance(obj, (L.Trainer, L.LightningModule, L.Callback)):
                        reached.append(type(obj).__name__)

            Finder(io.BytesIO()).dump(loader)


def _generators_pickle() -> bool:
    """``torch.Generator`` is picklable from torch 2.4 (pytorch/pytorch#126271); 2.1, the lowest supported, cannot
    pickle one (`make floor`), whoever holds it."""
    try:
        pickle.dumps(torch.Generator())
    except TypeError:
        return False
    return True


# the augmented dataset holds a torch.Generator: a copy of the user's own loader pickles it
@pytest.mark.skipif(not _generators_pickle(), reason=f"torch {torch.__version__} cannot pickle a torch.Generator")
def test_the_loader_can_be_copied_during_fit_and_is_the_users_own_again_after(tmp_path):
    copier = _CopiesTheLoader()
    config = replace(AUGMENTED, max_epochs=1)
    result = run(config, tmp_path, extra_callbacks=[copier])
    assert len(copier.copies) == 2
    assert copier.reached == []  # (a copy carrying the trainer fails to pickle on Lightning's master)
    for duplicate in copier.copies:  # a copy loads every sample, in its workers
        assert sorted(index for batch in duplicate for index in batch[0].tolist()) == list(range(config.dataset_size))
    loader, plain = result.trainer.train_dataloader, config.make_loader(result.model)
    assert "_get_iterator" not in vars(loader)
    assert loader.collate_fn is plain.collate_fn
    assert loader.worker_init_fn is None


@pytest.mark.parametrize(
    "crash",
    [CrashPoint("train_epoch_end", epoch=0), CrashPoint("train_epoch_start", epoch=1)],
    ids=["epoch-end", "next-epoch-start"],
)
def test_an_iterable_dataset_in_persistent_workers_checkpointed_after_an_epoch_warns(crash, tmp_path):
    """Its workers' copies are not recorded at a pass's end: the resume says so (fresh workers are exact)."""
    persistent = replace(ITERABLE, persistent_workers=True, max_epochs=3)
    messages, _ = _resume_warnings(persistent, persistent, tmp_path / "persistent", crash)
    expected = "Train dataloader 0 reads an IterableDataset (CountingIterable) in persistent worker processes"
    assert len([m for m in messages if expected in m]) == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert_exact(interrupt_and_resume(replace(ITERABLE, max_epochs=3), crash, tmp_path / "fresh"))
    assert not [warning for warning in caught if "worker process" in str(warning.message)]


def test_a_resumed_worker_whose_data_ran_out_ends_its_pass_at_its_first_batch_in_its_saved_states(monkeypatch):
    """Its copy is not touched by class: the recording collate ends the pass (torch's worker loop takes StopIteration
    as the end of an iterable dataset) and puts the saved states back, so the next pass starts from them."""
    dataset = CountingIterable(4, stateful=True, augment=True)
    recorder = W._WorkerRecorder(0, W._Buffers.allocate(1, 4, 1 << 16, 0), dataset)
    saved = W._decode(recorder.raw(ended=True))
    expected_next_pass = list(dataset)  # from the saved position and states
    W._rng.restore_global(saved["global"])
    dataset.load_state_dict(saved["dataset"])
    recorder.ended_state = saved
    monkeypatch.setattr(W, "_RECORDER", recorder)
    collate = W._RecordingCollate(lambda items: items)
    drawn = [next(iter(dataset))]  # the resumed pass's first batch: loaded, then ended
    with pytest.raises(StopIteration):
        collate(drawn)
    assert recorder.ended_state is None
    next_pass = list(dataset)
    assert [index for index, _, _ in next_pass] == [index for index, _, _ in expected_next_pass]
    assert all(torch.equal(a[1], b[1]) for a, b in zip(next_pass, expected_next_pass, strict=True))
    assert collate(next_pass[:2]) == next_pass[:2]  # later batches collate as usual


# ---------------------------------------------------------------------------------------------- data pipelines
@pytest.mark.parametrize(
    ("pipeline", "persistent"),
    [
        ("lazy", False),  # a generator the worker's copy creates on its first sample
        ("lazy", True),
        ("compose", False),  # a Compose-like pipeline whose steps each own a generator
        ("containers", True),  # generators in a list and in a dict
        ("batches_only", False),  # only __getitems__, refusing an empty list of indices
        ("batches_only", True),
    ],
)
def test_generators_a_pipeline_holds_or_creates_in_the_workers_continue(pipeline, persistent, tmp_path):
    """Batch 4's checkpoint: the first remaining batch went to worker 1, so the resumed pass shifts its rotation."""
    config = replace(AUGMENTED, pipeline=pipeline, persistent_workers=persistent)
    assert_exact(interrupt_and_resume(config, MID, tmp_path))


class _Peek(L.Callback):
    """A user's callback that looks at one batch of the train loader during fit (``next(iter(...))``)."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.current_epoch == 0 and batch_idx == 1:
            next(iter(trainer.train_dataloader))


def test_a_peek_at_the_train_loader_never_makes_a_checkpoint_wait_and_the_resume_is_exact(monkeypatch, tmp_path):
    """The peek's iterator has workers of its own, which no checkpoint waits for: counted, not timed."""
    unwritten: list[tuple[int, int]] = []
    find = W.LoaderWorkers._find

    def counting_find(self: W.LoaderWorkers, worker: int, batches: int) -> Any:
        found = find(self, worker, batches)
        if found is False:  # the slot a checkpoint needs is not written (yet): it would wait
            unwritten.append((worker, batches))
        return found

    monkeypatch.setattr(W.LoaderWorkers, "_find", counting_find)
    monkeypatch.setattr(W, "WAIT_S", 2.0)  # (a regression fails the count, quickly)
    config = replace(AUGMENTED, max_epochs=1)
    full = run(config, tmp_path / "full", extra_callbacks=[_Peek()])
    stock = run(config, tmp_path / "stock", callback=False, extra_callbacks=[_Peek()])
    assert full.seen == stock.seen
    interrupted = run(config, tmp_path / "interrupted", crash=MID, extra_callbacks=[_Peek()])
    assert interrupted.crashed
    assert unwritten == []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = checkpoint_path(tmp_path / "interrupted", MID)
        resumed = run(config, tmp_path / "resumed", ckpt_path=ckpt, seed=2, extra_callbacks=[_Peek()])
    about_the_resume = [w for w in caught if not str(w.message).startswith(UNCHECKED_RELEASE)]
    assert not [w for w in about_the_resume if "MidEpochResume" in str(w.message) or "resumed run" in str(w.message)]
    assert_exact(Comparison(full, interrupted, resumed))


def test_a_peek_that_restarts_the_training_pass_is_warned_and_so_is_its_resume(tmp_path):
    """With persistent workers the loader's one iterator is the training loop's: a peek restarts its pass."""
    config = replace(AUGMENTED, persistent_workers=True, max_epochs=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run(config, tmp_path / "interrupted", crash=MID, extra_callbacks=[_Peek()]).crashed
    restarted = [w for w in caught if "was iterated outside the training loop during fit" in str(w.message)]
    assert len(restarted) == 1
    messages, _ = _resume_warnings_from(config, tmp_path)
    assert [m for m in messages if "batch_idx 4 of epoch 0, loaded again by the resumed run, differs" in m]


def _resume_warnings_from(config: Config, tmp_path: Path) -> tuple[list[str], Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = checkpoint_path(tmp_path / "interrupted", MID)
        resumed = run(config, tmp_path / "resumed", ckpt_path=ckpt, seed=2)
    return [str(warning.message) for warning in caught], resumed


class _WarningsBeforeTraining(L.Callback):
    """Counts the warnings caught so far when the first training batch starts."""

    def __init__(self, caught: list[warnings.WarningMessage], text: str) -> None:
        self.caught, self.text = caught, text
        self.before: int | None = None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.before is None:
            self.before = len([w for w in self.caught if self.text in str(w.message)])


def test_out_of_order_workers_are_warned_before_training(monkeypatch, tmp_path):
    """Warned before the first batch; their states are not recorded (a worker's share of the batches is not known),
    so nothing ever waits for one (counted)."""
    looks: list[int] = []
    monkeypatch.setattr(W.LoaderWorkers, "_find", lambda self, worker, batches: looks.append(worker))
    config = replace(AUGMENTED, in_order=False, max_epochs=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        probe = _WarningsBeforeTraining(caught, "has `in_order=False`")
        run(config, tmp_path, extra_callbacks=[probe])
    assert probe.before == 1
    assert looks == []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(replace(config, in_order=True), tmp_path / "in-order")
    assert not [w for w in caught if "in_order" in str(w.message)]


#: what worker 1 does when it starts ("late": 3 s late, "fail": raise): read in each worker, the value at its fork
_WORKER_1: list[str | None] = [None]


def _worker_1_init(worker_id: int) -> None:
    if worker_id == 1 and _WORKER_1[0] == "late":
        time.sleep(3.0)
    if worker_id == 1 and _WORKER_1[0] == "fail":
        raise ValueError("worker 1 cannot start")


class _LateUntilTraining(_WarningsBeforeTraining):
    """... and makes only the workers forked before the first training batch start late."""

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        _WORKER_1[0] = None


def _resume_with_worker_1(does: str, config: Config, tmp_path: Path, **kwargs: Any) -> RunResult:
    ckpt = checkpoint_path(tmp_path / "interrupted", MID)
    _WORKER_1[0] = does
    try:
        return run(config, tmp_path / "resumed", ckpt_path=ckpt, seed=2, **kwargs)
    finally:
        _WORKER_1[0] = None


def test_a_resumed_worker_that_starts_after_the_wait_is_warned_before_training_and_still_continues(
    monkeypatch, tmp_path
):
    """Its states are loaded when it starts, but the checks of what it found cannot run before training: warned.

    Worker 1 of the resumed iterator starts 3 s late while the wait is 0.1 s (the first remaining batch of ``MID`` is
    its: training waits for it, as stock Lightning would). Before, the wait ended without a word.
    """
    monkeypatch.setitem(harness.WORKER_INITS, "worker 1", _worker_1_init)
    config = replace(AUGMENTED, worker_init="worker 1")
    full = uninterrupted(config, tmp_path / "full")
    interrupted = run(config, tmp_path / "interrupted", crash=MID)
    assert interrupted.crashed
    monkeypatch.setattr(W, "WAIT_S", 0.1)
    text = "resumed worker process(es) [1] had not started 0.1 s after"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        probe = _LateUntilTraining(caught, text)
        resumed = _resume_with_worker_1("late", config, tmp_path, extra_callbacks=[probe])
    assert probe.before == 1
    assert "Train dataloader 0's" in next(str(w.message) for w in caught if text in str(w.message))
    assert_exact(Comparison(full, interrupted, resumed))


def test_a_worker_init_function_that_raises_on_resume_raises_as_in_stock_lightning_without_a_wait(
    monkeypatch, tmp_path
):
    """The resume does not wait for the failed worker's start (it waited ``WAIT_S``, 120 s, before the error)."""
    monkeypatch.setitem(harness.WORKER_INITS, "worker 1", _worker_1_init)
    monkeypatch.setattr(W, "WAIT_S", 5.0)  # (a regression warns that worker 1 had not started)
    config = replace(AUGMENTED, worker_init="worker 1")
    assert run(config, tmp_path / "interrupted", crash=MID).crashed
    errors = []
    for callback in (True, False):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(ValueError, match="worker process 1") as error:
                _resume_with_worker_1("fail", config, tmp_path, callback=callback)
        errors.append(str(error.value).splitlines()[0])
        assert not [w for w in caught if "had not started" in str(w.message)]
    assert errors[0] == errors[1] == "Caught ValueError in DataLoader worker process 1."
