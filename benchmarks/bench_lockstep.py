"""Benchmark 2b: the callback's steady-state cost per step, the arms trained in lock step.

On a shared machine the speed of the CPU drifts by tens of percent from one second to the next, far more than the 1%
this benchmark looks for; runs of the arms one after another (``bench_overhead``) see that drift as noise. Here the arms
(no callback, a second arm without one, an empty ``Callback``, ``MidEpochResume``) train at the same time, each in a
thread of its own, and take turns of a few steps: a turn of each arm, then of each arm again, the order rotating from
round to round (ABCD, BCDA, CDAB, ...). Only one thread runs at any moment (the others wait for their turn), so a step
is timed in its thread's CPU time, from one ``on_train_batch_start`` to the next (the step and the next batch's fetch,
where the callback's per-batch work happens). Turns of the same round ran within a few milliseconds of each other: their
differences cancel the drift.

The threads run on one core (the process is pinned to it for the measurement): they take turns anyway, and on a
2-core machine the scheduler can otherwise move a thread to the other core mid-turn, where it starts on cold caches.
Unpinned, the per-turn medians of one arm varied by 20% (a 95% interval about 30 µs wide on the MLP 8-8 in 300
turns); pinned, the interval is about half as wide, and every step is faster (the step the goal is measured
against included).

The first step of a turn follows another arm's step, in caches that arm filled, which costs more the more code a
step runs; the steps after it follow a step of their own arm, as in a real run. Per turn, the median of those later
steps is compared.

One process is not enough. Each arm's model, optimizer and data lie where that process's allocations put them, and
the same code measured in two processes differs by about 10 µs per step on the MLP: more than one process's interval
is wide, and as much as the goal. A fourth arm shows it: a second arm without a callback, whose difference from the
first would be zero in a perfect measurement. So the lock step runs in several fresh processes, each starting the
arms' threads in another order, and every difference is reported as the mean of the processes' medians, with a 95%
interval from the spread between processes (Student's t): a process's own noise and its layout both count. Reported
per model: each arm's median step, and for each arm against no callback that difference and interval; the same for
the first steps of the turns; and per process, the MLP's differences. The budget (the project's brief): the
callback costs at most 60 µs per step more than an empty ``Callback`` on the MLP step, judged on the measured
difference (the mean of the processes' medians of the two arms' paired turns); the upper bound of its 95% interval
is reported beside it, and whether that too is within the budget. The same is reported as a share of a 20 ms step.

Run alone: ``python benchmarks/bench_lockstep.py``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
from _common import collect_garbage, freeze_heap, make_trainer, median, progress, table
from bench_overhead import BASELINE, CONTROL, MLP, OURS, WARMUP_STEPS, Setting

from lightning_midepoch import MidEpochResume

#: A second arm without a callback: its difference from the first is the measurement's own error
AGAIN = "no callback (again)"
ARMS = (BASELINE, AGAIN, CONTROL, OURS)
#: Each arm's callbacks (made in its thread)
ARM_CALLBACKS: dict[str, Callable[[], list[L.Callback]]] = {
    BASELINE: list,
    AGAIN: list,
    CONTROL: lambda: [L.Callback()],
    OURS: lambda: [MidEpochResume()],
}
#: Steps an arm trains before the next arm's turn: the first follows another arm's step, the others its own.
STEPS_PER_TURN = 10
#: Fresh processes per model, and the turns each arm takes in each
PROCESSES = 12
TURNS_PER_PROCESS = 300
#: The models timed. num_workers=0: the whole step runs in the arm's thread; num_workers=2: the arm's thread is the
#: main process's work per step (its workers load ahead while the other arms take their turns), which is where the
#: sequential runs of ``bench_overhead`` see the callback cost most and vary most
SETTINGS = (
    Setting((128, 256, 256, 10), num_workers=0, measured_steps=TURNS_PER_PROCESS * STEPS_PER_TURN),
    Setting((8, 8), num_workers=0, measured_steps=TURNS_PER_PROCESS * STEPS_PER_TURN),
    Setting((128, 256, 256, 10), num_workers=2, measured_steps=TURNS_PER_PROCESS * STEPS_PER_TURN),
)
#: The budget: MidEpochResume's cost per step above an empty Callback's (the measured difference; its upper 95% bound
#: is reported beside it)
BUDGET_S = 60e-6
#: A step the budget is also reported against
REFERENCE_STEP_S = 20e-3
#: Student's t at 97.5% by degrees of freedom: a two-sided 95% interval from a few processes' medians
_T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131)


def start_orders(arms: Sequence[str], count: int) -> list[tuple[str, ...]]:
    """The order each of ``count`` processes starts the arms' threads in (each thread allocates its arm's model as it
    starts): rotations of the arms and of their reverse, in turn, so that each arm starts in every place.

    >>> start_orders("abc", 4)
    [('a', 'b', 'c'), ('c', 'b', 'a'), ('b', 'c', 'a'), ('b', 'a', 'c')]
    """
    forward, backward = list(arms), list(reversed(arms))
    orders = []
    for index in range(count):
        base = forward if index % 2 == 0 else backward
        shift = index // 2 % len(base)
        orders.append(tuple(base[shift:] + base[:shift]))
    return orders


class _Relay:
    """Lets one arm's thread run at a time, a turn of steps each, and times every step in its thread's CPU time."""

    def __init__(self, arms: tuple[str, ...], steps_per_turn: int) -> None:
        self.arms = arms
        self.steps_per_turn = steps_per_turn
        self.turn_events = {arm: threading.Event() for arm in arms}
        self.started: dict[str, float | None] = {arm: None for arm in arms}
        self.turns: dict[str, list[list[float]]] = {arm: [] for arm in arms}  # each turn's step times, per arm
        self.running = list(arms)
        self.turn = 0  # turns completed
        self.queue: list[str] = []
        self.barrier = threading.Barrier(len(arms))  # the timed steps start when every arm has warmed up

    def _next(self) -> None:
        """Wake the arm whose turn comes next (a new round when every running arm had one)."""
        if not self.running:
            return
        if not self.queue:
            rotation = self.turn % len(self.running)
            self.queue = self.running[rotation:] + self.running[:rotation]
            self.turn += 1
        self.turn_events[self.queue.pop(0)].set()

    def _wait_for_turn(self, arm: str) -> None:
        event = self.turn_events[arm]
        event.wait()
        event.clear()
        self.turns[arm].append([])
        self.started[arm] = time.thread_time()

    def start(self, arm: str) -> None:
        """After the arm's warm-up: wait for the others, then for the arm's first turn."""
        if self.barrier.wait() == 0:
            self._next()
        self._wait_for_turn(arm)

    def _step_done(self, arm: str) -> None:
        started, self.started[arm] = self.started[arm], None
        if started is not None:
            self.turns[arm][-1].append(time.thread_time() - started)

    def step_boundary(self, arm: str) -> None:
        """At ``on_train_batch_start``: the step since the previous one is done; the turn goes on or passes."""
        self._step_done(arm)
        if len(self.turns[arm][-1]) < self.steps_per_turn:
            self.started[arm] = time.thread_time()
            return
        self._next()
        self._wait_for_turn(arm)

    def finished(self, arm: str) -> None:
        """At the end of the arm's fit (or its failure): the arm leaves the turns."""
        self._step_done(arm)
        self.running.remove(arm)
        self.queue = [queued for queued in self.queue if queued != arm]
        self._next()


