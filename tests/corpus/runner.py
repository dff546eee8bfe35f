"""Run one corpus project (tests/corpus/projects) the ways issue 35 asks, and say what happened.

A project is a module with ``FOLLOWS`` (the public project it is patterned on) and ``main(run)``: the project's own
training script, which builds its model, data and ``Trainer`` as the original does, taking the ``Trainer``'s
keyword arguments from :meth:`Run.trainer_kwargs` (or :meth:`Run.trainer`) and fitting with :meth:`Run.fit`. The
runner then checks, in this process:

1. **transparency**: the uninterrupted fit with ``MidEpochResume`` and without it (stock) see the same batches (their
   bytes), end with bitwise the same weights, optimizer, scheduler and callback states, leave the process-wide
   random streams (torch, numpy's global generator whatever its bit generator, Python) in the same state, and leave
   files of the same names in their folders;
2. **saving is invisible**: a fit with the callback that writes a checkpoint at three moments (early; the middle of
   an epoch; an epoch's last batch, or a late batch where the run is one long epoch) and carries on is still stock's
   run;
3. **each resume** from those checkpoints, in a process whose random states were scrambled (as a fresh process's
   are), is ``exact`` (the remaining batches, bitwise the same final state), or ``warned`` (not exact, but a warning
   about the resume was issued before the first resumed batch reached the model), or ``error`` (the fit raised
   before training). Anything else, a silently inexact resume above all, is a failure.

``python tests/corpus/runner.py NAME...`` runs projects and prints their rows (for a quick look at one project).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib
import json
import logging
import pkgutil
import random
import re
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

if __package__ in (None, ""):  # run as a script: make `corpus` and the tests' helpers importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lightning.pytorch as L

from harness import _equal
from lightning_midepoch import MidEpochResume

PROJECTS_PACKAGE = "corpus.projects"
#: a warning "about the resume" (what a user reads as "this resume is not exact") names one of these
RESUME_WORDS = ("resum", "midepoch", "mid-epoch")


def project_names() -> list[str]:
    """Every project module in tests/corpus/projects, sorted."""
    package = importlib.import_module(PROJECTS_PACKAGE)
    return sorted(info.name for info in pkgutil.iter_modules(package.__path__) if not info.name.startswith("_"))


def load(name: str) -> Any:
    return importlib.import_module(f"{PROJECTS_PACKAGE}.{name}")


# ---------------------------------------------------------------- what one fit records
def digest(value: Any) -> str:
    """A short hash of a batch's bytes, whatever its structure (tensors, dicts, lists, numbers, strings)."""
    hasher = hashlib.blake2b(digest_size=8)

    def feed(item: Any) -> None:
        if isinstance(item, torch.Tensor):
            tensor = item.detach().cpu().contiguous()
            hasher.update(f"T{tensor.dtype}{tuple(tensor.shape)}".encode())
            hasher.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
        elif isinstance(item, np.ndarray):
            hasher.update(f"N{item.dtype}{item.shape}".encode() + np.ascontiguousarray(item).tobytes())
        elif isinstance(item, dict):
            for key in sorted(item, key=str):
                hasher.update(f"K{key}".encode())
                feed(item[key])
        elif isinstance(item, (list, tuple)):
            hasher.update(f"L{len(item)}".encode())
            for element in item:
                feed(element)
        else:
            hasher.update(f"V{item!r}".encode())

    feed(value)
    return hasher.hexdigest()


