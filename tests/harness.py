"""Run a small Lightning training three ways and compare: uninterrupted, interrupted by a crash, resumed.

The oracle is always the uninterrupted run with the same seed. A :class:`Config` describes the data pipeline and
trainer; a :class:`CrashPoint` says where the interrupted run writes a checkpoint and dies. The resumed run starts in
a process whose random states were scrambled on purpose, as a fresh process's would be.
"""

from __future__ import annotations

import hashlib
import importlib
import math
import os
import random
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

#: How the feature under test is delivered (``MIDEPOCH_DELIVERY``): ``callback`` (the default) attaches
#: ``MidEpochResume`` to every run that asks for it; ``lightning`` is a Lightning with the upstream patches applied
#: (``make upstream-check``, tools/apply_upstream.py), which resumes exactly by itself: no callback is attached, and
#: lightning_midepoch is never imported (its environment must not have it).
DELIVERY = os.environ.get("MIDEPOCH_DELIVERY", "callback")
if DELIVERY not in ("callback", "lightning"):
    raise ValueError(f"MIDEPOCH_DELIVERY={DELIVERY!r}: expected 'callback' (the default) or 'lightning'")
if DELIVERY == "callback":
    from lightning_midepoch import MidEpochResume

#: The Lightning namespace the Trainer-level tests run with (``make compat`` also runs them with pytorch_lightning).
NAMESPACE = os.environ.get("MIDEPOCH_TEST_NAMESPACE", "lightning.pytorch")
L = importlib.import_module(NAMESPACE)
Checkpoint = importlib.import_module(f"{NAMESPACE}.callbacks").Checkpoint
ModelCheckpoint = importlib.import_module(f"{NAMESPACE}.callbacks").ModelCheckpoint
OnExceptionCheckpoint = importlib.import_module(f"{NAMESPACE}.callbacks").OnExceptionCheckpoint
GradientAccumulationScheduler = importlib.import_module(f"{NAMESPACE}.callbacks").GradientAccumulationScheduler
CombinedLoader = importlib.import_module(f"{NAMESPACE}.utilities").CombinedLoader

LOADERS = (
    "shuffle",  # DataLoader(shuffle=True): RandomSampler drawing from the global torch RNG
    "sequential",  # shuffle=False
    "sampler_generator",  # RandomSampler(generator=...)
    "loader_generator",  # DataLoader(shuffle=True, generator=...)
    "distributed",  # an explicit DistributedSampler using set_epoch (sharded over the trainer's devices)
    "batch_sampler_numpy",  # a user's batch sampler drawing from numpy when iter() is called
    "batch_sampler_python",  # ... from python's random at the first next()
    "batch_sampler_torch",  # ... from the global torch RNG at the first next()
    "subclass",  # a DataLoader subclass with its own __init__ argument
    "weighted_generator",  # WeightedRandomSampler(generator=...) (wrapped in DistributedSamplerWrapper under DDP)
    "subset_generator",  # SubsetRandomSampler(generator=...) (likewise)
    "both_generators",  # DataLoader(generator=...) over RandomSampler(generator=...): two generators
    "replacement",  # RandomSampler(replacement=True)
)


class IndexedDataset(Dataset):
    """Sample ``i`` is ``(i + offset, x_i, y_i)`` with data fixed by ``i``, so batches name the samples they hold."""

    def __init__(self, size: int, offset: int = 0) -> None:
        self.size = size
        self.offset = offset
        self.loaded: list[int] = []

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        self.loaded.append(index)
        generator = torch.Generator().manual_seed(index + self.offset)
        return index + self.offset, torch.randn(4, generator=generator), torch.randn(1, generator=generator)


class AugmentedDataset(IndexedDataset):
    """Random augmentation in ``__getitem__``: torch's, numpy's and Python's global generators, and one of its own.

    In a DataLoader worker each draw comes from that worker's generators. A ``worker_init_fn`` may set ``scale``.
    """

    def __init__(self, size: int, offset: int = 0) -> None:
        super().__init__(size, offset)
        self.generator = torch.Generator().manual_seed(3)
        self.scale = 1.0

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        ident, x, y = super().__getitem__(index)
        noise = torch.rand(4) + torch.rand(4, generator=self.generator) + float(np.random.rand()) + random.random()
        return ident, x + self.scale * 0.1 * noise, y


