"""The resume checks itself: the last batch trained is fingerprinted at a checkpoint, loaded again on resume, compared.

What is compared (every kind of part a batch is made of), where a checkpoint carries the check's entry and where it
cannot, that the check catches randomness out of the callback's reach before the resumed run trains on anything, and
that checkpoints written after every step leave the run exactly what it is without the callback
(tests/test_batch_check_untouched.py has the cases where the earlier design, which fetched the next batch at the
checkpoint, did not).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import io
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from harness import (
    Config,
    CrashPoint,
    L,
    ModelCheckpoint,
    assert_exact,
    assert_same_state,
    checkpoint_path,
    interrupt_and_resume,
    run,
)
from lightning_midepoch import MidEpochResume, MidEpochResumeError
from lightning_midepoch._batch_check import LEAVES, BatchCheck, Refetch, differences, fingerprint, outcomes_of_ranks

MID = CrashPoint("train_batch_end", epoch=0, batch=4)


# ---------------------------------------------------------------------------------------------- what is compared
@dataclasses.dataclass
class _Sample:
    image: torch.Tensor
    caption: str


_Pair = collections.namedtuple("_Pair", ["left", "right"])


def _batch() -> dict[str, Any]:
    return {
        "image": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "mask": np.array([[True, False], [False, True]]),
        "meta": [{"id": 7, "scale": 0.5, "name": "cat", "raw": b"\x00\x01", "none": None}],
        "pair": _Pair(torch.tensor([1, 2]), (3, 4.0)),
        "sample": _Sample(torch.ones(2, dtype=torch.bfloat16), "a caption"),
        "other": object(),
    }


CHANGES = {
    "['image']": lambda b: b["image"].__setitem__((0, 0), 99.0),
    "['mask']": lambda b: b["mask"].__setitem__((0, 0), False),
    "['meta'][0]['id']": lambda b: b["meta"][0].__setitem__("id", 8),
    "['meta'][0]['scale']": lambda b: b["meta"][0].__setitem__("scale", 0.25),
    "['meta'][0]['name']": lambda b: b["meta"][0].__setitem__("name", "dog"),
    "['meta'][0]['raw']": lambda b: b["meta"][0].__setitem__("raw", b"\x00\x02"),
    "['meta'][0]['none']": lambda b: b["meta"][0].__setitem__("none", 0),
    "['pair'].left": lambda b: b["pair"].left.__setitem__(0, 5),
    "['pair'].right[1]": lambda b: b.__setitem__("pair", _Pair(b["pair"].left, (3, 4.5))),
    "['sample'].image": lambda b: b["sample"].image.__setitem__(1, 2.0),
    "['sample'].caption": lambda b: setattr(b["sample"], "caption", "another"),
}


@pytest.mark.parametrize("path", list(CHANGES))
def test_a_change_anywhere_in_a_nested_batch_is_named(path):
    saved = fingerprint(_batch())
    changed = _batch()
    CHANGES[path](changed)
    assert differences(saved, fingerprint(changed)) == [path]


def test_the_same_content_is_the_same_fingerprint_however_it_is_laid_out_in_memory():
    batch = _batch()
    again = _batch()
    again["image"] = again["image"].t().contiguous().t()  # the same values, strided differently
    assert not again["image"].is_contiguous()
    assert differences(fingerprint(batch), fingerprint(again)) == []
    assert fingerprint(batch) == fingerprint(again)


def test_shape_dtype_and_structure_count_not_only_bytes():
    base = fingerprint({"x": torch.zeros(4)})
    assert differences(base, fingerprint({"x": torch.zeros(2, 2)})) == ["['x']"]
    assert differences(base, fingerprint({"x": torch.zeros(4, dtype=torch.int32)})) == ["['x']"]
    assert differences(base, fingerprint({"x": torch.zeros(4), "y": 1})) == ["", "['y']"]
    assert differences(fingerprint([1, 2]), fingerprint((1, 2))) == [""]


def test_other_objects_are_compared_by_type_only():
    class Opaque:
        def __init__(self, value: int) -> None:
            self.value = value

    assert differences(fingerprint([Opaque(1)]), fingerprint([Opaque(2)])) == []
    assert differences(fingerprint([Opaque(1)]), fingerprint([1])) == ["[0]"]


def test_a_batch_with_more_parts_than_are_described_is_still_compared_by_its_digest():
    many = [torch.tensor(i) for i in range(LEAVES + 10)]
    changed = [*many[:-1], torch.tensor(-1)]
    assert differences(fingerprint(many), fingerprint(changed)) == [f"(a part beyond the first {LEAVES})"]


def test_a_fingerprint_survives_a_weights_only_load():
    saved = fingerprint(_batch())
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True) == saved


# ---------------------------------------------------------------------------------------------- the check
def _check(verify: str) -> tuple[BatchCheck, list[tuple[str, bool]]]:
    """The check of a single-process run (under DDP, tests/test_collectives.py runs it on a real 2-rank group)."""
    reports: list[tuple[str, bool]] = []
    agree = functools.partial(outcomes_of_ranks, rank=0, world_size=1, strategy=None)
    return BatchCheck(verify, lambda message, fail: reports.append((message, fail)), agree), reports  # type: ignore[arg-type]


class _Loader:
    """Batches made of torch's global generator's draws: what the states set before a fetch decide."""

    def __init__(self) -> None:
        self.fetched = 0

    def fetch(self) -> dict[str, torch.Tensor]:
        self.fetched += 1
        return {"x": torch.rand(2)}


def _refetch(saved_seed: int, loaded_seed: int) -> Refetch:
    """The entry of a batch drawn after ``saved_seed``, to be loaded again after ``loaded_seed``."""
    torch.manual_seed(saved_seed)
    saved = fingerprint({"x": torch.rand(2)})

    def set_states() -> None:
        torch.manual_seed(loaded_seed)

    return Refetch(saved, set_states)


def test_the_batch_is_loaded_again_from_its_states_compared_and_dropped():
    check, reports = _check("warn")
    loader = _Loader()
    check.refetch(loader.fetch)  # not armed: nothing loaded
    assert loader.fetched == 0
    check.expect(_refetch(saved_seed=3, loaded_seed=3), "batch_idx 4 of epoch 0")
    before = torch.get_rng_state()
    check.refetch(loader.fetch)
    assert torch.equal(torch.get_rng_state(), before)  # loaded from its own states; the run's are left as they were
    check.refetch(loader.fetch)  # once only
    assert loader.fetched == 1
    check.conclude()
    assert reports == []


def test_a_batch_that_differs_is_reported_with_its_parts():
    check, reports = _check("warn")
    check.expect(_refetch(saved_seed=3, loaded_seed=4), "batch_idx 4 of epoch 0")
    check.refetch(_Loader().fetch)
    check.conclude()
    ((message, fail),) = reports
    assert not fail
    assert "batch_idx 4 of epoch 0" in message
    assert "(differing: ['x'])" in message


def test_off_loads_the_batch_again_and_compares_nothing():
    """The positions were saved before the batch: it is loaded again (and dropped) whatever the resumed run asks."""
    check, reports = _check("off")
    check.expect(_refetch(saved_seed=3, loaded_seed=4), "batch_idx 4 of epoch 0")
    loader = _Loader()
    check.refetch(loader.fetch)
    check.conclude()
    assert (loader.fetched, reports) == (1, [])


def test_verify_batch_takes_only_its_values():
    with pytest.raises(ValueError, match=r"`verify_batch` must be one of \['warn', 'raise', 'off'\], got 'strict'"):
        MidEpochResume(verify_batch="strict")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- Trainer level
def _state(ckpt: Path) -> dict[str, Any]:
    return torch.load(ckpt, weights_only=True)["callbacks"]["MidEpochResume"]


class _Fingerprints(L.Callback):
    """The fingerprint of every batch as the training loop hands it to the model, before any hook changes it."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], dict[str, Any]] = {}

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.seen[(trainer.current_epoch, batch_idx)] = fingerprint(batch)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_checkpoint_fingerprints_the_last_batch_the_run_trained_on(num_workers, tmp_path):
    config = Config(augment=True, num_workers=num_workers, max_epochs=1)
    batches = _Fingerprints()
    run(config, tmp_path / "full", extra_callbacks=[batches])
    assert run(config, tmp_path / "interrupted", crash=MID).crashed
    (rank,) = _state(checkpoint_path(tmp_path / "interrupted", MID))["ranks"]
    assert rank["last_batch"]["fingerprint"] == batches.seen[(0, 4)]
    assert rank["last_batch"]["fingerprint"] != batches.seen[(0, 5)]


