"""The fetcher and ``CombinedLoader`` overrides: every fetch of a training batch is seen, and nothing else is."""

from __future__ import annotations

import pytest

from lightning_midepoch._fetchers import _FetchingCombinedLoader
from lightning_midepoch._mixin import mix_in, unmix


class _NothingToLoadAgain:
    pending = None


class _Session:
    """What the ``CombinedLoader`` override asks of its recording: the hooks around a fetch, and the shared flag."""

    def __init__(self) -> None:
        self.ctx = self  # (the shared state: the flag and the latest batches)
        self.fetching = False
        self.events: list[str] = []
        self.batch_check = _NothingToLoadAgain()  # (no resume here: no batch to load again for the batch check)
        self.last_batch = self.previous_batch = None

    def before_fetch(self) -> None:
        self.events.append("before")

    def after_fetch(self) -> None:
        self.events.append("after")


class _AsksAtItsFirstItem:
    """An iterable whose pass starts at its first next() (as a generator-based sampler's does), asking where it is."""

    def __init__(self, session: _Session) -> None:
        self.session = session
        self.answers: list[bool] = []

    def __iter__(self):
        self.answers.append(self.session.fetching)
        yield from (1, 2, 3)


@pytest.mark.parametrize("kind", ["_PrefetchDataFetcher", "_DataFetcher", "_DataLoaderIterDataFetcher"])
def test_a_pass_that_starts_inside_a_fetch_knows_it_and_one_outside_does_not(kind):
    from lightning.pytorch.loops import fetchers
    from lightning.pytorch.utilities import CombinedLoader

    session = _Session()
    asked = _AsksAtItsFirstItem(session)
    combined = CombinedLoader(asked)
    original = mix_in(combined, _FetchingCombinedLoader)
    vars(combined)["_midepoch"] = session
    fetcher = getattr(fetchers, kind)()
    fetcher.setup(combined)
    step = next(iter(fetcher))
    if kind == "_DataLoaderIterDataFetcher":
        step = next(step)  # the training step takes its batch itself
    assert step[0] == 1
    assert asked.answers == [True]
    fetches = len(session.events) // 2  # (the prefetching fetcher fetches one batch ahead)
    assert fetches >= 1
    assert session.events == ["before", "after"] * fetches
    assert not session.fetching

    outside = _AsksAtItsFirstItem(session)
    next(iter(outside))  # a user's own look at a loader, between two fetches
    assert outside.answers == [False]

    unmix(combined, original)
    assert type(combined) is CombinedLoader
    assert "_midepoch" not in vars(combined)


def test_the_flag_is_cleared_and_the_hook_after_runs_when_the_loader_is_exhausted():
    from lightning.pytorch.utilities import CombinedLoader

    session = _Session()
    combined = CombinedLoader([[1]])
    mix_in(combined, _FetchingCombinedLoader)
    vars(combined)["_midepoch"] = session
    iter(combined)
    assert next(combined)[0] == [1]
    with pytest.raises(StopIteration):
        next(combined)
    assert session.events == ["before", "after", "before", "after"]
    assert not session.fetching