def seeding_worker_init(worker_id: int) -> None:
    """A user's ``worker_init_fn``: seeds from its arguments only, and sets what the dataset copy draws with."""
    info = torch.utils.data.get_worker_info()
    np.random.seed((info.seed + 17) % 2**32)
    random.seed(info.seed * 3)
    info.dataset.scale = 2.0 + worker_id


def clock_worker_init(worker_id: int) -> None:
    """A ``worker_init_fn`` that seeds from the clock: its workers draw differently in every run."""
    torch.utils.data.get_worker_info().dataset.generator.manual_seed(time.time_ns())


WORKER_INITS = {"seeding": seeding_worker_init, "clock": clock_worker_init}


class CountingIterable(IterableDataset):
    """An iterable-style dataset with a position it can save and restore.

    Read in workers, each worker's copy yields the samples ``index % num_workers == id`` (its shard) and, with
    ``augment``, adds noise drawn from the worker's global generators. With ``uneven`` worker ``id``'s shard ends
    ``4 * id`` samples early, so the workers run out of data one after another.
    """

    def __init__(self, size: int, stateful: bool, augment: bool = False, uneven: bool = False) -> None:
        self.size = size
        self.position = 0
        self.augment = augment
        self.uneven = uneven
        if stateful:
            self.state_dict = lambda: {"position": self.position}
            self.load_state_dict = lambda state: setattr(self, "position", state["position"])

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        end = self.size - 4 * info.id if info is not None and self.uneven else self.size
        while self.position < end:
            index = self.position
            self.position += 1
            if info is not None and index % info.num_workers != info.id:
                continue
            generator = torch.Generator().manual_seed(index)
            x, y = torch.randn(4, generator=generator), torch.randn(1, generator=generator)
            if self.augment:
                x = x + 0.1 * (torch.rand(4) + float(np.random.rand()) + random.random())
            yield index, x, y
        self.position = 0


class ShuffledBatches(Sampler[list[int]]):
    """A user's own batch sampler whose order comes from a global RNG drawn when it starts iterating."""

    def __init__(self, size: int, batch_size: int, source: str) -> None:
        self.size, self.batch_size, self.source = size, batch_size, source

    def __len__(self) -> int:
        return math.ceil(self.size / self.batch_size)

    def _batches(self, order: list[int]) -> list[list[int]]:
        return [order[i : i + self.batch_size] for i in range(0, self.size, self.batch_size)]

    def __iter__(self) -> Iterator[list[int]]:
        if self.source == "numpy":  # eager: draws when iter() is called
            return iter(self._batches([int(i) for i in np.random.permutation(self.size)]))
        return self._lazy()

    def _lazy(self) -> Iterator[list[int]]:  # a generator: draws at the first next()
        if self.source == "python":
            order = list(range(self.size))
            random.shuffle(order)
        else:
            order = torch.randperm(self.size).tolist()
        yield from self._batches(order)


class LoaderWithArgs(DataLoader):
    """A DataLoader subclass with an ``__init__`` argument of its own."""

    def __init__(self, dataset: Dataset, tag: str, **kwargs: Any) -> None:
        self.tag = tag
        super().__init__(dataset, **kwargs)