class _Recorder(L.Callback):
    """Records each training batch, marks when the first one reaches the model, and writes the checkpoints."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.run.first_batch_warning_index is None:
            self.run.first_batch_warning_index = len(self.run.caught)
        self.run.seen.append((trainer.current_epoch, batch_idx, trainer.global_step, digest(batch)))

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        moment = (trainer.current_epoch, batch_idx)
        if moment in self.run.save_at:
            path = self.run.save_at[moment]
            trainer.save_checkpoint(path)
            # the run's folder as a crash right here would leave it (ModelCheckpoint's files, logs), to resume in
            shutil.copytree(self.run.root, folder_as_of(path))


@dataclass
class Run:
    """One fit of a project: how it is set up (by the runner) and what it recorded."""

    root: Path
    callback: bool
    ckpt_path: Path | None = None
    save_at: dict[tuple[int, int], Path] = field(default_factory=dict)
    scramble_seed: int | None = None
    seen: list[tuple[int, int, int, str]] = field(default_factory=list)
    caught: list[warnings.WarningMessage] = field(default_factory=list)
    first_batch_warning_index: int | None = None
    fitted_trainer: L.Trainer | None = None
    fitted_model: L.LightningModule | None = None
    error: BaseException | None = None
    error_text: str = ""
    rng: dict[str, Any] = field(default_factory=dict)
    final: dict[str, Any] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)

    def callbacks(self, *project_callbacks: L.Callback) -> list[L.Callback]:
        """The project's callbacks, with ``MidEpochResume`` first when this run has it, and the runner's recorder."""
        ours: list[L.Callback] = [MidEpochResume()] if self.callback else []
        return [*ours, *project_callbacks, _Recorder(self)]

    def trainer_kwargs(self, *project_callbacks: L.Callback, **kwargs: Any) -> dict[str, Any]:
        """The ``Trainer`` arguments: the project's, on CPU, quiet, in this run's folder, with the callbacks."""
        defaults: dict[str, Any] = {
            "accelerator": "cpu",
            "devices": 1,
            "logger": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "enable_checkpointing": False,
            "default_root_dir": str(self.root),
        }
        return {**defaults, **kwargs, "callbacks": self.callbacks(*project_callbacks)}

    def trainer(self, *project_callbacks: L.Callback, **kwargs: Any) -> L.Trainer:
        return L.Trainer(**self.trainer_kwargs(*project_callbacks, **kwargs))

    def fit(self, trainer: L.Trainer, model: L.LightningModule, **fit_kwargs: Any) -> None:
        """``trainer.fit`` with this run's checkpoint; a resumed run first scrambles the process's random states."""
        self.fitted_trainer, self.fitted_model = trainer, model
        if self.scramble_seed is not None:
            scramble(self.scramble_seed)
        trainer.fit(model, ckpt_path=self.ckpt_path, **fit_kwargs)


def folder_as_of(checkpoint: Path) -> Path:
    """Where the runner keeps the run's folder as it was when ``checkpoint`` was written."""
    return checkpoint.with_suffix(".folder")


