"""What users can see of the overrides while fit runs: class names, profiler actions, reprs, copies and pickles."""

from __future__ import annotations

import copy
import gc
import importlib
import pickle
from typing import Any

import pytest

from harness import NAMESPACE, Config, L, ModelCheckpoint, run
from lightning_midepoch._fetchers import _ResumableDataFetcher
from lightning_midepoch._loops import _ResumableTrainingEpochLoop
from lightning_midepoch._mixin import mix_in, mixed_copy, stock_reduce, unmix

_PROFILED_DURING_EPOCH = "[_TrainingEpochLoop].train_dataloader_next"


class Stock:
    def __init__(self) -> None:
        self.value = 1

    def run(self) -> str:
        return "stock"


class Override:
    __reduce_ex__ = stock_reduce

    def run(self) -> str:
        return "override"


def test_an_object_with_an_override_pickles_as_the_stock_object():
    obj = Stock()
    original = mix_in(obj, Override)
    vars(obj)["_midepoch"] = object()  # what the session attaches
    assert (obj.run(), type(obj).__name__, type(obj).__qualname__) == ("override", "Stock", "Stock")
    data = pickle.dumps(obj)
    assert b"lightning_midepoch" not in data
    restored = pickle.loads(data)
    assert type(restored) is Stock
    assert vars(restored) == {"value": 1}
    unmix(obj, original)
    assert type(obj) is Stock
    assert vars(obj) == {"value": 1}


class _LoopsSeen(L.Callback):
    """Looks at the trainer's loops and fetcher in the middle of an epoch."""

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step != 3:
            return
        objects = (trainer.fit_loop, trainer.fit_loop.epoch_loop, trainer.fit_loop._data_fetcher)
        self.names = [(type(obj).__name__, type(obj).__qualname__, type(obj).__module__) for obj in objects]
        self.reprs = [repr(obj).split(" object at ")[0] for obj in objects]
        self.copies = [copy.copy(obj) for obj in objects]
        self.sampler_repr = repr(trainer.train_dataloader.batch_sampler)
        # pickling the epoch loop takes its trainer along; its progress is plain data
        self.pickled_progress = pickle.loads(pickle.dumps(trainer.fit_loop.epoch_loop.batch_progress))


def _seen(tmp_path, callback: bool) -> _LoopsSeen:
    seen = _LoopsSeen()
    run(Config(max_steps=5), tmp_path, callback=callback, extra_callbacks=[seen])
    return seen


def test_names_and_reprs_are_stock(tmp_path):
    ours, stock = _seen(tmp_path / "ours", True), _seen(tmp_path / "stock", False)
    assert ours.names == stock.names
    assert ours.names[1][0] == "_TrainingEpochLoop"
    assert ours.reprs == stock.reprs
    assert ours.sampler_repr.split(" object at ")[0] == stock.sampler_repr.split(" object at ")[0]


def test_copies_are_stock_objects_without_the_overrides(tmp_path):
    ours, stock = _seen(tmp_path / "ours", True), _seen(tmp_path / "stock", False)
    for copied, expected in zip(ours.copies, stock.copies, strict=True):
        assert type(copied) is type(expected)
        assert not any(name.startswith("_midepoch") for name in vars(copied))
        assert set(vars(copied)) == set(vars(expected))


@pytest.mark.parametrize("profiler", ["SimpleProfiler", "AdvancedProfiler"])
def test_profiler_actions_are_stock(profiler, tmp_path):
    """The profiler reports the same actions, under the names stock Lightning gives them."""
    base = getattr(importlib.import_module(f"{NAMESPACE}.profilers"), profiler)

    class Recording(base):  # type: ignore[misc, valid-type]
        def start(self, action_name: str) -> None:
            self.actions.add(action_name)
            super().start(action_name)

    def actions(callback: bool) -> set[str]:
        recording = Recording()
        recording.actions = set()
        run(Config(max_steps=5), tmp_path / str(callback), callback=callback, profiler=recording)
        return recording.actions

    ours, stock = actions(True), actions(False)
    assert _PROFILED_DURING_EPOCH in stock
    # the callback's own hooks are profiled under its name, as every callback's are
    assert {action for action in ours if "MidEpochResume" not in action} == stock


class _TrainerAfterFit(L.Callback):
    def teardown(self, trainer: L.Trainer, pl_module: Any, stage: str) -> None:
        self.trainer = trainer


