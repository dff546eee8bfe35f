"""Benchmark 1: time to resume vs. position in the epoch.

* **Comparison**: the time from starting a resume to the first batch of the rest of the epoch, for checkpoints k
  batches into the epoch, for every approach in the same run: ``MidEpochResume`` through a real
  ``trainer.fit(ckpt_path=...)``, this package's ``fast_forward`` at the sampler level, accelerate's
  ``skip_first_batches``, torchdata's ``StatefulDataLoader`` restored from its ``state_dict``, iterate-and-discard
  through the DataLoader, and stock Lightning (which does not skip at all and trains on the wrong data: the floor).
  Two settings: an epoch of 10^6 batches of 32 with ``SequentialSampler`` (where nothing but skipping costs time)
  and the 2M-sample ``RandomSampler`` epoch of the issue's reference measurements (where every approach also
  re-generates the permutation).
* **Goal**: this package's time at 90% of the epoch against its time at the epoch's start, for ``RandomSampler``,
  ``SequentialSampler`` and ``DistributedSampler`` over epochs of 10^6 and 10^7 samples (and, beyond the goal's
  range, ``RandomSampler`` over the comparison's 10^6 batches), at the sampler level and through ``fit()``; the
  goal is at most 1.2x.

Samples cost 50 µs each to load (a busy-wait). Every resumed first batch is checked against batch k of the
uninterrupted order (from torch's own iteration), and every approach but iterate-and-discard is checked to load only
that batch's samples. Run alone: ``python benchmarks/bench_resume.py``.
"""

from __future__ import annotations

import copy
import itertools
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from _common import (
    BATCH_SIZE,
    ORDER_SEED,
    RESULTS_DIR,
    SAMPLE_COST_S,
    SAMPLERS,
    CostlyDataset,
    FitResume,
    StartAt,
    checkpoints_for,
    freeze_heap,
    interleaved,
    make_loader,
    make_sampler,
    median,
    progress,
    ratio,
    reference_batches,
    seconds,
    table,
    timed,
)
from torch.utils.data import DataLoader

from lightning_midepoch import fast_forward

DISCARD_REPEATS = 3  # iterate-and-discard runs at the first position past 0 (each loads 32,000 samples)
DISCARD_REPEAT_CAP_S = 5.0  # larger positions predicted to take longer than this are run once
GOAL_FRACTION = 0.9
GOAL_RATIO = 1.2
GOAL_CHEAP_REPEATS = 15  # runs for cases whose first round took under GOAL_CHEAP_S (noise is largest there)
GOAL_CHEAP_S = 0.02
WARMUP_SIZE = 200 * BATCH_SIZE

OURS_FIT = "MidEpochResume: fit(ckpt_path)"
OURS_SAMPLER = "lightning_midepoch.fast_forward (sampler level)"
ACCELERATE = "accelerate skip_first_batches"
TORCHDATA = "torchdata StatefulDataLoader.load_state_dict"
DISCARD = "iterate-and-discard (DataLoader)"
STOCK = "stock Lightning: fit(ckpt_path), no skip (wrong data)"
ISLICE = "itertools.islice over the batch sampler"