class _Turns(L.Callback):
    """One arm's side of the relay (only steps after the warm-up are timed)."""

    def __init__(self, relay: _Relay, arm: str) -> None:
        self.relay, self.arm = relay, arm

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step < WARMUP_STEPS:
            return
        if trainer.global_step == WARMUP_STEPS:
            self.relay.start(self.arm)
            return
        self.relay.step_boundary(self.arm)


def _timed_steps(relay: _Relay, setting: Setting) -> None:
    """Train every arm in a thread of its own, the threads started in the relay's order, and wait for them."""
    errors: list[BaseException] = []

    def train(arm: str) -> None:
        L.seed_everything(0, verbose=False)
        model = MLP(setting)
        extra = ARM_CALLBACKS[arm]()
        trainer = make_trainer([*extra, _Turns(relay, arm)], max_steps=WARMUP_STEPS + setting.measured_steps + 1)
        try:
            trainer.fit(model)
        except BaseException as error:  # reported after the other arms finished
            errors.append(error)
            relay.barrier.abort()  # an arm that failed before its timed steps: the others stop waiting for it
        finally:
            relay.finished(arm)

    threads = [threading.Thread(target=train, args=(arm,), name=arm) for arm in relay.arms]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def _median_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """The median of ``values`` and a 95% confidence interval for it (order statistics, normal approximation)."""
    ordered = sorted(values)
    n = len(ordered)
    half_width = 1.96 * math.sqrt(n) / 2
    low, high = max(int(n / 2 - half_width), 0), min(math.ceil(n / 2 + half_width), n - 1)
    return median(ordered), ordered[low], ordered[high]


