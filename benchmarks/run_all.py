"""Run every benchmark and write ``benchmarks/results/``: ``summary.md`` (all tables, the headline numbers and the
command that reproduces them), ``results.json`` (every measurement) and the PNG plots.

Usage: ``make bench`` (creates the virtual environment, installs ``requirements/bench.txt``, runs this), or
``python benchmarks/run_all.py`` in an environment that has them.
"""

from __future__ import annotations

import json
import os
import platform
import time
from importlib.metadata import version
from typing import Any

import bench_fingerprint
import bench_lockstep
import bench_overhead
import bench_preemption
import bench_resume
import bench_size_memory
import bench_workers
from _common import RESULTS_DIR, progress, ratio, seconds, setup_process

REPRODUCE = "make bench"
PACKAGES = ("lightning-midepoch", "torch", "lightning", "accelerate", "torchdata", "numpy")


def environment() -> dict[str, Any]:
    """What the numbers were measured with and on."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": 1,
        "packages": {name: version(name) for name in PACKAGES},
        "load_average_at_start": os.getloadavg(),
    }


def headline(results: dict[str, Any]) -> list[str]:
    """The numbers the README quotes, from the measurements."""
    lines = []
    for comparison in results["resume"]["comparison"]:
        last = str(comparison["positions"][-1])
        approaches = comparison["approaches"]
        ours = approaches[bench_resume.OURS_FIT]
        discard = approaches[bench_resume.DISCARD]
        lines.append(
            f"- Resume at k = {int(last):,} vs. k = 0 ({comparison['sampler']}, {comparison['epoch_samples']:,} "
            f"samples): MidEpochResume through `fit()` {seconds(ours[last]['median_s'])} vs. "
            f"{seconds(ours['0']['median_s'])} ({ratio(ours[last]['median_s'] / ours['0']['median_s'])}); "
            f"iterate-and-discard {seconds(discard[last]['median_s'])}"
            f"{' (extrapolated)' if discard[last]['extrapolated'] else ''} vs. {seconds(discard['0']['median_s'])} "
            f"({ratio(discard[last]['median_s'] / discard['0']['median_s'])})."
        )
    goal = results["resume"]["goal"]
    worst = max(goal, key=lambda row: row["ratio"])
    met = sum(row["goal_met"] for row in goal)
    lines.append(
        f"- Resume at 90% of the epoch vs. at its start: goal ≤ {bench_resume.GOAL_RATIO}x met in {met} of "
        f"{len(goal)} cases; largest ratio {ratio(worst['ratio'])} ({worst['sampler']}, "
        f"{worst['epoch_samples']:,} samples, {worst['level']})."
    )
    for setting in results["overhead"]:
        cpu, wall = setting["cpu"], setting["wall"]
        lines.append(
            f"- Steady-state overhead, {setting['model']}: {cpu['median_difference_s'] * 1e6:+.0f} µs per step, "
            f"ratio {cpu['median_ratio']:.3f} (main-process CPU), {wall['median_ratio']:.3f} (wall clock); an empty "
            f"Callback: {cpu['median_control_ratio']:.3f} (CPU)."
        )
    lines.append(f"- {bench_overhead.projection(results['overhead'])}")
    for setting in results["lockstep"]:
        ours, base = setting[bench_lockstep.OURS], setting["median_step_s"][bench_lockstep.BASELINE]
        low, high = ours["interval_s"]
        error_low, error_high = setting[bench_lockstep.AGAIN]["interval_s"]
        lines.append(
            f"- Steady-state overhead in lock step ({setting['processes']} processes), {setting['model']}: "
            f"{ours['difference_s'] * 1e6:+.1f} µs per step (95%: {low * 1e6:+.1f} to {high * 1e6:+.1f}), "
            f"{ours['difference_s'] / base:+.2%} of its {base * 1e3:.2f} ms step; no callback against itself: "
            f"{setting[bench_lockstep.AGAIN]['difference_s'] * 1e6:+.1f} µs ({error_low * 1e6:+.1f} to "
            f"{error_high * 1e6:+.1f})."
        )
    lines.append(f"- {bench_lockstep.verdict(results['lockstep'])}")
    sizes = [row["state_bytes"] for row in results["size_memory"]["state_size"]]
    memory = results["size_memory"]["memory"]
    lines.append(
        f"- Checkpoint entry: {min(sizes):,} to {max(sizes):,} B, independent of the dataset size "
        f"({', '.join(f'{size:,}' for size in bench_size_memory.STATE_SIZES)} samples)."
    )
    lines.append(
        "- Peak memory growth on a 10^7-sample epoch: resume at 90% "
        f"{memory['resume_late']['rss_growth_bytes'] / 2**20:,.0f} MiB, fresh epoch start "
        f"{memory['fresh_fit']['rss_growth_bytes'] / 2**20:,.0f} MiB, the sampler alone "
        f"{memory['sampler']['rss_growth_bytes'] / 2**20:,.0f} MiB."
    )
    workers = results["workers"]
    recording = max(row["recording_s"] for row in workers["worker"])
    worst = max(row["ratio"] for row in workers["worker"])
    per_worker = [row["per_worker_bytes"] for row in workers["checkpoint"]]
    lines.append(
        f"- DataLoader workers: recording their random states costs {recording * 1e6:.0f} µs per batch in each"
        f" worker (at most {worst:.1%} of loading and collating the batch) and "
        f"{workers['main_process']['added_s'] * 1e6:+.2f} µs per batch in the main process; the checkpoint holds "
        f"{min(per_worker):,.0f} to {max(per_worker):,.0f} B per worker."
    )
    preemption = results["preemption"]
    lines.append(f"- {bench_preemption.verdict(preemption['one_process'], preemption['ddp'])}")
    image = results["fingerprint"]["fingerprint"][0]
    lines.append(
        f"- The resume's self-check: one fingerprint of a {image['batch']} batch takes"
        f" {image['fingerprint_s'] * 1e3:.0f} ms (SHA-256 of its bytes alone {image['sha256_s'] * 1e3:.0f} ms,"
        f" torch.save of it {image['torch_save_s'] * 1e3:.0f} ms), once per checkpoint and once per resume."
    )
    return lines


def summary(results: dict[str, Any], sections: dict[str, str], runtime_s: float) -> str:
    env = results["environment"]
    packages = ", ".join(f"{name} {value}" for name, value in env["packages"].items())
    load_start = ", ".join(f"{value:.2f}" for value in env["load_average_at_start"])
    load_end = ", ".join(f"{value:.2f}" for value in env["load_average_at_end"])
    return "\n\n".join(
        [
            "# Benchmarks",
            f"Reproduce from a fresh clone with `{REPRODUCE}` (it creates `.venv`, installs `requirements/bench.txt` "
            "and runs `benchmarks/run_all.py`, which writes this file, `results.json` and the plots next to it).",
            f"Measured with Python {env['python']} on {env['platform']}, {env['cpu_count']} CPU cores, one torch "
            f"thread; {packages}. The machine is shared: load average {load_start} at the start and {load_end} at "
            f"the end (1, 5, 15 minutes). Times are medians of several interleaved runs, and every ratio compares "
            f"runs of the same invocation. The whole run took {runtime_s / 60:.1f} minutes.",
            "## Headline",
            "\n".join(headline(results)),
            "## 1. Time to resume vs. position",
            sections["comparison"],
            "![time to resume vs. position](resume_vs_position.png)",
            "### Goal: at 90% of the epoch within 1.2x of the epoch's start",
            sections["goal"],
            "![resume at 90% vs. start](resume_goal.png)",
            "## 2. Steady-state overhead",
            sections["overhead"],
            "![overhead](overhead.png)",
            "### In lock step: the arms take turns of a few steps",
            sections["lockstep"],
            "## 3. Checkpoint size and memory",
            sections["size_memory"],
            "## 4. DataLoader workers: recording their random states",
            sections["workers"],
            "## 5. Pre-emption: serving signals at consistent points",
            sections["preemption"],
            f"![per-step collectives under DDP]({bench_preemption.PLOT})",
            "## 6. The resume's self-check: the fingerprint of the last batch trained",
            sections["fingerprint"],
            f"![one fingerprint vs. baselines]({bench_fingerprint.PLOT})",
        ]
    )


def main() -> None:
    setup_process()
    started = time.perf_counter()
    results: dict[str, Any] = {"environment": environment()}
    progress(f"benchmarks: results go to {RESULTS_DIR}")
    sections: dict[str, str] = {}
    modules = (
        ("resume", bench_resume),
        ("overhead", bench_overhead),
        ("lockstep", bench_lockstep),
        ("size_memory", bench_size_memory),
        ("workers", bench_workers),
        ("preemption", bench_preemption),
        ("fingerprint", bench_fingerprint),
    )
    for name, module in modules:
        section_started = time.perf_counter()
        outcome = module.run()
        results[name] = outcome["json"]
        sections.update(outcome["markdown"])
        progress(f"{name}: done in {time.perf_counter() - section_started:.0f} s")
    runtime = time.perf_counter() - started
    results["environment"]["load_average_at_end"] = os.getloadavg()
    results["runtime_s"] = runtime
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    text = summary(results, sections, runtime)
    (RESULTS_DIR / "summary.md").write_text(text + "\n")
    print(text)
    progress(f"benchmarks: done in {runtime / 60:.1f} minutes; see {RESULTS_DIR / 'summary.md'}")


if __name__ == "__main__":
    main()