@dataclass(frozen=True)
class Setting:
    """One comparison: a sampler, an epoch size and the checkpoint positions (in batches)."""

    kind: str
    size: int
    positions: tuple[int, ...]
    why: str
    repeats: int  # interleaved runs of every approach (iterate-and-discard past k = 0: see DISCARD_REPEATS)
    discard_cap_s: float  # iterate-and-discard cells predicted to take longer are extrapolated, not run

    @property
    def title(self) -> str:
        batches = -(-self.size // BATCH_SIZE)
        return f"{self.kind}, {self.size:,} samples ({batches:,} batches of {BATCH_SIZE})"


SETTINGS = (
    Setting(
        "SequentialSampler",
        10**6 * BATCH_SIZE,
        (0, 10**3, 10**4, 10**5),
        "an epoch of 10^6 batches; a fixed order, so every second spent is spent skipping",
        repeats=9,
        discard_cap_s=40.0,
    ),
    Setting(
        "RandomSampler",
        2 * 10**6,
        (0, 10**3, 10**4, 5 * 10**4),
        "the issue's reference setting; every approach also re-generates the epoch's permutation",
        repeats=5,
        discard_cap_s=15.0,
    ),
)


@dataclass(frozen=True)
class GoalCase:
    """Epoch size, samplers, whether to also resume through ``fit()``, and the interleaved runs of each."""

    size: int
    kinds: tuple[str, ...]
    fit: bool
    repeats: int


GOAL_CASES = (
    GoalCase(10**6, SAMPLERS, fit=False, repeats=5),
    GoalCase(10**7, SAMPLERS, fit=True, repeats=5),
    # beyond the goal's 10^7: the 10^6-batch epoch of the comparison, shuffled
    GoalCase(10**6 * BATCH_SIZE, ("RandomSampler",), fit=True, repeats=3),
)


@dataclass
class Run:
    """One measurement: seconds to the first batch, that batch's indices and the samples loaded to get it."""

    seconds: float
    first_batch: list[int]
    samples_loaded: int


@dataclass
class Cell:
    """The runs of one approach at one position, or an extrapolation where running it would take too long."""

    runs: list[Run] = field(default_factory=list)
    extrapolated: float | None = None

    @property
    def seconds(self) -> float:
        return self.extrapolated if self.extrapolated is not None else median([run.seconds for run in self.runs])

    def label(self) -> str:
        if self.extrapolated is not None:
            return f"~{seconds(self.extrapolated)} (extrapolated)"
        return seconds(self.seconds) + (" (1 run)" if len(self.runs) == 1 else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "median_s": self.seconds,
            "runs_s": [run.seconds for run in self.runs],
            "extrapolated": self.extrapolated is not None,
            "samples_loaded": self.runs[0].samples_loaded if self.runs else None,
        }


def _islice(batches: Any, start: int) -> Iterator[list[int]]:
    return itertools.islice(iter(batches), start, None)


def _first_batch(dataset: Any, resume: Callable[[], tuple[torch.Tensor, Iterator[Any]]]) -> Run:
    """Time ``resume()``, which returns the first batch and the iterator it came from.

    The iterator is returned so that it is freed after the clock stops: it may hold the epoch's whole order, and
    freeing millions of indices is not part of resuming (a resumed run keeps iterating).
    """
    elapsed, (batch, _) = timed(resume)
    return Run(elapsed, batch.tolist(), dataset.loaded)


def sampler_level(size: int, kind: str, start: int, skip: Callable[[Any, int], Iterator[list[int]]]) -> Run:
    """A DataLoader whose batch sampler starts at ``start`` via ``skip``: time to its first batch."""
    loader = make_loader(size, kind)

    def resume() -> tuple[torch.Tensor, Iterator[Any]]:
        iterator = iter(DataLoader(loader.dataset, batch_sampler=StartAt(loader.batch_sampler, start, skip)))
        return next(iterator), iterator

    return _first_batch(loader.dataset, resume)


def iterate_and_discard(size: int, kind: str, start: int) -> Run:
    """Load and throw away ``start`` batches, then take the next one (a naive correct loop, Composer's spin)."""
    loader = make_loader(size, kind)

    def resume() -> tuple[torch.Tensor, Iterator[Any]]:
        iterator = iter(loader)
        for _ in range(start):
            next(iterator)
        return next(iterator), iterator

    return _first_batch(loader.dataset, resume)


def accelerate_skip(size: int, kind: str, start: int) -> Run:
    """accelerate's ``skip_first_batches``: a new DataLoader whose batch sampler skips batch by batch (indices)."""
    from accelerate.data_loader import skip_first_batches

    loader = make_loader(size, kind)

    def resume() -> tuple[torch.Tensor, Iterator[Any]]:
        iterator = iter(skip_first_batches(loader, start))
        return next(iterator), iterator

    return _first_batch(loader.dataset, resume)


class TorchdataStates:
    """torchdata ``StatefulDataLoader`` states k batches into the epoch, and the timed restore from them.

    For ``RandomSampler`` the loader uses torchdata's own stateful ``RandomSampler`` with the same seeded generator
    (it draws the same order as torch's), as torchdata recommends; a ``SequentialSampler`` is torch's. Iterating k
    batches to get each state would take minutes: a state after k batches differs from the state after one batch
    only in its counters, so it is written from the latter, and :func:`check_torchdata_states` compares written
    states with saved ones.
    """

    def __init__(self, size: int, kind: str) -> None:
        self.size, self.kind = size, kind
        loader = self.loader(cost_s=0.0)
        iterator = iter(loader)
        next(iterator)
        self.after_one: dict[str, Any] = loader.state_dict()

    def loader(self, cost_s: float = SAMPLE_COST_S) -> Any:
        from torchdata.stateful_dataloader import StatefulDataLoader
        from torchdata.stateful_dataloader.sampler import RandomSampler as StatefulRandomSampler

        dataset = CostlyDataset(self.size, cost_s)
        if self.kind == "RandomSampler":
            sampler = StatefulRandomSampler(dataset, generator=torch.Generator().manual_seed(ORDER_SEED))
        else:
            sampler = make_sampler(self.kind, dataset)
        return StatefulDataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler)

    def state_at(self, consumed: int) -> dict[str, Any]:
        state = copy.deepcopy(self.after_one)
        state["_sampler_iter_yielded"] = state["_num_yielded"] = consumed
        batch_sampler_state = state["_sampler_iter_state"]
        batch_sampler_state["samples_yielded"] = consumed * BATCH_SIZE
        if "sampler_iter_state" in batch_sampler_state:  # a stateful sampler's own count
            batch_sampler_state["sampler_iter_state"]["yielded"] = consumed * BATCH_SIZE
        return state

    def restore(self, start: int) -> Run:
        loader = self.loader()
        state = self.state_at(start)

        def resume() -> tuple[torch.Tensor, Iterator[Any]]:
            loader.load_state_dict(state)
            iterator = iter(loader)
            return next(iterator), iterator

        return _first_batch(loader.dataset, resume)