@dataclass(frozen=True)
class Config:
    loader: str = "shuffle"
    num_workers: int = 0
    persistent_workers: bool = False
    dataset_size: int = 20
    batch_size: int = 2
    drop_last: bool = False
    max_epochs: int = 3
    max_steps: int = -1
    accumulate_grad_batches: int = 1
    accumulate_schedule: tuple[tuple[int, int], ...] = ()  # (epoch, factor): a GradientAccumulationScheduler
    limit_train_batches: float | int | None = None
    validation: bool = False
    val_check_interval: float | int | None = None
    check_val_every_n_epoch: int | None = 1
    reload_every_n: int = 0
    manual: bool = False
    step_every: int = 1  # manual optimization: backward at every batch, an optimizer step every this many
    combined: str | None = None  # a CombinedLoader of a long and a short loader, in this mode
    iterable: str | None = None  # "stateful" / "plain": train on an IterableDataset instead
    hook_draws: bool = True  # the model's hooks draw from torch, numpy and python RNGs
    pulls: int = 0  # training_step(self, dataloader_iter) pulling this many batches per step
    augment: bool = False  # the dataset draws random augmentation in __getitem__ (AugmentedDataset)
    worker_init: str | None = None  # a user's worker_init_fn (WORKER_INITS)
    seed_workers: bool = False  # seed_everything(..., workers=True): Lightning's worker_init_fn
    prefetch_factor: int | None = None
    pin_memory: bool = False
    iterable_workers: int = 0  # the iterable dataset's loader reads it in this many workers (each a full copy)
    uneven_shards: bool = False  # ... and its workers' shards have different lengths
    multiprocessing_context: str | None = None  # the map-style loader's workers start this way ("spawn"); None: default
    pipeline: str | None = None  # the map-style dataset draws its augmentation as pipelines.PIPELINES[name] does
    in_order: bool = True  # DataLoader(in_order=False): workers' batches in the order they finish
    model_class: type | None = None  # a subclass of Model to train (a project's own hooks); None: Model

    def loaders(self, model: Model) -> Any:
        if self.iterable is not None:
            dataset = CountingIterable(self.dataset_size, self.iterable == "stateful", self.augment, self.uneven_shards)
            persistent = self.persistent_workers and self.iterable_workers > 0
            return DataLoader(dataset, batch_size=2, num_workers=self.iterable_workers, persistent_workers=persistent)
        if self.combined is not None:
            short = replace(self, dataset_size=6, combined=None)
            return CombinedLoader({"long": self.make_loader(model), "short": short.make_loader(model)}, self.combined)
        return self.make_loader(model)

    def make_loader(self, model: Model) -> DataLoader:
        from pipelines import PIPELINES  # (it imports this module)

        dataset_type = AugmentedDataset if self.augment else IndexedDataset
        if self.pipeline is not None:
            dataset_type = PIPELINES[self.pipeline]
        dataset = dataset_type(self.dataset_size, offset=0 if self.dataset_size != 6 else 1000)
        model.datasets.append(dataset)
        common: dict[str, Any] = {"num_workers": self.num_workers, "persistent_workers": self.persistent_workers}
        if self.worker_init is not None:
            common["worker_init_fn"] = WORKER_INITS[self.worker_init]
        if self.prefetch_factor is not None:
            common["prefetch_factor"] = self.prefetch_factor
        if self.pin_memory:
            common["pin_memory"] = True
        if not self.in_order:
            common["in_order"] = False
        if self.multiprocessing_context is not None:
            common["multiprocessing_context"] = self.multiprocessing_context
        batching = {"batch_size": model.batch_size, "drop_last": self.drop_last}
        if self.loader == "shuffle":
            return DataLoader(dataset, shuffle=True, **batching, **common)
        if self.loader == "sequential":
            return DataLoader(dataset, shuffle=False, **batching, **common)
        if self.loader == "sampler_generator":
            sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(7))
            return DataLoader(dataset, sampler=sampler, **batching, **common)
        if self.loader == "loader_generator":
            generator = torch.Generator().manual_seed(11)
            return DataLoader(dataset, shuffle=True, generator=generator, **batching, **common)
        if self.loader == "distributed":
            world_size, rank = model.trainer.world_size, model.trainer.global_rank
            sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=5)
            return DataLoader(dataset, sampler=sampler, **batching, **common)
        if self.loader.startswith("batch_sampler_"):
            batch_sampler = ShuffledBatches(len(dataset), self.batch_size, self.loader.rsplit("_", 1)[1])
            return DataLoader(dataset, batch_sampler=batch_sampler, **common)
        if self.loader == "subclass":
            return LoaderWithArgs(dataset, tag="mine", shuffle=True, **batching, **common)
        if self.loader == "weighted_generator":
            weights = [1.0 + i % 3 for i in range(len(dataset))]
            generator = torch.Generator().manual_seed(13)
            sampler = WeightedRandomSampler(weights, len(dataset), generator=generator)
            return DataLoader(dataset, sampler=sampler, **batching, **common)
        if self.loader == "subset_generator":
            sampler = SubsetRandomSampler(range(len(dataset)), generator=torch.Generator().manual_seed(17))
            return DataLoader(dataset, sampler=sampler, **batching, **common)
        if self.loader == "both_generators":
            sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(7))
            generator = torch.Generator().manual_seed(11)
            return DataLoader(dataset, sampler=sampler, generator=generator, **batching, **common)
        if self.loader == "replacement":
            return DataLoader(dataset, sampler=RandomSampler(dataset, replacement=True), **batching, **common)
        raise ValueError(self.loader)

    def trainer_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "max_epochs": self.max_epochs,
            "max_steps": self.max_steps,
            "accumulate_grad_batches": self.accumulate_grad_batches,
            "reload_dataloaders_every_n_epochs": self.reload_every_n,
            "check_val_every_n_epoch": self.check_val_every_n_epoch,
        }
        if self.limit_train_batches is not None:
            kwargs["limit_train_batches"] = self.limit_train_batches
        if self.val_check_interval is not None:
            kwargs["val_check_interval"] = self.val_check_interval
        if not self.validation:
            kwargs["limit_val_batches"] = 0
        return kwargs

    @property
    def batches_per_epoch(self) -> int:
        if self.combined is not None:
            long = replace(self, combined=None).batches_per_epoch
            short = replace(self, combined=None, dataset_size=6).batches_per_epoch
            return min(long, short) if self.combined == "min_size" else max(long, short)
        size = self.dataset_size
        full = size // self.batch_size if self.drop_last else math.ceil(size / self.batch_size)
        if isinstance(self.limit_train_batches, int):
            return min(full, self.limit_train_batches)
        if isinstance(self.limit_train_batches, float):
            return int(full * self.limit_train_batches)
        return full