@pytest.mark.parametrize(
    ("config", "crash"),
    [
        (Config(max_epochs=1), CrashPoint("before_backward", epoch=0, batch=4)),  # inside a batch
        (Config(max_epochs=2), CrashPoint("train_epoch_end", epoch=0)),  # at an epoch's end
        (Config(max_epochs=1), CrashPoint("train_batch_end", epoch=0, batch=9)),  # after an epoch's last batch
        (Config(max_epochs=1, pulls=2), CrashPoint("train_batch_end", epoch=0, batch=1)),  # dataloader_iter
    ],
    ids=["inside-a-batch", "epoch-end", "last-batch", "dataloader_iter"],
)
def test_no_check_where_the_last_batch_is_not_loaded_again(config, crash, tmp_path):
    assert run(config, tmp_path, crash=crash).crashed
    (rank,) = _state(checkpoint_path(tmp_path, crash))["ranks"]
    assert rank["last_batch"] is None


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loader_without_a_length_is_checked_where_its_workers_load(num_workers, tmp_path):
    """Lightning fetches one batch ahead from a loader without a length: the last trained is the one before it.

    Loaded in workers, it is loaded again from the workers' saved states. Loaded in the main process, the states it
    was loaded from were replaced when Lightning loaded the batch ahead: no check.
    """
    config = Config(iterable="stateful", iterable_workers=num_workers, augment=True, max_epochs=1)
    batches = _Fingerprints()
    run(config, tmp_path / "full", extra_callbacks=[batches])
    assert run(config, tmp_path / "interrupted", crash=MID).crashed
    (rank,) = _state(checkpoint_path(tmp_path / "interrupted", MID))["ranks"]
    if num_workers == 0:
        assert rank["last_batch"] is None
        return
    assert rank["last_batch"]["fingerprint"] == batches.seen[(0, 4)]
    assert [m for m in _resume(config, tmp_path, "raise", []) if "differs" in m] == []
    assert_exact(interrupt_and_resume(config, MID, tmp_path / "exact"))