def check_torchdata_states(kind: str) -> None:
    """States written by :class:`TorchdataStates` equal the ones torchdata saves after iterating that far."""
    states = TorchdataStates(WARMUP_SIZE, kind)
    for consumed in (0, 1, 7, WARMUP_SIZE // BATCH_SIZE // 2):
        loader = states.loader(cost_s=0.0)
        iterator = iter(loader)
        for _ in range(consumed):
            next(iterator)
        if not _same(loader.state_dict(), states.state_at(consumed)):
            raise AssertionError(f"the torchdata state written for {consumed} batches differs from the saved one")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[key], b[key]) for key in a)
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return torch.equal(a, b)
    return bool(a == b)


def _fit_run(size: int, kind: str, checkpoint: Path, with_callback: bool) -> Run:
    fit = FitResume(size, kind, checkpoint, with_callback)
    return Run(fit.seconds, fit.first_batch, fit.samples_loaded)


def _check(method: str, run: Run, expected: dict[int, list[int]], position: int) -> None:
    """The first batch is the uninterrupted order's batch ``position`` (stock Lightning's: batch 0), and only it
    was loaded (iterate-and-discard loads every skipped sample; MidEpochResume's ``fit`` also loads the last batch
    trained again, batch ``position - 1``, which its batch check compares with the checkpoint's fingerprint)."""
    if run.first_batch != expected[0 if method == STOCK else position]:
        raise AssertionError(f"{method} at batch {position}: the first batch is not the expected one")
    loads = BATCH_SIZE * (2 if method == OURS_FIT and position > 0 else 1)
    if method != DISCARD and run.samples_loaded != loads:
        raise AssertionError(f"{method} at batch {position} loaded {run.samples_loaded} samples, not {loads}")


def _methods(size: int, kind: str, checkpoints: dict[int, Path]) -> dict[str, Callable[[int], Run]]:
    """Every approach, as ``measure(k) -> Run``, in the order of the table."""
    torchdata = TorchdataStates(size, kind)
    return {
        OURS_FIT: lambda k: _fit_run(size, kind, checkpoints[k], with_callback=True),
        OURS_SAMPLER: lambda k: sampler_level(size, kind, k, fast_forward),
        ACCELERATE: lambda k: accelerate_skip(size, kind, k),
        TORCHDATA: torchdata.restore,
        DISCARD: lambda k: iterate_and_discard(size, kind, k),
        STOCK: lambda k: _fit_run(size, kind, checkpoints[k], with_callback=False),
    }