#: the first words of the warning given on a Lightning release the callback was not checked against (`make
#: lightning-next`): about the release, not about a resume
UNCHECKED_RELEASE = ("lightning-midepoch has not been checked against", "lightning-midepoch supports")


class Model(L.LightningModule):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.batch_size = config.batch_size  # what Lightning's batch size finder scales
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.3), nn.Linear(16, 1))
        self.seen: list[tuple[int, int, tuple[int, ...]]] = []
        self.validated: list[tuple[int, int]] = []
        self.datasets: list[IndexedDataset] = []
        self.automatic_optimization = not config.manual
        self.raise_at: tuple[int, int | None] | None = None
        # every moment a CrashPoint can name, in the order this run reached them, with the global step after it
        self.moments: list[tuple[CrashPoint, int]] = []

    def _reached(self, hook: str, batch: int | None = None) -> None:
        self.moments.append((CrashPoint(hook, self.current_epoch, batch), self.trainer.global_step))

    def _batch_idx(self) -> int:
        return int(self.trainer.fit_loop.epoch_loop.batch_idx)

    def train_dataloader(self) -> Any:
        return self.config.loaders(self)

    def val_dataloader(self) -> Any:
        return DataLoader(IndexedDataset(4, offset=500), batch_size=2, shuffle=True) if self.config.validation else []

    def on_train_start(self) -> None:
        if self.config.hook_draws:  # runs again in a resumed process, where the uninterrupted run did not run it
            torch.rand(5), np.random.rand(3), random.random()

    def on_train_epoch_start(self) -> None:
        self._reached("train_epoch_start")
        if self.config.hook_draws:
            torch.rand(1), np.random.rand(), random.random()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._reached("train_batch_start", batch_idx)
        if self.config.hook_draws:
            torch.rand(2), np.random.rand(2), random.random()

    def on_before_backward(self, loss: torch.Tensor) -> None:
        self._reached("before_backward", self._batch_idx())

    def on_after_backward(self) -> None:
        self._reached("after_backward", self._batch_idx())

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        self._reached("before_optimizer_step", self._batch_idx())

    def on_train_epoch_end(self) -> None:
        self._reached("train_epoch_end")

    def on_validation_end(self) -> None:
        if not self.trainer.sanity_checking:
            self._reached("validation_end", self._batch_idx())

    def _loss(self, batch: Any, batch_idx: int) -> torch.Tensor:
        parts = batch.values() if isinstance(batch, dict) else [batch]
        ids: tuple[int, ...] = ()
        loss = torch.zeros(())
        for part in parts:
            if part is None:  # an exhausted loader in max_size mode
                continue
            ids_part, x, y = part
            ids += tuple(ids_part.tolist())
            if self.config.augment:  # the augmented inputs, bit for bit
                ids += (int.from_bytes(hashlib.sha1(x.numpy().tobytes()).digest()[:8], "little"),)
            loss = loss + nn.functional.mse_loss(self.net(x), y)
        self.seen.append((self.current_epoch, batch_idx, ids))
        noise = 1.0 + 1e-3 * (np.random.rand() + random.random()) if self.config.hook_draws else 1.0
        return loss * noise

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = self._loss(batch, batch_idx)
        if self.raise_at == (self.current_epoch, batch_idx):
            raise Crash("an error in training_step")
        if not self.config.manual:
            return loss
        optimizer = self.optimizers()
        every = self.config.step_every
        if every == 1:
            optimizer.zero_grad()
        self.manual_backward(loss / every)
        if (batch_idx + 1) % every == 0:  # the batch_idx restarts each epoch: a group may span two epochs
            optimizer.step()
            if every > 1:
                optimizer.zero_grad()
        return None

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.validated.append((self.current_epoch, batch_idx))
        _, x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y) + 1e-3 * torch.rand(()))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        _, x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self.net(x), y) + 1e-3 * torch.rand(()))

    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        _, x, _ = batch
        return self.net(x) + torch.rand(())

    def test_dataloader(self) -> Any:
        return DataLoader(IndexedDataset(6, offset=700), batch_size=2, shuffle=True)

    def predict_dataloader(self) -> Any:
        return DataLoader(IndexedDataset(6, offset=900), batch_size=2, shuffle=True)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.9)]


