"""The resumed pass of loaders that keep their own position, and of loaders that start their iterator lazily.

Trainer-level: tests/test_datalibs.py (Hugging Face datasets, litdata), compared with uninterrupted runs.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from lightning_midepoch._passes import ResumedPass


class _Counting(IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Iterator[int]:
        yield from range(4)


class _LazyLoader:
    """A stateful loader whose iterator starts at its first ``next()`` (its ``__iter__`` is a generator)."""

    def __init__(self, draws: int = 1) -> None:
        self.draws = draws

    def __iter__(self) -> Iterator[int]:
        for _ in range(self.draws):  # a DataLoader iterator's base seed, and the dataset's draws in this process
            torch.empty((), dtype=torch.int64).random_()
        yield 0

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class _EagerLoader(_LazyLoader):
    def __iter__(self) -> Iterator[int]:
        return iter([0])


class _Restored:
    """Hugging Face's IterableDataset keeps a loaded state for every later pass of its epoch."""

    def __init__(self) -> None:
        self._starting_state_dict: dict[str, Any] | None = {"epoch": 0}


def _session(loaders: list[Any]) -> Any:
    return SimpleNamespace(loaders=loaders, trainer=L.Trainer(logger=False), warned=set())


def test_a_lazily_started_loaders_seed_draw_at_the_resumed_batch_is_taken_back():
    lazy = _LazyLoader()
    session = _session([DataLoader(list(range(4))), _EagerLoader(), lazy])
    resumed = ResumedPass(session)
    resumed.starts_mid_epoch()
    assert resumed.lazy_starts == [2]  # the stateful loader whose __iter__ is a generator, only
    before = torch.get_rng_state()
    resumed.before_fetch()
    next(iter(lazy))
    assert not torch.equal(torch.get_rng_state(), before)
    resumed.after_fetch()
    assert torch.equal(torch.get_rng_state(), before)
    assert resumed.lazy_starts == []  # the first fetch only: later ones draw as in the uninterrupted run
    resumed.before_fetch()
    next(iter(lazy))
    resumed.after_fetch()
    assert not torch.equal(torch.get_rng_state(), before)


def test_more_draws_than_the_seed_at_the_resumed_batch_warn_naming_the_loader():
    lazy = _LazyLoader(draws=2)
    resumed = ResumedPass(_session([lazy]))
    resumed.starts_mid_epoch()
    resumed.before_fetch()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        next(iter(lazy))
        after_both = torch.get_rng_state()
        resumed.after_fetch()
    assert torch.equal(torch.get_rng_state(), after_both)  # nothing is taken back that cannot be told apart
    messages = [str(warning.message) for warning in caught]
    assert (
        len([m for m in messages if "Train dataloader 0 (_LazyLoader) starts its iterator at its first batch" in m])
        == 1
    )


def test_a_position_given_for_the_resumed_pass_is_forgotten_when_the_next_pass_starts():
    dataset = _Restored()
    iterable = DataLoader(_Counting())
    iterable.dataset._starting_state_dict = {"epoch": 0}  # type: ignore[attr-defined]
    mapped = DataLoader(list(range(4)))
    resumed = ResumedPass(_session([iterable, mapped, SimpleNamespace(dataset=dataset)]))
    resumed.positions_given()
    assert mapped not in resumed.one_pass_positions  # map-style loaders are resumed by their sampler
    resumed.epoch_started()
    assert iterable.dataset._starting_state_dict is None  # type: ignore[attr-defined]
    assert dataset._starting_state_dict is None
    assert resumed.one_pass_positions == []