def warm_up(workdir: Path) -> None:
    """Imports, Lightning's first fit and the package's one-time check of its fast paths, on a small epoch."""
    for kind in SAMPLERS:
        for method, measure in _methods(WARMUP_SIZE, kind, checkpoints_for(WARMUP_SIZE, kind, (0, 1), workdir)).items():
            if method != DISCARD:
                measure(1)
        if kind != "DistributedSampler":
            check_torchdata_states(kind)
    freeze_heap()  # accelerate and torchdata are imported now


def compare(setting: Setting, workdir: Path) -> dict[str, dict[int, Cell]]:
    """Every approach at every position of one setting, interleaved, ``setting.repeats`` times."""
    progress(f"comparison: {setting.title}: reference order and checkpoints")
    expected = reference_batches(setting.size, setting.kind, setting.positions)
    methods = _methods(
        setting.size, setting.kind, checkpoints_for(setting.size, setting.kind, setting.positions, workdir)
    )
    cells = {method: {k: Cell() for k in setting.positions} for method in methods}
    for k, method in interleaved(setting.repeats, list(itertools.product(setting.positions, methods))):
        discard_runs = len(cells[DISCARD][k].runs)
        if method == DISCARD and k > 0 and (k != setting.positions[1] or discard_runs == DISCARD_REPEATS):
            continue  # see _finish_discard
        run = methods[method](k)
        _check(method, run, expected, k)
        cells[method][k].runs.append(run)
    progress(f"  {setting.repeats} interleaved runs done; iterate-and-discard at larger k")
    _finish_discard(setting, cells[DISCARD], methods[DISCARD], expected)
    return cells


def _finish_discard(
    setting: Setting, cells: dict[int, Cell], measure: Callable[[int], Run], expected: dict[int, list[int]]
) -> None:
    """Run the costlier iterate-and-discard positions while that stays under the cap, and extrapolate the rest.

    Its cost is linear in the position (every skipped sample is loaded): the line goes through the medians at
    k = 0 and at the largest position measured.
    """
    for k in setting.positions:
        if cells[k].runs:
            continue
        last = max(position for position in setting.positions if cells[position].runs)
        base = cells[0].seconds
        predicted = base + (cells[last].seconds - base) * k / last
        if predicted > setting.discard_cap_s:
            cells[k].extrapolated = predicted
            continue
        for _ in range(1 if predicted > DISCARD_REPEAT_CAP_S else DISCARD_REPEATS):
            run = measure(k)
            _check(DISCARD, run, expected, k)
            cells[k].runs.append(run)
        progress(f"  iterate-and-discard at k={k:,}: {cells[k].label()}")


@dataclass
class GoalRow:
    """This package's time at the epoch's start and at 90% of it, for one sampler, size and level."""

    level: str
    kind: str
    size: int
    position: int
    start_runs: list[float] = field(default_factory=list)
    late_runs: list[float] = field(default_factory=list)
    islice_runs: list[float] = field(default_factory=list)
    repeats: int = 0

    @property
    def ratio(self) -> float:
        return median(self.late_runs) / median(self.start_runs)

    @property
    def met(self) -> bool:
        return self.ratio <= GOAL_RATIO

    def to_json(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "sampler": self.kind,
            "epoch_samples": self.size,
            "position_batches": self.position,
            "start_median_s": median(self.start_runs),
            "late_median_s": median(self.late_runs),
            "start_runs_s": self.start_runs,
            "late_runs_s": self.late_runs,
            "ratio": self.ratio,
            "goal_met": self.met,
            "islice_late_median_s": median(self.islice_runs) if self.islice_runs else None,
            "repeats": self.repeats,
        }