class IterStepModel(Model):
    """``training_step(self, dataloader_iter)``: each step pulls ``config.pulls`` batches itself."""

    def training_step(self, dataloader_iter: Any) -> Any:  # type: ignore[override]
        loss = torch.zeros(())
        for _ in range(self.config.pulls):
            batch, batch_idx, _ = next(dataloader_iter)  # StopIteration ends the epoch, as in stock Lightning
            loss = loss + self._loss(batch, batch_idx)
        return loss


class BatchEndMoments(L.Callback):
    """Records the model's ``train_batch_end`` moments (see ``Model.moments``).

    A callback, not the model's own hook: a model that overrides ``on_train_batch_end`` has a resume from a checkpoint
    written in a callback's ``on_train_batch_end`` warned (Lightning runs the module's hook after it, and a resume
    does not run it).
    """

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        pl_module._reached("train_batch_end", batch_idx)


class Crash(Exception):
    """The simulated failure of the interrupted run."""


class CrashingModelCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint(every_n_train_steps=...)`` whose process dies right after it wrote ``last.ckpt`` at a step."""

    def __init__(self, crash_step: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.crash_step = crash_step

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        super().on_train_batch_end(trainer, *args)
        if trainer.global_step == self.crash_step:
            raise Crash(self.crash_step)


@dataclass(frozen=True)
class CrashPoint:
    """Where the interrupted run writes a checkpoint and dies.

    ``hook`` names where the checkpoint is written, at epoch ``epoch`` and batch ``batch``:

    * ``train_batch_end``, ``train_batch_start``, ``before_backward``, ``after_backward``,
      ``before_optimizer_step``, ``train_epoch_start``, ``train_epoch_end``: ``trainer.save_checkpoint`` in that
      callback hook;
    * ``validation_end``: after the validation that follows batch ``batch`` (at the epoch's end when None);
    * ``model_checkpoint``: ``ModelCheckpoint(every_n_train_steps=every)`` wrote ``last.ckpt`` after global step
      ``step``, and the process dies right after writing it;
    * ``exception``: ``training_step`` raises and ``OnExceptionCheckpoint`` writes the checkpoint.
    """

    hook: str
    epoch: int = 0
    batch: int | None = None
    step: int = 0
    every: int = 1

    @property
    def inside_training_step(self) -> bool:
        """Written after training_step ran but before the batch finished: Lightning runs that batch again."""
        return self.hook in ("before_backward", "after_backward", "before_optimizer_step", "exception")


class CrashCallback(L.Callback):
    def __init__(self, point: CrashPoint, path: Path) -> None:
        self.point = point
        self.path = path

    def _save_and_crash(self, trainer: L.Trainer) -> None:
        trainer.save_checkpoint(self.path)
        raise Crash(self.point)

    def _here(self, trainer: L.Trainer, batch_idx: int | None) -> bool:
        return trainer.current_epoch == self.point.epoch and batch_idx == self.point.batch

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.point.hook == "train_batch_end" and self._here(trainer, batch_idx):
            self._save_and_crash(trainer)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.point.hook == "train_batch_start" and self._here(trainer, batch_idx):
            self._save_and_crash(trainer)

    def _in_batch(self, trainer: L.Trainer, hook: str) -> None:
        if self.point.hook == hook and self._here(trainer, trainer.fit_loop.epoch_loop.batch_idx):
            self._save_and_crash(trainer)

    def on_before_backward(self, trainer: L.Trainer, pl_module: Any, loss: Any) -> None:
        self._in_batch(trainer, "before_backward")

    def on_after_backward(self, trainer: L.Trainer, pl_module: Any) -> None:
        self._in_batch(trainer, "after_backward")

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: Any, optimizer: Any) -> None:
        self._in_batch(trainer, "before_optimizer_step")

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        if self.point.hook == "train_epoch_start" and trainer.current_epoch == self.point.epoch:
            self._save_and_crash(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if self.point.hook == "train_epoch_end" and self._here(trainer, None):
            self._save_and_crash(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if self.point.hook != "validation_end" or trainer.sanity_checking:
            return
        batch = trainer.fit_loop.epoch_loop.batch_idx
        at_epoch_end = trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        if trainer.current_epoch == self.point.epoch and (
            batch == self.point.batch or (self.point.batch is None and at_epoch_end)
        ):
            self._save_and_crash(trainer)


@dataclass
class RunResult:
    model: Model
    trainer: L.Trainer
    crashed: bool
    rng: dict[str, Any] = field(default_factory=dict)

    @property
    def seen(self) -> list[tuple[int, int, tuple[int, ...]]]:
        return self.model.seen


def run(
    config: Config,
    tmp_path: Path,
    *,
    callback: bool = True,
    crash: CrashPoint | None = None,
    ckpt_path: str | Path | None = None,
    seed: int = 1,
    extra_callbacks: list[L.Callback] | None = None,
    weights_only: bool | None = None,
    before_fit: Callable[[L.Trainer, Model], Any] | None = None,
    **trainer_kwargs: Any,
) -> RunResult:
    """Train once. A resumed run passes ``ckpt_path`` and a different ``seed`` (a fresh process's states).

    ``before_fit`` runs with the trainer and model just before ``trainer.fit`` (a tuner, say); extra keyword
    arguments go to the ``Trainer``.
    """
    from pipelines import fresh_process  # (it imports this module)

    fresh_process()
    L.seed_everything(seed, verbose=False, workers=config.seed_workers)
    model = (config.model_class or (IterStepModel if config.pulls else Model))(config)
    if ckpt_path is not None:  # the weights come from the checkpoint; the process-wide states must not matter
        L.seed_everything(seed + 1000, verbose=False, workers=config.seed_workers)
    # with MIDEPOCH_DELIVERY=lightning the patched Lightning is the feature: nothing to attach
    callbacks: list[L.Callback] = [MidEpochResume()] if callback and DELIVERY == "callback" else []
    checkpoint_dir = tmp_path / "checkpoints"
    if crash is not None:
        path = checkpoint_path(tmp_path, crash)
        callbacks.append(CrashCallback(crash, path))
        if crash.hook == "exception":  # the model raises in training_step; OnExceptionCheckpoint writes a checkpoint
            callbacks.append(OnExceptionCheckpoint(dirpath=checkpoint_dir))
        if crash.hook == "model_checkpoint":
            callbacks.append(
                CrashingModelCheckpoint(
                    crash.step, dirpath=checkpoint_dir, every_n_train_steps=crash.every, save_last=True, save_top_k=0
                )
            )
    if config.accumulate_schedule:
        callbacks.append(GradientAccumulationScheduler(dict(config.accumulate_schedule)))
    callbacks += [*(extra_callbacks or []), BatchEndMoments()]
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=any(isinstance(callback, Checkpoint) for callback in callbacks),
        num_sanity_val_steps=0,
        deterministic=True,
        callbacks=callbacks,
        default_root_dir=tmp_path,
        **{**config.trainer_kwargs(), **trainer_kwargs},
    )
    crashed = False
    if crash is not None and crash.hook == "exception":
        model.raise_at = (crash.epoch, crash.batch)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*The number of training batches.*")
        if before_fit is not None:
            before_fit(trainer, model)
        try:
            # `weights_only` arrived in Lightning 2.6
            trainer.fit(model, ckpt_path=ckpt_path, **({} if weights_only is None else {"weights_only": weights_only}))
        except Crash:
            crashed = True
    # (legacy=False: any bit generator as numpy's global one, not only MT19937)
    rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(legacy=False), "python": random.getstate()}
    return RunResult(model, trainer, crashed, rng)


def checkpoint_path(tmp_path: Path, crash: CrashPoint) -> Path:
    names = {"model_checkpoint": "last.ckpt", "exception": "on_exception.ckpt"}
    return tmp_path / "checkpoints" / names.get(crash.hook, "crash.ckpt")


@dataclass
class Comparison:
    full: RunResult
    interrupted: RunResult
    resumed: RunResult


_UNINTERRUPTED: dict[tuple[Config, bool, str], RunResult] = {}


def interrupted_checkpoint(config: Config, tmp_path: Path, crash: CrashPoint) -> Path:
    """Run ``config`` until ``crash`` (in ``tmp_path / "interrupted"``) and return the checkpoint written there."""
    assert run(config, tmp_path / "interrupted", crash=crash).crashed
    return checkpoint_path(tmp_path / "interrupted", crash)


def resume_warnings(config: Config, ckpt: Path, tmp_path: Path, on_mismatch: str = "raise") -> list[str]:
    """The warnings of a run of ``config`` resumed from ``ckpt`` (in ``tmp_path / "resumed"``)."""
    if DELIVERY != "callback":
        raise RuntimeError(
            f"resume_warnings() configures MidEpochResume (on_mismatch): it needs the callback, not "
            f"MIDEPOCH_DELIVERY={DELIVERY}"
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        callback = MidEpochResume(on_mismatch=on_mismatch)  # type: ignore[arg-type]
        run(config, tmp_path / "resumed", callback=False, extra_callbacks=[callback], ckpt_path=ckpt, seed=2)
    return [str(warning.message) for warning in caught]


def uninterrupted(config: Config, tmp_path: Path, *, callback: bool = True) -> RunResult:
    """The uninterrupted run of ``config`` (deterministic, so run once per test session and shared)."""
    key = (config, callback, NAMESPACE)
    if key not in _UNINTERRUPTED:
        _UNINTERRUPTED[key] = run(config, tmp_path, callback=callback)
    return _UNINTERRUPTED[key]


def assert_transparent(config: Config, tmp_path: Path) -> None:
    """The uninterrupted run with the callback is the same run as without it: batches, validation, final state.

    With ``MIDEPOCH_DELIVERY=lightning`` there is no stock Lightning in the process to compare with (the installed
    one is patched): nothing is checked here. ``make upstream-check`` checks that transparency across environments
    instead: tests/upstream/test_transparency.py compares the patched runs with ones recorded on stock Lightning.
    """
    if DELIVERY != "callback":
        return
    ours = uninterrupted(config, tmp_path / "full", callback=True)
    stock = uninterrupted(config, tmp_path / "stock", callback=False)
    assert ours.seen == stock.seen
    assert ours.model.validated == stock.model.validated
    assert_same_state(ours, stock)


def interrupt_and_resume(config: Config, crash: CrashPoint, tmp_path: Path, *, callback: bool = True) -> Comparison:
    """The uninterrupted run, the run that crashes at ``crash``, and the run resumed from its checkpoint.

    With the callback, the uninterrupted run is also checked to be the same as stock Lightning's.
    """
    if callback:
        assert_transparent(config, tmp_path)
    full = uninterrupted(config, tmp_path / "full", callback=callback)
    interrupted = run(config, tmp_path / "interrupted", callback=callback, crash=crash)
    assert interrupted.crashed, f"the run never reached {crash}"
    if crash.inside_training_step:  # that batch is not in the checkpoint; the resumed run trains it
        interrupted.model.seen.pop()
    ckpt = checkpoint_path(tmp_path / "interrupted", crash)
    resumed = run(config, tmp_path / "resumed", callback=callback, ckpt_path=ckpt, seed=2)
    if callback:
        assert_continues_where_inspect_says(config, ckpt, resumed)
    return Comparison(full, interrupted, resumed)


def resume_repeatedly(config: Config, crashes: list[CrashPoint], tmp_path: Path) -> Comparison:
    """Crash at each point in turn, each time resuming from the previous crash's checkpoint; then finish."""
    assert_transparent(config, tmp_path)
    full = uninterrupted(config, tmp_path / "full")
    runs: list[RunResult] = []
    ckpt: Path | None = None
    for index, crash in enumerate(crashes):
        directory = tmp_path / f"attempt{index}"
        runs.append(run(config, directory, crash=crash, ckpt_path=ckpt, seed=1 if ckpt is None else 10 + index))
        assert runs[-1].crashed, f"attempt {index} never reached {crash}"
        if crash.inside_training_step:  # that batch is not in the checkpoint; the next attempt trains it
            runs[-1].model.seen.pop()
        ckpt = checkpoint_path(directory, crash)
    resumed = run(config, tmp_path / "final", ckpt_path=ckpt, seed=99)
    assert ckpt is not None
    assert_continues_where_inspect_says(config, ckpt, resumed)
    interrupted = runs[0]
    for later in runs[1:]:  # fold the intermediate attempts into "what ran before the last checkpoint"
        interrupted.model.seen.extend(later.model.seen)
        interrupted.model.validated.extend(later.model.validated)
    return Comparison(full, interrupted, resumed)


def assert_continues_where_inspect_says(config: Config, ckpt: Path, resumed: RunResult) -> None:
    """The resumed run's first batch is where ``inspect`` says the checkpoint continues: the runtime's restart and
    ``inspect``'s model of it (``_restart.checkpoint_point``) agree on every checkpoint moment the harness writes."""
    if DELIVERY != "callback" or config.pulls or not resumed.seen:  # (a step that pulls numbers no batch_idx itself)
        return
    # imported here, after the delivery check: `make upstream-check`'s environment has no lightning_midepoch
    from lightning_midepoch._inspect import STATE_KEY
    from lightning_midepoch._restart import UNKNOWN, checkpoint_point

    point = checkpoint_point(torch.load(ckpt, map_location="cpu", weights_only=False), STATE_KEY)
    assert point.saved_at != UNKNOWN, f"inspect cannot tell where {ckpt.name} continues"
    expected = (point.epoch + 1, 0) if point.epoch_done else (point.epoch, point.batch)
    assert resumed.seen[0][:2] == expected, f"inspect says {point}; the resumed run began at {resumed.seen[0][:2]}"


def _equal(first: Any, second: Any) -> bool:
    if isinstance(first, torch.Tensor):
        return isinstance(second, torch.Tensor) and first.shape == second.shape and torch.equal(first, second)
    if isinstance(first, dict):
        return (
            isinstance(second, dict)
            and first.keys() == second.keys()
            and all(_equal(first[k], second[k]) for k in first)
        )
    if isinstance(first, (list, tuple)):
        return isinstance(second, (list, tuple)) and len(first) == len(second) and all(map(_equal, first, second))
    if isinstance(first, np.ndarray):
        return bool(np.array_equal(first, second))
    return bool(first == second)


def assert_same_state(first: RunResult, second: RunResult) -> None:
    """Bitwise the same weights, optimizer and scheduler states, step and process-wide random streams."""
    for (name, expected), actual in zip(first.model.named_parameters(), second.model.parameters(), strict=True):
        assert torch.equal(expected, actual), f"parameter {name} differs"
    assert _equal(first.trainer.optimizers[0].state_dict(), second.trainer.optimizers[0].state_dict())
    for expected, actual in zip(first.trainer.lr_scheduler_configs, second.trainer.lr_scheduler_configs, strict=True):
        assert _equal(expected.scheduler.state_dict(), actual.scheduler.state_dict())
    assert first.trainer.global_step == second.trainer.global_step
    assert _equal(first.rng, second.rng)


def assert_exact(comparison: Comparison) -> None:
    """The three points of "exact": batches, final state, and the continuation into later epochs."""
    full, interrupted, resumed = comparison.full, comparison.interrupted, comparison.resumed
    done = len(interrupted.seen)
    assert interrupted.seen == full.seen[:done]
    # exactly the remaining batches, in order, with the same batch_idx and current_epoch (later epochs included)
    assert resumed.seen == full.seen[done:]
    assert interrupted.model.validated + resumed.model.validated == full.model.validated
    # weights, optimizer and scheduler, and the process-wide random streams continue identically to the end
    assert_same_state(full, resumed)