def scramble(seed: int) -> None:
    """Process-wide random states a fresh process could have; numpy's global generator keeps its bit generator."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.set_bit_generator(type(np.random.get_bit_generator())(seed))


@contextmanager
def _isolated_process_state() -> Iterator[None]:
    """What a project changes process-wide (numpy's global bit generator, say) is put back after its fit."""
    bit_generator = np.random.get_bit_generator()
    state = bit_generator.state
    try:
        yield
    finally:
        bit_generator.state = state
        np.random.set_bit_generator(bit_generator)


def fit_once(project: Any, run: Run) -> Run:
    """Run the project's ``main`` once, recording warnings (in order) and any exception."""
    run.root.mkdir(parents=True, exist_ok=True)
    with _isolated_process_state(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.caught = caught
        argv, sys.argv = sys.argv, [f"{project.__name__}.py"]  # what a script started without arguments sees
        try:
            project.main(run)
        except Exception as error:  # the runner classifies it: a crash is a finding, not the runner's failure
            run.error = error
            run.error_text = "".join(traceback.format_exception_only(type(error), error)).strip()
        finally:
            sys.argv = argv
            run.rng = random_streams()
            run.files = sorted(str(path.relative_to(run.root)) for path in run.root.rglob("*") if path.is_file())
            if run.fitted_trainer is not None:
                run.final = copy.deepcopy(final_state(run))  # as the fit left it, before anything else runs
    return run


def random_streams() -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_bit_generator().state,
        "python": random.getstate(),
    }


# ---------------------------------------------------------------- comparing fits
def final_state(run: Run) -> dict[str, Any]:
    """Everything a fit ends with that the next step of training would use."""
    trainer, model = run.fitted_trainer, run.fitted_model
    if trainer is None or model is None:
        raise RuntimeError("the project's main() never called run.fit()")
    callbacks = {
        type(callback).__qualname__: callback.state_dict()
        for callback in trainer.callbacks
        if not isinstance(callback, (_Recorder, MidEpochResume))
    }
    state = {
        "weights": model.state_dict(),
        "optimizers": [optimizer.state_dict() for optimizer in trainer.optimizers],
        "schedulers": [config.scheduler.state_dict() for config in trainer.lr_scheduler_configs],
        "callbacks": callbacks,
        "global_step": trainer.global_step,
        "epoch": trainer.current_epoch,
        "random streams": run.rng,
    }
    return _without_root(state, str(run.root))


def _without_root(value: Any, root: str) -> Any:
    """``value`` with the run's folder in strings replaced by ``<root>``: each run writes its files in its own.

    A logger's ``version_N`` folder is ``version_*``: a resumed run logs into a new version, as stock's does.
    """
    if isinstance(value, str):
        return re.sub(r"([/\\])version_\d+([/\\]|$)", r"\1version_*\2", value.replace(root, "<root>"))
    if isinstance(value, dict):
        return {_without_root(k, root): _without_root(v, root) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_without_root(v, root) for v in value) if not hasattr(value, "_fields") else value
    return value


def differences(expected: Run, actual: Run, skip_batches: int = 0) -> list[str]:
    """What differs between two fits: ``actual`` is compared with ``expected``'s batches from ``skip_batches`` on.

    Two whole fits (``skip_batches=0``) must also leave the same files in their folders (their names: a checkpoint's
    bytes hold the callback's state).
    """
    found = []
    tail = expected.seen[skip_batches:]
    if actual.seen != tail:
        first = next(
            (i for i, (a, b) in enumerate(zip(tail, actual.seen, strict=False)) if a != b),
            min(len(tail), len(actual.seen)),
        )
        found.append(
            f"batches differ from resumed batch {first + 1} on ({len(actual.seen)} seen, {len(tail)} expected; "
            f"expected {tail[first] if first < len(tail) else None}, got "
            f"{actual.seen[first] if first < len(actual.seen) else None})"
        )
    if not skip_batches and expected.files != actual.files:  # the same run: the same files (their names)
        only = sorted(set(expected.files) ^ set(actual.files))
        found.append(f"files differ ({', '.join(only[:4]) or 'their order'} in one run only)")
    mine, theirs = expected.final, actual.final
    for key in mine:
        if not _equal(mine[key], theirs[key]):
            found.append(f"{key} differ ({_where(mine[key], theirs[key], key)})")
    return found


def _where(first: Any, second: Any, path: str) -> str:
    """The first place (a path of keys) where two states differ, with both values when they are short."""
    if isinstance(first, dict) and isinstance(second, dict):
        if first.keys() != second.keys():
            return f"{path}: keys {sorted(map(str, first.keys() ^ second.keys()))} in one only"
        key = next(k for k in first if not _equal(first[k], second[k]))
        return _where(first[key], second[key], f"{path}.{key}")
    if isinstance(first, (list, tuple)) and isinstance(second, (list, tuple)) and len(first) == len(second):
        index = next(i for i, (a, b) in enumerate(zip(first, second, strict=True)) if not _equal(a, b))
        return _where(first[index], second[index], f"{path}[{index}]")
    text = f"{first!r} vs {second!r}"
    return path if len(text) > 240 or isinstance(first, torch.Tensor) else f"{path}: {text}"


@dataclass
class Moment:
    name: str
    epoch: int
    batch: int


def moments(full: Run, align: int = 1) -> list[Moment]:
    """Early, the middle of an epoch, and an epoch's last batch (a late batch in a run that is one long epoch).

    ``align``: checkpoints only after batches that end an optimizer step (gradient accumulation), as
    ``ModelCheckpoint(every_n_train_steps=...)`` writes them.
    """
    counts: dict[int, int] = {}
    for epoch, batch, _, _ in full.seen:
        counts[epoch] = max(counts.get(epoch, 0), batch + 1)

    def snap(batch: int) -> int:
        return max(align - 1, (batch + 1) // align * align - 1)

    epochs = sorted(counts)
    middle_epoch = epochs[1] if len(epochs) > 1 else epochs[0]
    chosen = [Moment("early", 0, snap(1)), Moment("mid-epoch", middle_epoch, snap(counts[middle_epoch] // 2))]
    if len(epochs) > 1:
        chosen.append(Moment("epoch's last batch", 0, counts[0] - 1))
    else:
        chosen.append(Moment("late", 0, snap(counts[0] - 3)))
    return chosen


# ---------------------------------------------------------------- one project
@dataclass
class ResumeOutcome:
    moment: str
    epoch: int
    batch: int
    outcome: str  # exact / warned / error / FAIL
    detail: str = ""
    warnings_before: list[str] = field(default_factory=list)


@dataclass
class ProjectResult:
    name: str
    follows: str
    transparent: bool
    transparency: list[str]
    saving_transparent: bool
    saving: list[str]
    resumes: list[ResumeOutcome]
    seconds: float = 0.0
    #: stock Lightning's resumes at the same moments (``check(compare_stock=True)``), for the table
    stock_resumes: list[ResumeOutcome] | None = None

    @property
    def ok(self) -> bool:
        return self.transparent and self.saving_transparent and all(r.outcome != "FAIL" for r in self.resumes)

    def explain(self) -> str:
        lines = [f"{self.name} ({self.follows}):"]
        if not self.transparent:
            lines.append(f"  uninterrupted fit differs from stock: {'; '.join(self.transparency)}")
        if not self.saving_transparent:
            lines.append(f"  a fit that writes checkpoints differs from stock: {'; '.join(self.saving)}")
        for resume in self.resumes:
            lines.append(
                f"  resume at {resume.moment} (epoch {resume.epoch}, batch {resume.batch}): "
                f"{resume.outcome} {resume.detail}".rstrip()
            )
        return "\n".join(lines)


def _resume_warnings(run: Run) -> tuple[list[str], list[str]]:
    """The resume-related warnings of a run: those before the first batch reached the model, and those after."""
    mark = run.first_batch_warning_index if run.first_batch_warning_index is not None else len(run.caught)
    before, after = [], []
    for index, caught in enumerate(run.caught):
        text = str(caught.message)
        # a path in a warning (a checkpoint folder that exists, say) may hold any word: not counted
        if any(word in re.sub(r"\S*[/\\]\S*", "<path>", text).lower() for word in RESUME_WORDS):
            (before if index < mark else after).append(f"{caught.category.__name__}: {text}")
    return before, after


def _diverged(run: Run) -> list[str]:
    """A project whose weights end as NaN or infinite compares nothing (NaN is not equal to itself): shrink it again."""
    assert run.fitted_model is not None
    bad = [name for name, value in run.fitted_model.named_parameters() if not bool(torch.isfinite(value).all())]
    return [f"the project diverged: {', '.join(bad)} not finite in the stock fit"] if bad else []


def _fit_failure(run: Run) -> list[str]:
    return [f"the fit raised {run.error_text}"] if run.error is not None else []


def classify_resume(full: Run, resumed: Run, done: int, moment: Moment) -> ResumeOutcome:
    before, after = _resume_warnings(resumed)
    outcome = ResumeOutcome(moment.name, moment.epoch, moment.batch, "FAIL", warnings_before=before)
    if resumed.error is not None:
        if not resumed.seen:
            outcome.outcome, outcome.detail = "error", resumed.error_text
        else:
            outcome.detail = f"raised after {len(resumed.seen)} resumed batches: {resumed.error_text}"
        return outcome
    found = differences(full, resumed, skip_batches=done)
    if not found:
        outcome.outcome = "exact"
        outcome.detail = f"(warned: {before[0]})" if before else ""
    elif before:
        outcome.outcome, outcome.detail = "warned", f"{before[0]} [differs: {'; '.join(found)}]"
    else:
        late = f"; warned only after training started: {after[0]}" if after else ""
        outcome.detail = f"silently inexact: {'; '.join(found)}{late}"
    return outcome


def check(
    name: str | ModuleType,
    root: Path,
    *,
    with_callback: bool = True,
    compare_stock: bool = False,
) -> ProjectResult:
    """The whole check of one project, in folders under ``root``.

    The fit that writes the checkpoints runs in ``root/run``; each resume runs in that same folder (as a user resumes
    where the run wrote its files), as it was when its checkpoint was written. ``name``: a project of the corpus, or
    a module of the same shape; ``with_callback=False`` writes the checkpoints and resumes as stock Lightning does
    (the runner's own tests); ``compare_stock`` also resumes stock Lightning at the same moments, for the table.
    """
    start = time.perf_counter()
    project = load(name) if isinstance(name, str) else name
    stock = fit_once(project, Run(root / "stock", callback=False))
    ours = fit_once(project, Run(root / "with-callback", callback=True))
    transparency = _fit_failure(stock) or _fit_failure(ours) or _diverged(stock) or differences(stock, ours)
    chosen = moments(stock, getattr(project, "ALIGN", 1)) if stock.seen else []
    saving, resumes = _write_and_resume(project, stock, chosen, root / "ours", with_callback)
    stock_resumes = _write_and_resume(project, stock, chosen, root / "theirs", False)[1] if compare_stock else None
    name = project.__name__.rpartition(".")[2]
    elapsed = time.perf_counter() - start
    return ProjectResult(
        name, project.FOLLOWS, not transparency, transparency, not saving, saving, resumes, elapsed, stock_resumes
    )


def _write_and_resume(
    project: Any, stock: Run, chosen: list[Moment], root: Path, callback: bool
) -> tuple[list[str], list[ResumeOutcome]]:
    """A fit writing a checkpoint at each moment (what differs from ``stock``), and the resume from each."""
    checkpoints = {(m.epoch, m.batch): root / "moments" / f"{m.epoch}-{m.batch}.ckpt" for m in chosen}
    run_folder = root / "run"
    saving_run = fit_once(project, Run(run_folder, callback=callback, save_at=checkpoints))
    saving = _fit_failure(saving_run) or differences(stock, saving_run)
    resumes = []
    for index, moment in enumerate(chosen):
        path = checkpoints[(moment.epoch, moment.batch)]
        if not path.exists():
            resumes.append(ResumeOutcome(moment.name, moment.epoch, moment.batch, "FAIL", "no checkpoint written"))
            continue
        shutil.rmtree(run_folder)
        shutil.copytree(folder_as_of(path), run_folder)
        done = 1 + next(i for i, s in enumerate(stock.seen) if (s[0], s[1]) == (moment.epoch, moment.batch))
        resumed = fit_once(project, Run(run_folder, callback=callback, ckpt_path=path, scramble_seed=1000 + index))
        resumes.append(classify_resume(stock, resumed, done, moment))
    return saving, resumes


# ---------------------------------------------------------------- the table
def table(results: list[dict[str, Any]]) -> str:
    """The corpus's table (markdown), one row per project, from :func:`check` results as dicts."""
    lines = [
        "| project | follows | uninterrupted equal | early | mid-epoch | epoch's last batch (or late) "
        "| stock Lightning's three resumes | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for result in sorted(results, key=lambda r: r["name"]):
        equal = "y" if result["transparent"] and result["saving_transparent"] else "**n**"
        cells = []
        for resume in result["resumes"]:
            text = resume["outcome"] if resume["outcome"] != "FAIL" else "**FAIL**"
            if resume["outcome"] in ("warned", "error", "FAIL") or resume["detail"]:
                text += f": {resume['detail'][:300]}"
            cells.append(text.replace("|", "\\|").replace("\n", " "))
        cells += [""] * (3 - len(cells))
        stock = " / ".join(r["outcome"] for r in result.get("stock_resumes") or []) or "not run"
        lines.append(
            f"| {result['name']} | {result['follows']} | {equal} | {' | '.join(cells)} | {stock} "
            f"| {result['seconds']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="projects to run (default: all)")
    parser.add_argument("--out", type=Path, help="write each project's result as NAME.json here")
    parser.add_argument("--stock", action="store_true", help="also resume stock Lightning at the same moments")
    parser.add_argument("--table", type=Path, metavar="DIR", help="only print the table of the results in DIR")
    args = parser.parse_args(argv)
    if args.table is not None:
        print(table([json.loads(path.read_text()) for path in sorted(args.table.glob("*.json"))]))
        return 0
    failed = 0
    rows = []
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):  # Lightning's informational lines
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in args.names or project_names():
        with tempfile.TemporaryDirectory() as directory:
            result = check(name, Path(directory), compare_stock=args.stock)
        print(result.explain(), flush=True)
        rows.append(asdict(result))
        failed += not result.ok
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{name}.json").write_text(json.dumps(asdict(result), indent=1))
    print(table(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