def test_a_trainer_pickled_after_fit_holds_nothing_of_ours_outside_the_callback(tmp_path):
    """`ddp_spawn` and the fork launchers pickle the trainer into their processes: one that has run a fit with the
    callback must pickle as stock Lightning's does, with the callback the only object of ours in it."""
    from lightning_midepoch import MidEpochResume

    kept = {}
    for callback in (True, False):
        after = _TrainerAfterFit()
        run(Config(max_epochs=2, num_workers=1), tmp_path / str(callback), callback=callback, extra_callbacks=[after])
        kept[callback] = after.trainer
    ours, stock = kept[True], kept[False]
    attached = [c for c in ours.callbacks if isinstance(c, MidEpochResume)]
    assert len(attached) == 1
    assert b"lightning_midepoch" in pickle.dumps(ours)
    ours.callbacks = [c for c in ours.callbacks if c is not attached[0]]
    data = pickle.dumps(ours)
    assert b"midepoch" not in data
    restored = pickle.loads(data)
    for path in ("fit_loop", "fit_loop.epoch_loop", "train_dataloader", "train_dataloader.batch_sampler"):
        ours_object, stock_object = restored, stock
        for name in path.split("."):
            ours_object, stock_object = getattr(ours_object, name), getattr(stock_object, name)
        assert type(ours_object) is type(stock_object), path
    assert type(restored.train_dataloader.batch_sampler.sampler) is type(stock.train_dataloader.batch_sampler.sampler)
    # the callback itself round-trips, holding where the fit stopped (what a checkpoint written after it records)
    copied = pickle.loads(pickle.dumps(attached[0]))
    assert repr(copied.state_dict()) == repr(attached[0].state_dict())


class _EpochLoopClass(L.Callback):
    """Whether the epoch loop carries the override, seen at every batch."""

    def __init__(self) -> None:
        self.overridden: list[bool] = []

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.overridden.append(isinstance(trainer.fit_loop.epoch_loop, _ResumableTrainingEpochLoop))


def test_only_a_restore_puts_the_override_on_the_epoch_loop(tmp_path):
    """Every read of an object's attributes gets slower once it carries an override (see ``mix_in``), and the epoch
    loop's is needed only after Lightning restored the loops: a fit that restores nothing keeps the stock loop."""
    fresh, resumed = _EpochLoopClass(), _EpochLoopClass()
    config = Config(max_steps=4)
    checkpoints = ModelCheckpoint(tmp_path, every_n_train_steps=2, save_top_k=-1)
    run(config, tmp_path / "fresh", extra_callbacks=[fresh, checkpoints])
    assert fresh.overridden == [False] * 4
    run(config, tmp_path / "resumed", ckpt_path=tmp_path / "epoch=0-step=2.ckpt", extra_callbacks=[resumed])
    assert resumed.overridden == [True] * 2


class _FetcherLayout(L.Callback):
    """Whether the train fetcher keeps its attributes in the object, seen at every batch (and whether it is ours)."""

    def __init__(self) -> None:
        self.inline: list[bool] = []
        self.overridden: list[bool] = []

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        fetcher = trainer.fit_loop._data_fetcher
        # (an object whose attributes were moved into a dict refers to that dict, else to the values themselves)
        self.inline.append(not any(isinstance(ref, dict) and "fetched" in ref for ref in gc.get_referents(fetcher)))
        self.overridden.append(isinstance(fetcher, _ResumableDataFetcher))


def test_the_fetcher_keeps_its_attributes_inline_as_the_stock_one(tmp_path):
    """Lightning reads the fetcher's attributes at every fetch, fastest where CPython keeps them in the object; the
    override never reads them through ``vars()``, which would move them into a dict (and made each read 2 to 4
    times slower)."""
    stock, ours = _FetcherLayout(), _FetcherLayout()
    config = Config(max_steps=4)
    run(config, tmp_path / "stock", callback=False, extra_callbacks=[stock])
    run(config, tmp_path / "ours", extra_callbacks=[ours])
    assert stock.overridden == [False] * 4
    assert ours.overridden == [True] * 4
    assert ours.inline == stock.inline == [True] * 4


def test_a_mixed_copy_sets_the_first_attributes_before_the_others():
    seen = []

    class Watching:
        @property
        def value(self) -> int:
            return self._midepoch_value

        @value.setter
        def value(self, value: int) -> None:
            seen.append(getattr(self, "_midepoch_session", None))
            self._midepoch_value = value

    copy_, original = mixed_copy(Stock(), Watching, first={"_midepoch_session": "session"})
    assert (copy_.value, copy_.run(), seen, original) == (1, "stock", ["session"], Stock)
    assert not any(isinstance(ref, dict) for ref in gc.get_referents(copy_))