def _mean_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """The mean of ``values`` (one per process) and its 95% interval (Student's t, the processes as the sample)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, -math.inf, math.inf
    spread = math.sqrt(sum((value - mean) ** 2 for value in values) / (n - 1))
    half_width = _T_975[min(n - 1, len(_T_975)) - 1] * spread / math.sqrt(n)
    return mean, mean - half_width, mean + half_width


@contextmanager
def _one_core() -> Iterator[int | None]:
    """Pin this thread (and the threads it starts) to one core, the last (where the OS is least busy); then unpin."""
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    if not cores:  # pragma: no cover - not Linux
        yield None
        return
    core = max(cores)
    os.sched_setaffinity(0, {core})
    try:
        yield core
    finally:
        os.sched_setaffinity(0, cores)


def one_process(setting: Setting, order: Sequence[str]) -> dict[str, Any]:
    """The lock step in this process, the arms' threads started in ``order``: per arm, each whole turn's median step
    after its first, and its first step."""
    collect_garbage()
    freeze_heap()
    relay = _Relay(tuple(order), STEPS_PER_TURN)
    with _one_core() as core:
        _timed_steps(relay, setting)
    # whole turns only (an arm's last one may have been cut short by the end of its fit)
    turns = {arm: [turn for turn in values if len(turn) == STEPS_PER_TURN] for arm, values in relay.turns.items()}
    count = min(len(values) for values in turns.values())
    return {
        "order": list(order),
        "core": core,
        # per turn: the median of the steps after the first (each follows a step of its own arm, as in a real run),
        # and the first (which follows another arm's)
        "following": {arm: [median(turn[1:]) for turn in values[:count]] for arm, values in turns.items()},
        "first": {arm: [turn[0] for turn in values[:count]] for arm, values in turns.items()},
    }


def _in_fresh_process(setting_index: int, order: Sequence[str]) -> dict[str, Any]:
    """:func:`one_process` in a new interpreter (its own memory layout), which writes the result to a file."""
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory) / "turns.json"
        command = [sys.executable, __file__, "--process", str(setting_index), ",".join(order), str(out)]
        subprocess.run(command, check=True)
        return dict(json.loads(out.read_text()))


def _compared(processes: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """Per arm: the median step, and against no callback the difference per process and over the processes."""
    result: dict[str, Any] = {"median_step_s": {}, "per_process_s": {}}
    for arm in ARMS:
        result["median_step_s"][arm] = median([median(process[kind][arm]) for process in processes])
    for arm in ARMS[1:]:
        per_process = []
        for process in processes:
            turns = process[kind]
            differences = [value - base for value, base in zip(turns[arm], turns[BASELINE], strict=True)]
            per_process.append(_median_interval(differences))
        mean, low, high = _mean_interval([middle for middle, _, _ in per_process])
        result[arm] = {"difference_s": mean, "interval_s": [low, high]}
        result["per_process_s"][arm] = [list(values) for values in per_process]
    # the budget's measure: MidEpochResume against the empty Callback, their turns of the same round paired
    paired = []
    for process in processes:
        turns = process[kind]
        paired.append(
            _median_interval([ours - control for ours, control in zip(turns[OURS], turns[CONTROL], strict=True)])
        )
    mean, low, high = _mean_interval([middle for middle, _, _ in paired])
    result["above_control"] = {"difference_s": mean, "interval_s": [low, high]}
    return result


def measure(setting_index: int) -> dict[str, Any]:
    setting = SETTINGS[setting_index]
    processes = []
    for order in start_orders(ARMS, PROCESSES):
        progress(
            f"lock step: {setting.title}, process {len(processes) + 1} of {PROCESSES}, {len(ARMS)} arms in turns of "
            f"{STEPS_PER_TURN} steps, started in the order: {', '.join(order)}"
        )
        processes.append(_in_fresh_process(setting_index, order))
    return {
        "model": setting.title,
        "features": list(setting.features),
        "processes": len(processes),
        "turns": min(len(process["following"][BASELINE]) for process in processes),
        "core": processes[0]["core"],
        "steps_per_turn": STEPS_PER_TURN,
        "orders": [process["order"] for process in processes],
        **_compared(processes, "following"),
        "first_of_turn": _compared(processes, "first"),
    }


def _interval(difference: dict[str, Any]) -> str:
    low, high = difference["interval_s"]
    return f"{difference['difference_s'] * 1e6:+.1f} µs ({low * 1e6:+.1f} … {high * 1e6:+.1f})"


def _share(result: dict[str, Any]) -> tuple[float, float]:
    """The callback's added time as a share of the step without it: the estimate, and the upper 95% bound."""
    base = result["median_step_s"][BASELINE]
    return result[OURS]["difference_s"] / base, result[OURS]["interval_s"][1] / base


def _per_process(result: dict[str, Any]) -> str:
    """A table of one model's processes: each one's medians of the differences, with its own 95% interval."""
    rows = []
    for index, order in enumerate(result["orders"]):
        cells = []
        for arm in (OURS, CONTROL, AGAIN):
            middle, low, high = result["per_process_s"][arm][index]
            cells.append(f"{middle * 1e6:+.1f} µs ({low * 1e6:+.1f} … {high * 1e6:+.1f})")
        rows.append([index + 1, ", ".join(order), *cells])
    header = ["process", "threads started", *(f"{arm} minus none (its 95% interval)" for arm in (OURS, CONTROL, AGAIN))]
    return table(header, rows)