def _resume(config: Config, tmp_path: Path, verify: str, holder: list[Any], name: str = "resumed") -> list[str]:
    """Resume ``tmp_path / "interrupted"``'s checkpoint (in ``tmp_path / name``): the warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(
            config,
            tmp_path / name,
            callback=False,
            extra_callbacks=[MidEpochResume(verify_batch=verify)],  # type: ignore[arg-type]
            ckpt_path=checkpoint_path(tmp_path / "interrupted", MID),
            seed=2,
            before_fit=lambda trainer, model: holder.append(model),
        )
    return [str(warning.message) for warning in caught]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_generator_at_module_level_is_caught_before_the_resumed_run_trains_on_its_batch(num_workers, tmp_path):
    """Out of the callback's reach: the resumed batch differs (its inputs, not its samples), and the check says so."""
    config = Config(augment=True, num_workers=num_workers, max_epochs=1, pipeline="module")
    assert run(config, tmp_path / "interrupted", crash=MID).crashed
    models: list[Any] = []
    differs = r"batch_idx 4 of epoch 0, loaded again by the resumed run, differs"
    with pytest.raises(MidEpochResumeError, match=differs) as raised:
        _resume(config, tmp_path, "raise", models, "strict")
    assert "(differing: [1])" in str(raised.value)  # the inputs; the ids and targets are the same
    assert models[0].seen == []  # raised before the model trained on it
    messages = _resume(config, tmp_path, "warn", models)
    assert len([m for m in messages if "differs from the one the checkpoint's run trained on" in m]) == 1
    assert models[1].seen[0][:2] == (0, 5)  # warned, and trained on
    assert not [m for m in _resume(config, tmp_path, "off", models, "off") if "differs" in m]


def test_a_changed_dataset_is_caught(tmp_path):
    config = Config(max_epochs=1, num_workers=2)
    assert run(config, tmp_path / "interrupted", crash=MID).crashed
    messages = _resume(replace(config, augment=True), tmp_path, "warn", [])
    assert [m for m in messages if "batch_idx 4 of epoch 0, loaded again by the resumed run, differs" in m]


def test_a_resume_of_an_exact_pipeline_is_not_warned(tmp_path):
    config = Config(augment=True, num_workers=2, max_epochs=1)
    messages = [m for m in _resume_after_crash(config, tmp_path) if "differs" in m]
    assert messages == []


def _resume_after_crash(config: Config, tmp_path: Path) -> list[str]:
    assert run(config, tmp_path / "interrupted", crash=MID).crashed
    return _resume(config, tmp_path, "raise", [])


def test_verify_batch_off_saves_no_fingerprint(tmp_path):
    config = Config(max_epochs=1)
    run(config, tmp_path, callback=False, crash=MID, extra_callbacks=[MidEpochResume(verify_batch="off")])
    (rank,) = _state(checkpoint_path(tmp_path, MID))["ranks"]
    assert rank["last_batch"] is None


# ---------------------------------------------------------------------------------------------- the same run
class _EveryStep(ModelCheckpoint):
    """``ModelCheckpoint(every_n_train_steps=1)``: a checkpoint, and so a fingerprint, after every batch."""

    def __init__(self, directory: Path) -> None:
        super().__init__(dirpath=directory, every_n_train_steps=1, save_top_k=-1)


@pytest.mark.parametrize(
    "config",
    [
        Config(augment=True, max_epochs=2),  # loaded (and augmented) in the main process
        Config(augment=True, max_epochs=2, validation=True, val_check_interval=3),  # ... with validations between
        Config(augment=True, num_workers=2, max_epochs=2, validation=True, val_check_interval=3),
    ],
    ids=["main-process", "main-process-validation", "workers-validation"],
)
def test_a_checkpoint_after_every_batch_leaves_the_run_as_it_is_without_the_callback(config, tmp_path):
    ours = run(config, tmp_path / "ours", extra_callbacks=[_EveryStep(tmp_path / "ours" / "ckpt")])
    stock = run(config, tmp_path / "stock", callback=False, extra_callbacks=[_EveryStep(tmp_path / "stock" / "ckpt")])
    assert ours.seen == stock.seen
    assert ours.model.validated == stock.model.validated
    assert_same_state(ours, stock)
    # and every one of those checkpoints resumes exactly (one of them, here)
    assert_exact(interrupt_and_resume(config, CrashPoint("model_checkpoint", step=7, every=1), tmp_path / "resume"))