def goal(workdir: Path) -> list[GoalRow]:
    """Time at 90% of the epoch vs. at its start, at the sampler level and through ``fit()``, interleaved.

    Each case is run ``case.repeats`` times, or ``GOAL_CHEAP_REPEATS`` times when a first round shows it takes
    milliseconds (where the machine's noise is largest relative to the time).
    """
    rows: list[GoalRow] = []
    for case in GOAL_CASES:
        size = case.size
        late = int(GOAL_FRACTION * -(-size // BATCH_SIZE))
        for kind in case.kinds:
            progress(f"goal: {kind}, {size:,} samples")
            expected = reference_batches(size, kind, (0, late))
            sampler_row = GoalRow("fast_forward", kind, size, late)
            rows.append(sampler_row)
            fit_row = GoalRow("fit(ckpt_path)", kind, size, late)
            checkpoints = checkpoints_for(size, kind, (0, late), workdir) if case.fit else {}
            if checkpoints:
                rows.append(fit_row)
            done, repeats = 0, case.repeats
            while done < repeats:
                for k, runs in ((0, sampler_row.start_runs), (late, sampler_row.late_runs)):
                    run = sampler_level(size, kind, k, fast_forward)
                    _check(OURS_SAMPLER, run, expected, k)
                    runs.append(run.seconds)
                run = sampler_level(size, kind, late, _islice)
                _check(ISLICE, run, expected, late)
                sampler_row.islice_runs.append(run.seconds)
                for k, runs in ((0, fit_row.start_runs), (late, fit_row.late_runs)) if checkpoints else ():
                    run = _fit_run(size, kind, checkpoints[k], with_callback=True)
                    _check(OURS_FIT, run, expected, k)
                    runs.append(run.seconds)
                done += 1
                if done == 1 and max(sampler_row.start_runs + fit_row.start_runs) < GOAL_CHEAP_S:
                    repeats = GOAL_CHEAP_REPEATS
            sampler_row.repeats = fit_row.repeats = repeats
    return rows


def comparison_markdown(setting: Setting, cells: dict[str, dict[int, Cell]]) -> str:
    last = setting.positions[-1]
    header = ["approach", *(f"k = {k:,}" for k in setting.positions), f"k = {last:,} / k = 0"]
    rows = [
        [method, *(cells_at[k].label() for k in setting.positions), ratio(cells_at[last].seconds / cells_at[0].seconds)]
        for method, cells_at in cells.items()
    ]
    return (
        f"**{setting.title}** ({setting.why}); median of {setting.repeats} interleaved runs (iterate-and-discard at "
        f"k = {setting.positions[1]:,}: {DISCARD_REPEATS}), iterate-and-discard extrapolated where one run would take "
        f"over {setting.discard_cap_s:.0f} s.\n\n" + table(header, rows)
    )


COMPARISON_NOTES = (
    "Time from starting the resume to the first batch of the rest of the epoch: for `fit`, from calling "
    "`trainer.fit(model, ckpt_path=...)` (checkpoint loading, setup, the resume itself) to the first "
    "`training_step`; for the others, from the resume call to the first collated batch. `__getitem__` busy-waits "
    "50 µs, `num_workers=0`. Every resumed first batch was checked to be batch k of the uninterrupted order and, "
    "except for iterate-and-discard, to be the only samples loaded, but for MidEpochResume's `fit`, which also loads "
    "batch k - 1 again for its batch check (at k > 0; the forged checkpoints below hold batch 0's fingerprint, so "
    "that check warns here, at the same cost). Stock Lightning restarts the order (its first "
    "batch is batch 0 whatever k is): it is a floor, not a resume. Iterate-and-discard cells marked extrapolated "
    'are linear in k through k = 0 and the largest position measured; "1 run" cells were run once to stay within '
    "the time budget. The checkpoints at k > 0 are a real checkpoint written after the "
    "epoch's first batch with its progress counters set to k (the recorded order does not depend on k); k = 0 is a "
    "real checkpoint written in `on_train_epoch_start`."
)


def goal_markdown(rows: list[GoalRow]) -> str:
    header = [
        "level",
        "sampler",
        "epoch (samples)",
        "k = 0",
        "k = 90%",
        "ratio",
        f"goal ≤ {GOAL_RATIO}x",
        "islice at 90% (reference)",
        "runs",
    ]
    body = [
        [
            row.level,
            row.kind,
            f"{row.size:,}",
            seconds(median(row.start_runs)),
            f"{seconds(median(row.late_runs))} (k = {row.position:,})",
            ratio(row.ratio),
            "met" if row.met else "**not met**",
            seconds(median(row.islice_runs)) if row.islice_runs else "",
            row.repeats,
        ]
        for row in rows
    ]
    return (
        "Time to the first batch at 90% of the epoch against at its start (batch size 32, 50 µs per sample), "
        f"median of the interleaved runs counted in the last column ({GOAL_CHEAP_REPEATS} where a first round took "
        f"under {GOAL_CHEAP_S * 1e3:.0f} ms). `fast_forward`: a DataLoader whose batch sampler is "
        "`fast_forward(batch_sampler, k)`; `fit(ckpt_path)`: the full Lightning resume with `MidEpochResume`. The "
        "islice column is a plain `itertools.islice` over the same batch sampler at 90%, for reference.\n\n"
        + table(header, body)
    )


def plot(results: list[tuple[Setting, dict[str, dict[int, Cell]]]], rows: list[GoalRow], directory: Path) -> list[Path]:
    """Time to first batch vs. position per setting (symlog x, log y), and the goal's start-vs-90% times."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = [directory / "resume_vs_position.png", directory / "resume_goal.png"]
    figure, all_axes = plt.subplots(1, len(results), figsize=(11, 4.6), dpi=90, sharey=True)
    for axes, (setting, cells) in zip(all_axes, results, strict=True):
        for method, cells_at in cells.items():
            xs = list(setting.positions)
            ys = [cells_at[k].seconds for k in xs]
            (line,) = axes.plot(xs, ys, marker="o", label=method)
            hollow = [(x, y) for x, y in zip(xs, ys, strict=True) if cells_at[x].extrapolated is not None]
            if hollow:
                axes.plot(
                    *zip(*hollow, strict=True),
                    linestyle="none",
                    marker="o",
                    markerfacecolor="white",
                    color=line.get_color(),
                )
        axes.set_xscale("symlog", linthresh=setting.positions[1])
        axes.set_xticks(list(setting.positions), [f"{k:,}" for k in setting.positions])
        axes.minorticks_off()
        axes.set_yscale("log")
        axes.set_xlabel("checkpoint position k (batches into the epoch)")
        axes.set_title(setting.title, fontsize=9)
        axes.grid(True, which="both", alpha=0.3)
    all_axes[0].set_ylabel("time to first batch (s)")
    all_axes[0].legend(fontsize=7)
    figure.suptitle("Time to resume vs. position (hollow markers: extrapolated)", fontsize=10)
    figure.tight_layout()
    figure.savefig(paths[0])
    plt.close(figure)

    figure, axes = plt.subplots(figsize=(10, 4.2), dpi=90)
    level = {"fast_forward": "sampler", "fit(ckpt_path)": "fit"}
    labels = [f"{row.kind.removesuffix('Sampler')}\n{row.size / 1e6:g}M\n{level[row.level]}" for row in rows]
    x = range(len(rows))
    axes.bar([p - 0.2 for p in x], [median(row.start_runs) for row in rows], 0.4, label="k = 0")
    axes.bar([p + 0.2 for p in x], [median(row.late_runs) for row in rows], 0.4, label="k = 90% of the epoch")
    axes.set_xticks(list(x), labels, fontsize=7)
    axes.set_yscale("log")
    axes.set_ylabel("time to first batch (s)")
    axes.set_title("MidEpochResume: resume at 90% of the epoch vs. at its start", fontsize=10)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(paths[1])
    plt.close(figure)
    return paths


def run() -> dict[str, Any]:
    """Run both measurements; returns the markdown sections, the JSON results and the plot paths."""
    with tempfile.TemporaryDirectory() as directory:
        workdir = Path(directory)
        progress("resume: warm-up on a small epoch")
        warm_up(workdir)
        results = [(setting, compare(setting, workdir)) for setting in SETTINGS]
        rows = goal(workdir)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    return {
        "markdown": {
            "comparison": "\n\n".join(comparison_markdown(s, cells) for s, cells in results)
            + "\n\n"
            + COMPARISON_NOTES,
            "goal": goal_markdown(rows),
        },
        "json": {
            "comparison": [
                {
                    "sampler": setting.kind,
                    "epoch_samples": setting.size,
                    "batch_size": BATCH_SIZE,
                    "repeats": setting.repeats,
                    "positions": list(setting.positions),
                    "approaches": {
                        method: {str(k): cell.to_json() for k, cell in cells_at.items()}
                        for method, cells_at in cells.items()
                    },
                }
                for setting, cells in results
            ],
            "goal": [row.to_json() for row in rows],
        },
        "plots": plot(results, rows, RESULTS_DIR),
    }


if __name__ == "__main__":
    from _common import setup_process

    setup_process()
    result = run()
    for section in result["markdown"].values():
        print(section, end="\n\n")