def markdown(results: list[dict[str, Any]]) -> str:
    header = [
        "model",
        "processes x turns x steps",
        *(f"{arm}: median step" for arm in ARMS),
        "MidEpochResume minus none, per step (95% interval)",
        "share of the step (at most, 95%)",
        "empty Callback minus none (95% interval)",
        "no callback again minus none: the measurement's error (95% interval)",
        "MidEpochResume minus empty Callback (95% interval)",
        f"budget ≤ {BUDGET_S * 1e6:.0f} µs above the empty Callback (measured; at 95%)",
        "first step of a turn: MidEpochResume minus none",
    ]
    rows = []
    for result in results:
        share, high = _share(result)
        rows.append(
            [
                result["model"],
                f"{result['processes']} x {result['turns']} x {result['steps_per_turn']}",
                *(f"{result['median_step_s'][arm] * 1e3:.3f} ms" for arm in ARMS),
                _interval(result[OURS]),
                f"{share:+.2%} ({high:+.2%})",
                _interval(result[CONTROL]),
                _interval(result[AGAIN]),
                _interval(result["above_control"]),
                _judged(result["above_control"]),
                _interval(result["first_of_turn"][OURS]),
            ]
        )
    core = results[0].get("core")
    return (
        f"The arms train at the same time, in threads that take turns of {STEPS_PER_TURN} steps (the order rotating "
        "from round to round), so that the drift of a shared machine's speed cancels in the differences between "
        f"turns of the same round; a step is timed in its thread's CPU time, {WARMUP_STEPS} warm-up steps per arm "
        f"first, every thread on one core{f' (core {core})' if core is not None else ''}. num_workers=0: the whole "
        "step runs in the arm's thread; num_workers=2: the thread's time is the main process's work per step, its "
        "workers (on the same core) loading ahead while the other arms take their turns. The step times compared "
        "are, per turn, the median of the steps after the first, each of which follows a step of its own arm as in a "
        "real run. Each model is measured in "
        f"{results[0]['processes']} fresh processes, which start the arms' threads in different orders; a difference "
        "is the mean of the processes' medians, and its 95% interval comes from the spread between the processes. "
        "The second arm without a callback shows the measurement's own error. The first step of a turn follows "
        "another arm's, in caches that arm filled: the last column shows what that costs, a cost that grows with the "
        "code a step runs (an upper bound).\n\n"
        + table(header, rows)
        + f"\n\nPer process, {results[0]['model']}:\n\n"
        + _per_process(results[0])
        + "\n\n"
        + verdict(results)
    )


def verdict(results: list[dict[str, Any]]) -> str:
    """The budget, judged on the MLP: the callback's time above an empty Callback's, and its upper 95% bound."""
    mlp = results[0]
    share, high = _share(mlp)
    above = mlp["above_control"]
    low_s, high_s = above["interval_s"]
    return (
        f"Lock step, {mlp['model']}, {mlp['processes']} processes: the callback adds "
        f"{mlp[OURS]['difference_s'] * 1e6:.1f} µs per step to no callback ({share:.2%}, at most {high:.2%}, of its "
        f"{mlp['median_step_s'][BASELINE] * 1e3:.2f} ms step), {above['difference_s'] * 1e6:.1f} µs more than an "
        f"empty Callback (95%: {low_s * 1e6:+.1f} to {high_s * 1e6:+.1f}), "
        f"{above['difference_s'] / REFERENCE_STEP_S:.3%} (at most {high_s / REFERENCE_STEP_S:.3%}) of a "
        f"{REFERENCE_STEP_S * 1e3:.0f} ms step; budget ≤ {BUDGET_S * 1e6:.0f} µs above the empty Callback: "
        f"{_judged(above)}."
    )


def _judged(above: dict[str, Any]) -> str:
    """The budget against the measured difference, and against the upper bound of its 95% interval."""
    measured = "met" if above["difference_s"] <= BUDGET_S else "**not met**"
    bound = "within" if above["interval_s"][1] <= BUDGET_S else "beyond"
    return f"{measured} (the upper 95% bound, {above['interval_s'][1] * 1e6:.1f} µs, is {bound} it)"


def run() -> dict[str, Any]:
    results = [measure(index) for index in range(len(SETTINGS))]
    return {"markdown": {"lockstep": markdown(results)}, "json": results, "plots": []}


if __name__ == "__main__":
    from _common import setup_process

    setup_process()
    if sys.argv[1:2] == ["--process"]:  # one process of :func:`measure`
        setting_index, order, out = int(sys.argv[2]), sys.argv[3].split(","), Path(sys.argv[4])
        out.write_text(json.dumps(one_process(SETTINGS[setting_index], order)))
    else:
        print(run()["markdown"]["lockstep"])
