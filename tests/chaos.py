"""Pre-emption chaos: deliver a signal at a reproducible moment of a fit, let the job be stopped, resume, compare.

A delivery is reproducible on a busy machine when it is counted, not timed: :class:`Trigger` counts the lines the
main thread runs (``sys.settrace``, tests only) and raises the signal at the N-th, and then plays what follows as the
flow's scheduler would (SLURM: the requeue's SIGTERM, then the kill). The job then ends, and a second job resumes the
way the flow resumes (Lightning's own hpc restore with no ``ckpt_path``, ``ckpt_path="hpc"``, or the checkpoint's
path). The oracle is the uninterrupted run of the same :class:`~harness.Config`.

Flows (:data:`FLOWS`):

* ``slurm``: ``SLURMEnvironment(auto_requeue=True)``, SIGUSR1, resumed by Lightning without ``ckpt_path``;
* ``slurm-custom``: the same with ``requeue_signal=SIGHUP``, resumed with ``ckpt_path="hpc"``;
* ``sigterm``: SIGTERM as Lightning handles it, ``OnExceptionCheckpoint`` writes the checkpoint;
* ``user``: the user's own SIGUSR2 handler, installed before ``fit``, calls ``trainer.save_checkpoint``.

``python tests/chaos.py --deliveries 300 [--seed S] [--stock]`` runs them all and prints, per flow, the deliveries,
the exact resumes and where the signals landed (``make chaos``).
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import importlib
import logging
import multiprocessing
import os
import random
import signal
import stat
import sys
import threading
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch

from harness import NAMESPACE, Config, L, Model, OnExceptionCheckpoint, RunResult, assert_same_state
from lightning_midepoch import MidEpochResume

SLURMEnvironment = importlib.import_module(f"{NAMESPACE}.plugins.environments").SLURMEnvironment

#: the environment of a one-task SLURM job (Lightning detects SLURM from it and restores its hpc checkpoints)
SLURM_ENV = {
    "SLURM_NTASKS": "1",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_JOB_NAME": "train",
    "SLURM_JOB_ID": "4242",
    "SLURM_NODEID": "0",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODELIST": "localhost",
}


#: the signals a job's handlers may hold
JOB_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGHUP)


@dataclass(frozen=True)
class Flow:
    name: str
    signum: int
    resume: str  # "auto" (no ckpt_path, Lightning finds the hpc checkpoint), "hpc", or "path"


FLOWS = {
    "slurm": Flow("slurm", signal.SIGUSR1, "auto"),
    "slurm-custom": Flow("slurm-custom", signal.SIGHUP, "hpc"),
    "sigterm": Flow("sigterm", signal.SIGTERM, "path"),
    "user": Flow("user", signal.SIGUSR2, "path"),
}

#: a 2-epoch run with dropout, random augmentation in __getitem__ and a validation in the middle of each epoch
CONFIG = Config(augment=True, max_epochs=2, validation=True, val_check_interval=0.5)


class Killed(BaseException):
    """The job's process is killed (SIGKILL): nothing after this moment counts."""


class Trigger:
    """Raise ``signum`` at the ``at``-th line the main thread runs, then play what the scheduler does next.

    SLURM: once the requeue ran (the fake ``scontrol`` wrote ``requeued``), SIGTERM, then the kill ``grace`` lines
    later. Others: the kill ``grace`` lines after the checkpoint file appeared (the user's handler, then the job is
    stopped), or never (SIGTERM ends the job by itself).
    """

    def __init__(
        self,
        at: int,
        signum: int,
        job_dir: Path,
        *,
        slurm: bool,
        watch: Path | None,
        grace: int,
        callback: bool = True,
        record: tuple[str, ...] = (),
        kill_line: int | None = None,
        kill_recorded: tuple[str, int] | None = None,
    ) -> None:
        self.callback = callback
        self.record = record  # record the lines run in files whose path contains one of these
        self.recorded: list[int] = []
        self.recorded_names: list[str] = []  # the function each recorded line is in
        # kill at the recorded line this many after the first one in this function (counted from there, they do not
        # drift from run to run as the count of every line run does)
        self.kill_recorded = kill_recorded
        self.marker: int | None = None
        self.at, self.signum, self.job_dir, self.slurm, self.watch, self.grace = (
            at,
            signum,
            job_dir,
            slurm,
            watch,
            grace,
        )
        self.lines = 0
        self.handled: list[int] = []  # (probe) the first and the last line at which the signal had a handler
        self.landed: str | None = None  # where the signal was raised: "module:function"
        self.kill_at: int | None = kill_line  # the kill's line (else set once the flow's scheduler ends the job)
        self.sigterm_sent = False

    def __enter__(self) -> Trigger:
        self.forked = False
        self.pid = os.getpid()
        self.previous = sys.gettrace()  # coverage's tracer under `make test`: set back after the fit
        _ACTIVE.append(self)
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(self.previous)
        _ACTIVE.remove(self)

    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return None
        return self._local

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if self.forked:  # a DataLoader worker forked from the traced process: only the main process counts
            return None
        if event != "line":
            return self._local
        self.lines += 1
        if self.record and any(part in frame.f_code.co_filename.replace(os.sep, "/") for part in self.record):
            self.recorded.append(self.lines)
            self.recorded_names.append(frame.f_code.co_name)
            if self.kill_recorded is not None:
                if self.marker is None and frame.f_code.co_name == self.kill_recorded[0]:
                    self.marker = len(self.recorded) - 1
                if self.marker is not None and len(self.recorded) - 1 - self.marker >= self.kill_recorded[1]:
                    sys.settrace(None)
                    raise Killed
        if self.at < 0:  # the probe: where a delivery finds a handler (before Lightning's, the signal kills)
            handler = signal.getsignal(self.signum)
            if _deferred(handler) or (callable(handler) and (not self.callback or _lightnings(handler))):
                if self.handled:
                    self.handled[1] = self.lines
                else:
                    self.handled = [self.lines, self.lines]
            return self._local
        acts = self.lines == self.at or (self.lines > self.at and self.lines % 64 == 0)
        acts = acts or (self.kill_at is not None and self.lines >= self.kill_at)
        if acts and os.getpid() != self.pid:  # a child forked before its at-fork hook ran: never acts
            self.forked = True
            return None
        if self.lines == self.at:
            self.landed = where(frame)
            signal.raise_signal(self.signum)
        elif self.lines > self.at and self.lines % 64 == 0:
            self._scheduler()
        if self.kill_at is not None and self.lines >= self.kill_at:
            sys.settrace(None)
            raise Killed
        return self._local

    def _scheduler(self) -> None:
        if self.kill_at is not None:
            return
        if self.slurm and (self.job_dir / "requeued").exists():
            if not self.sigterm_sent:
                self.sigterm_sent = True
                signal.raise_signal(signal.SIGTERM)  # scontrol requeue: SLURM ends the job
            self.kill_at = self.lines + self.grace  # ... and kills it after KillWait
        elif self.watch is not None and self.watch.exists():
            self.kill_at = self.lines + self.grace


_ACTIVE: list[Trigger] = []


def _forked_child() -> None:
    # a DataLoader worker forked during a traced fit: it neither counts nor stops; the tracer the process had before
    # (coverage's, under `make test`) goes on in it
    for trigger in _ACTIVE:
        trigger.forked = True
        sys.settrace(trigger.previous)


os.register_at_fork(after_in_child=_forked_child)


def _deferred(handler: object) -> bool:
    """The callback's deferral holds the signal (from Lightning's registration of its handlers to its teardown)."""
    return type(getattr(handler, "__self__", None)).__name__ == "SignalDeferral"


def _lightnings(handler: object) -> bool:
    """Lightning's own handler (its SIGTERM notifier, not deferred in one process): from its registration on."""
    return type(handler).__name__ == "_HandlersCompose"


#: what the main thread is doing, by a function on its stack (innermost first) and the file it is in: the buckets
#: of the histogram of where signals land
ACTIVITIES = (
    ("optimizer step", "torch/optim/", ("step", "_single_tensor_sgd", "_multi_tensor_sgd", "sgd")),
    ("fetch: dataset, collate", "", ("__getitem__", "__getitems__", "default_collate", "collate", "_next_data")),
    ("batch to device", "", ("batch_to_device", "move_data_to_device", "_on_before_batch_transfer")),
    ("backward", "", ("backward", "manual_backward")),
    ("training_step, forward", "", ("training_step",)),
    ("validation", "", ("validation_step", "_evaluation_step", "_on_evaluation_start", "_on_evaluation_end")),
    ("checkpoint save", "", ("save_checkpoint",)),
    ("callback hooks", "", ("_call_callback_hooks",)),
    ("lightning loops", "lightning/pytorch/loops/", ("",)),
)


def where(frame: FrameType) -> str:
    """What the main thread is doing when the signal lands (a histogram bucket), and the innermost function."""
    innermost = frame.f_code.co_name
    stack: FrameType | None = frame
    while stack is not None:
        filename, name = stack.f_code.co_filename.replace(os.sep, "/"), stack.f_code.co_name
        for activity, place, names in ACTIVITIES:
            if place in filename and (name in names or names == ("",)):
                return f"{activity}:{innermost}"
        stack = stack.f_back
    return f"other:{innermost}"


def fake_scontrol(folder: Path) -> Path:
    """An ``scontrol`` for the PATH: ``scontrol requeue JOB`` adds a line to ``$CHAOS_JOB_DIR/requeued``; succeeds."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "scontrol"
    script.write_text('#!/bin/sh\necho "$@" >> "$CHAOS_JOB_DIR/requeued"\n')  # (one line per requeue)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return folder


@dataclass
class Job:
    result: RunResult | None
    trigger: Trigger | None
    ended: str  # "finished", "killed", "sigterm"


def _trainer(config: Config, flow: Flow, job_dir: Path, callback: bool, extra: list[Any]) -> L.Trainer:
    # the user's handler writes a checkpoint: declared, so that it runs at consistent points
    declared = (flow.signum,) if flow.name == "user" else ()
    callbacks: list[Any] = ([MidEpochResume(checkpoint_signals=declared)] if callback else []) + extra
    plugins = []
    if flow.name.startswith("slurm"):
        plugins.append(SLURMEnvironment(auto_requeue=True, requeue_signal=flow.signum))  # (real-time ones too)
    if flow.name == "sigterm":
        callbacks.append(OnExceptionCheckpoint(dirpath=job_dir))
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=flow.name == "sigterm",
        num_sanity_val_steps=0,
        deterministic=True,
        callbacks=callbacks,
        default_root_dir=job_dir,
        plugins=plugins,
        **config.trainer_kwargs(),
    )


class _SaveCounter(L.Callback):
    """Records, in each checkpoint, how many batches the model had trained when it was written (test bookkeeping)."""

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        checkpoint["chaos_trained"] = len(pl_module.seen)


def run_job(
    config: Config,
    flow: Flow,
    job_dir: Path,
    *,
    callback: bool = True,
    at: int | None = None,
    ckpt_path: str | None = None,
    seed: int = 1,
    grace: int = 3000,
    record: tuple[str, ...] = (),
    kill_line: int | None = None,
    kill_recorded: tuple[str, int] | None = None,
    extra_callbacks: tuple[Any, ...] = (),
) -> Job:
    """One job of ``flow``: with ``at``, the signal lands at that line and the job is stopped as the flow stops it."""
    # each job is a process of its own: whatever handlers a killed job left behind are gone with it
    handlers = {signum: signal.getsignal(signum) for signum in JOB_SIGNALS}
    try:
        L.seed_everything(seed, verbose=False)
        model = Model(config)
        if ckpt_path is not None:
            L.seed_everything(seed + 1000, verbose=False)
        trainer = _trainer(config, flow, job_dir, callback, [_SaveCounter(), *extra_callbacks])
        user_ckpt = job_dir / "preempted.ckpt"
        if flow.name == "user":

            def save_on_signal(signum: int, frame: Any) -> None:  # the pattern of a Kubernetes preStop handler
                trainer.save_checkpoint(user_ckpt)

            signal.signal(flow.signum, save_on_signal)
        trigger = None
        ended = "finished"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                if at is not None:
                    watch = user_ckpt if flow.name == "user" else None
                    slurm = flow.name.startswith("slurm")
                    trigger = Trigger(
                        at,
                        flow.signum,
                        job_dir,
                        slurm=slurm,
                        watch=watch,
                        grace=grace,
                        callback=callback,
                        record=record,
                        kill_line=kill_line,
                        kill_recorded=kill_recorded,
                    )
                    with trigger:
                        trainer.fit(model, ckpt_path=ckpt_path)
                else:
                    trainer.fit(model, ckpt_path=ckpt_path)
            except Killed:
                ended = "killed"
            except SystemExit:  # Lightning's SIGTERMException
                ended = "sigterm"
            except Exception as error:
                if not _after_the_kill(error):
                    raise
                ended = "killed"  # (Lightning's teardown, after the kill: a real kill runs none of it)
        return Job(RunResult(model, trainer, False, {}), trigger, ended)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def _after_the_kill(error: BaseException) -> bool:
    """Whether ``error`` was raised while the job's kill (:class:`Killed`, an exception standing for SIGKILL) was being
    handled: what runs then (``on_exception``, Lightning's teardown) runs only because the kill is simulated."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, Killed):
            return True
        seen = seen.__context__
    return False


def count_lines(config: Config, flow: Flow, job_dir: Path, *, callback: bool = True) -> tuple[int, int]:
    """The lines of an uninterrupted fit at which the signal has a handler: the first and the last.

    Deliveries are drawn between them: before Lightning registers its handlers (and after it restores the previous
    ones) the signal's default action ends the process, as it does in a real job.
    """
    # the job's folder exists, as a delivery's does (deliver): Lightning looks for hpc checkpoints in an existing
    # one, and those lines shift the handlers' registration (a signal drawn before it would end the campaign)
    job_dir.mkdir(parents=True, exist_ok=True)
    job = run_job(config, flow, job_dir, at=-1, callback=callback)
    assert job.trigger is not None
    assert job.trigger.handled, f"{flow.name}: the signal never had a handler"
    first, last = job.trigger.handled
    return first, last


@dataclass
class Outcome:
    flow: str
    at: int
    landed: str | None
    checkpoint: str | None  # the file the resumed job started from
    exact: bool
    why: str = ""


def _resume_checkpoint(flow: Flow, job_dir: Path) -> tuple[str | None, Path | None]:
    """The ``ckpt_path`` the flow's next job passes, and the file it resumes from (None: it starts over)."""
    if flow.name.startswith("slurm"):
        files = sorted(job_dir.glob("hpc_ckpt_*.ckpt"), key=lambda path: int(path.stem.rsplit("_", 1)[1]))
        if not files:
            return None, None
        return (None if flow.resume == "auto" else "hpc"), files[-1]
    name = "on_exception.ckpt" if flow.name.startswith("sigterm") else "preempted.ckpt"
    path = job_dir / name
    return (str(path), path) if path.exists() else (None, None)


def deliver(config: Config, flow: Flow, at: int, job_dir: Path, full: RunResult, *, callback: bool = True) -> Outcome:
    """Signal a job at line ``at``, stop it as the flow does, resume as the flow does, and compare with ``full``."""
    job_dir.mkdir(parents=True, exist_ok=True)
    os.environ["CHAOS_JOB_DIR"] = str(job_dir)
    first = run_job(config, flow, job_dir, callback=callback, at=at)
    assert first.trigger is not None
    landed = first.trigger.landed
    ckpt_path, source = _resume_checkpoint(flow, job_dir)
    if source is None and first.ended == "finished" and first.result is not None:  # served after training: done
        why = "" if first.result.model.seen == full.model.seen else "batches differ"
        try:
            assert_same_state(full, first.result)
        except AssertionError as error:
            why = why or f"state differs: {error}"
        return Outcome(flow.name, at, landed, None, not why, why)
    if source is None:
        return Outcome(flow.name, at, landed, None, False, f"no checkpoint written (job {first.ended})")
    if (served := _served_twice(job_dir)) is not None:
        return Outcome(flow.name, at, landed, source.name, False, served)
    trained = int(torch.load(source, weights_only=False, map_location="cpu")["chaos_trained"])
    before = first.result.model.seen[:trained] if first.result is not None else []
    second = run_job(config, flow, job_dir, callback=callback, ckpt_path=ckpt_path if ckpt_path else None, seed=2)
    assert second.result is not None
    why = ""
    if before + second.result.model.seen != full.model.seen:
        why = "batches differ"
    else:
        try:
            assert_same_state(full, second.result)
        except AssertionError as error:
            why = f"state differs: {error}"
    return Outcome(flow.name, at, landed, source.name, not why, why)


def _served_twice(job_dir: Path) -> str | None:
    """What shows that the signal of one delivery was served twice: a second requeue, a second hpc checkpoint."""
    requeued = job_dir / "requeued"
    requeues = len(requeued.read_text().splitlines()) if requeued.exists() else 0
    hpc = len(list(job_dir.glob("hpc_ckpt_*.ckpt")))
    if requeues > 1 or hpc > 1:
        return f"served twice: {requeues} requeues, {hpc} hpc checkpoints"
    return None


def uninterrupted(config: Config, flow: Flow, job_dir: Path, *, callback: bool = True) -> RunResult:
    job = run_job(config, flow, job_dir, callback=callback)
    assert job.result is not None
    return job.result


# ---------------------------------------------------------------------------------------------------- DDP
DDP_CONFIG = Config(augment=True, max_epochs=2, dataset_size=160, validation=True, val_check_interval=0.5)
SLURM_JOB = Path(__file__).resolve().parent / "slurm_job.py"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def slurm_step(
    job_dir: Path,
    attempt: int,
    signal_after: list[float | None] | None,
    *,
    stock: bool = False,
    timeout: float = 240,
    flow: str = "slurm",
    resume: Path | None = None,
    extra: tuple[str, ...] = (),
) -> str:
    """Run one attempt of a 2-task SLURM job step (``tests/slurm_job.py`` per task): "done" or "hang"."""
    codes = slurm_step_codes(
        job_dir, attempt, signal_after, stock=stock, timeout=timeout, flow=flow, resume=resume, extra=extra
    )
    return "hang" if None in codes else "done"


def slurm_step_codes(
    job_dir: Path,
    attempt: int,
    signal_after: list[float | None] | None,
    *,
    stock: bool = False,
    timeout: float = 240,
    flow: str = "slurm",
    resume: Path | None = None,
    extra: tuple[str, ...] = (),
    ranks: int = 2,
) -> list[int | None]:
    """:func:`slurm_step`, returning each task's exit code (None: it hung and was killed); ``ranks=1``: a one-task
    job (one process, no DDP)."""
    import subprocess

    job_dir.mkdir(parents=True, exist_ok=True)
    port = str(_free_port())
    processes = []
    for rank in range(ranks):
        env = {
            **os.environ,
            **SLURM_ENV,
            "SLURM_NTASKS": str(ranks),
            "SLURM_NTASKS_PER_NODE": str(ranks),
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank),
            "MASTER_PORT": port,
            "CHAOS_JOB_DIR": str(job_dir),
            "PATH": f"{fake_scontrol(job_dir / 'bin')}{os.pathsep}{os.environ['PATH']}",
        }
        command = [
            sys.executable,
            *([os.environ["CHAOS_DEBUG"]] if "CHAOS_DEBUG" in os.environ else []),
            str(SLURM_JOB),
            str(job_dir),
            "--attempt",
            str(attempt),
        ]
        command += ["--config", _config_json(DDP_CONFIG)]
        if signal_after is not None and signal_after[rank] is not None:
            command += ["--signal-after", str(signal_after[rank])]
        command += ["--flow", flow, *(["--resume", str(resume)] if resume is not None else [])]
        if stock:
            command.append("--stock")
        command += [*extra, *(["--devices", "1"] if ranks == 1 else [])]
        log = open(job_dir / f"rank{rank}-{attempt}.log", "w")  # noqa: SIM115 - closed with the process
        processes.append((subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    deadline = time.monotonic() + timeout
    codes: list[int | None] = []
    for process, _ in processes:
        try:
            codes.append(process.wait(timeout=max(deadline - time.monotonic(), 1)))
        except subprocess.TimeoutExpired:
            codes.append(None)
    for process, log in processes:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
    return codes


def _config_json(config: Config) -> str:
    """The fields of ``config`` that differ from the defaults, as ``--config`` takes them."""
    import json
    from dataclasses import fields

    defaults = Config()
    changed = {
        f.name: getattr(config, f.name) for f in fields(config) if getattr(config, f.name) != getattr(defaults, f.name)
    }
    return json.dumps(changed)


def _log_tails(job_dir: Path) -> str:
    """The last lines of each task's logs: what a failed 2-rank delivery says about itself."""
    tails = []
    for log in sorted(job_dir.glob("rank*.log")):
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-4:]
        tails.append(f"{log.name}: " + " | ".join(lines))
    return "\n".join(tails)


class MissingResult(Exception):
    """A file a comparison needs is not there, or cannot be read: the outcome is inexact, for the reason given."""


def _load(path: Path, what: str) -> dict[str, Any]:
    """``torch.load`` of a task's result or a checkpoint; a missing or unreadable file raises :class:`MissingResult`
    naming it (``tests/slurm_job.py`` writes its result whole or not at all: missing means the task was killed, or
    failed, before it wrote it)."""
    if not path.exists():
        raise MissingResult(f"{what} wrote no {path.name} (killed or failed before it: see its log)")
    try:
        loaded = torch.load(path, weights_only=False, map_location="cpu")
    except Exception as error:  # a torn checkpoint (stock Lightning can leave one): an outcome, not a crash
        raise MissingResult(f"{what}: {path.name} cannot be read ({type(error).__name__}: {error})") from error
    assert isinstance(loaded, dict), f"{path}: {type(loaded).__name__}, not a dict"
    return loaded


def _rank_results(job_dir: Path, attempt: int, whose: str) -> list[dict[str, Any]]:
    """Every rank's result of ``attempt`` (``rank{r}-{attempt}.pt``); :class:`MissingResult` for the first missing."""
    return [_load(job_dir / f"rank{rank}-{attempt}.pt", f"{whose}: rank {rank}") for rank in range(2)]


def _deliver_ddp(
    job_dir: Path,
    full_dir: Path,
    signal_after: list[float | None],
    *,
    stock: bool = False,
    flow_name: str = "slurm",
    extra: tuple[str, ...] = (),
) -> Outcome:
    """Signal ranks of a 2-rank job at their own moments (None: not that rank); the flow stops it; resume; compare
    every rank with the uninterrupted job in ``full_dir`` (an inexact outcome carries the tasks' last log lines).

    ``slurm``: SLURM's signal, requeue, SIGTERM, kill; the requeued job finds the hpc checkpoint itself. ``sigterm``:
    Lightning's SIGTERM handling with ``OnExceptionCheckpoint``; the next job passes its file as ``ckpt_path``. A rank
    whose result file is missing (killed before it wrote it) makes the outcome inexact, with that reason.
    """
    moments = "/".join("-" if moment is None else f"{moment:.2f}" for moment in signal_after)
    label = f"2 ranks, by timers: after {moments} s" if signal_after != [None, None] else f"2 ranks: {' '.join(extra)}"
    try:
        checkpoint, why = _compare_ddp(job_dir, full_dir, signal_after, stock, flow_name, extra)
    except MissingResult as missing:
        _, source = _resume_checkpoint(_ddp_flow(flow_name), job_dir)
        checkpoint, why = (None if source is None else source.name), str(missing)
    return Outcome("ddp", 0, label, checkpoint, not why, why)


def _ddp_flow(flow_name: str) -> Flow:
    """The flow of a 2-rank job (``slurm`` or ``sigterm``), for :func:`_resume_checkpoint`."""
    return Flow(f"{flow_name}-ddp", signal.SIGUSR1 if flow_name == "slurm" else signal.SIGTERM, "auto")


def _compare_ddp(
    job_dir: Path,
    full_dir: Path,
    signal_after: list[float | None],
    stock: bool,
    flow_name: str,
    extra: tuple[str, ...],
) -> tuple[str | None, str]:
    """:func:`_deliver_ddp`'s jobs and comparison: the checkpoint resumed from, and why the outcome is inexact ("":
    exact); :class:`MissingResult` where a file it compares is missing or cannot be read."""
    timeout = 60 if stock else 240  # (stock Lightning hangs here: no need to wait long to see it)
    if slurm_step(job_dir, 0, signal_after, stock=stock, flow=flow_name, timeout=timeout, extra=extra) == "hang":
        return None, "the signalled job hung"
    _, source = _resume_checkpoint(_ddp_flow(flow_name), job_dir)
    if source is None:
        firsts = _rank_results(job_dir, 0, "the signalled job")
        if any(first["signalled_in_training"] for first in firsts):
            return None, "signalled during training, but no checkpoint written"
        fulls = _rank_results(full_dir, 0, "the uninterrupted job")
        same = all(
            first["seen"] == full["seen"] and all(torch.equal(v, first["params"][k]) for k, v in full["params"].items())
            for first, full in zip(firsts, fulls, strict=True)
        )
        return None, "" if same else "signalled after training, yet the run differs"
    if (served := _served_twice(job_dir)) is not None:
        return source.name, served
    trained = int(_load(source, "the checkpoint")["chaos_trained"])
    resume = source if flow_name == "sigterm" else None
    if slurm_step(job_dir, 1, None, stock=stock, flow=flow_name, resume=resume, timeout=timeout, extra=extra) == "hang":
        return source.name, "the requeued job hung"
    fulls = _rank_results(full_dir, 0, "the uninterrupted job")
    firsts = _rank_results(job_dir, 0, "the signalled job")
    seconds = _rank_results(job_dir, 1, "the requeued job")
    for rank, (full, first, second) in enumerate(zip(fulls, firsts, seconds, strict=True)):
        if first["seen"][:trained] + second["seen"] != full["seen"]:
            return source.name, f"rank {rank}: batches differ"
        for name, value in full["params"].items():
            if not torch.equal(value, second["params"][name]):
                return source.name, f"rank {rank}: parameter {name} differs"
    return source.name, ""


def deliver_ddp(
    job_dir: Path,
    full_dir: Path,
    signal_after: list[float | None],
    *,
    stock: bool = False,
    flow_name: str = "slurm",
    extra: tuple[str, ...] = (),
) -> Outcome:
    """:func:`_deliver_ddp`, with the tasks' last log lines in an inexact outcome's reason (``extra``: more arguments
    of both attempts' tasks, ``tests/slurm_job.py``'s)."""
    outcome = _deliver_ddp(job_dir, full_dir, signal_after, stock=stock, flow_name=flow_name, extra=extra)
    if not outcome.exact:
        outcome.why = f"{outcome.why}\n{_log_tails(job_dir)}"
    return outcome


#: the validation of :func:`validation_delays`: batches per rank, and the seconds each takes at least
DELAY_BATCHES, DELAY_PACE = 6, 0.5


def validation_delay(job_dir: Path, ranks: int, flow_name: str, *, stock: bool) -> str:
    """One job whose first validation (``DELAY_BATCHES`` batches of at least ``DELAY_PACE`` s per rank) gets the flow's
    signal (every rank) as its second batch starts: how long until the checkpoint, where, and how the tasks ended."""
    extra = (
        *("--val-size", str(2 * DELAY_BATCHES * ranks), "--val-pace", str(DELAY_PACE)),
        *("--signal-in-validation", "1"),
    )
    codes = slurm_step_codes(job_dir, 0, None, stock=stock, flow=flow_name, timeout=180, extra=extra, ranks=ranks)
    name = "SIGUSR1 (SLURM)" if flow_name == "slurm" else "SIGTERM"
    row = f"{ranks:>5}  {name:<16}{'stock' if stock else 'callback':<10}"
    if None in codes:
        return f"{row}hung (exit codes {codes})"
    try:
        result = _load(job_dir / "rank0-0.pt", "rank 0")
    except MissingResult as missing:
        return f"{row}{missing} (exit codes {codes})"
    if "validation_signal" not in result:
        return f"{row}the signal was not sent (exit codes {codes})"
    _, saves = result["validation_signal"]
    if not saves:
        return f"{row}no checkpoint (exit codes {codes})"
    seconds, begun = saves[0]
    inside = f"{begun} of {DELAY_BATCHES} batches begun" if begun is not None else "after the validation"
    return f"{row}{seconds:>6.2f} s  {inside:<24}exit codes {codes}"


def validation_delays(out: Path) -> None:
    """How long a checkpoint asked for during a validation waits, stock and with the callback, in one process and
    in a 2-rank job (printed: the number to set against a 30 s grace period is the validation batch's length)."""
    print(
        f"\nthe signal during a validation ({DELAY_BATCHES} batches of at least {DELAY_PACE} s per rank, sent to every"
        " rank as the second starts): from the signal to the checkpoint",
        flush=True,
    )
    print(f"{'ranks':>5}  {'signal':<16}{'':<10}{'delay':>8}  {'validation':<24}tasks", flush=True)
    for ranks in (1, 2):
        for flow_name in ("sigterm", "slurm"):
            for stock in (True, False):
                job_dir = out / f"delay-{ranks}-{flow_name}-{'stock' if stock else 'callback'}"
                print(validation_delay(job_dir, ranks, flow_name, stock=stock), flush=True)


def fresh_job_signals() -> None:
    """The default actions for the job's signals, as a job's process starts with (``nohup`` ignores SIGHUP, and
    Lightning installs no SLURM handler for a signal that already has one)."""
    for signum in JOB_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)


#: a delivery (two jobs and their comparison) takes seconds: one still running after this long is stuck
DELIVERY_TIMEOUT_S = 600.0


class HangWatch:
    """Ends the process with every thread's stack, its own and its DataLoader workers', where the block inside runs
    past ``timeout`` seconds: a hang would otherwise stop ``make chaos`` with nothing to read (one delivery of about
    600 hung once, its main process waiting for a batch while both workers' main threads waited for a task; their
    other threads were not looked at). Exit code 3.

    The workers dump theirs on SIGQUIT: ``faulthandler.register`` (made by :func:`dump_on_sigquit` before any worker
    is forked) is inherited by every fork.
    """

    def __init__(self, label: str, timeout: float = DELIVERY_TIMEOUT_S) -> None:
        self.label, self.timeout = label, timeout
        self.timer = threading.Timer(timeout, self._dump)
        self.timer.daemon = True

    def __enter__(self) -> HangWatch:
        self.timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.timer.cancel()

    def _dump(self) -> None:
        children = multiprocessing.active_children()
        print(f"HANG: {self.label} still runs after {self.timeout:.0f} s; every thread's stack follows", flush=True)
        print(f"process {os.getpid()} (main), workers {[child.pid for child in children]}", flush=True)
        faulthandler.dump_traceback(all_threads=True)
        for child in children:
            os.kill(child.pid, signal.SIGQUIT)
        time.sleep(1)  # (the workers write to the same stderr)
        for child in children:
            child.kill()
        os._exit(3)


def dump_on_sigquit() -> None:
    """SIGQUIT writes every thread's stack to stderr, in this process and in each process forked from it."""
    faulthandler.register(signal.SIGQUIT, all_threads=True)


def _thread_note(args: threading.ExceptHookArgs) -> None:
    # a killed job's DataLoader workers drop the connections of the main process's file-descriptor sharing thread
    print(f"(a thread of the killed job: {args.exc_type.__name__}: {args.exc_value})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deliveries", type=int, default=300, help="in all, spread over the flows")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--flows", default=",".join(FLOWS))
    parser.add_argument("--workers", type=int, nargs="*", default=[0, 2])
    parser.add_argument("--stock", type=int, default=0, help="deliveries without the callback (the stock control)")
    parser.add_argument("--ddp", type=int, default=0, help="of --deliveries: 2-rank SLURM jobs, signalled by timers")
    parser.add_argument("--ddp-stock", type=int, default=0, help="2-rank SLURM jobs without the callback")
    parser.add_argument(
        "--uninterrupted", type=int, default=0, help="2-rank SLURM jobs never signalled: each task must exit 0"
    )
    parser.add_argument(
        "--validation-delay", action="store_true", help="measure the checkpoint's delay for a signal in a validation"
    )
    parser.add_argument("--out", default="chaos-output")
    args = parser.parse_args()
    for name in ("lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)  # one line per delivery, not Lightning's notes
    fresh_job_signals()
    threading.excepthook = _thread_note
    dump_on_sigquit()
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"chaos seed: {seed} (python tests/chaos.py --seed {seed} ... repeats these deliveries)", flush=True)
    rng = random.Random(seed)
    out = Path(args.out)
    os.environ["PATH"] = f"{fake_scontrol(out / 'bin')}{os.pathsep}{os.environ['PATH']}"
    os.environ.update(SLURM_ENV)
    flows = [FLOWS[name] for name in args.flows.split(",")]
    cases = [(flow, workers) for flow in flows for workers in args.workers]
    outcomes: list[tuple[str, Outcome]] = []
    started = time.monotonic()
    plan = [(cases[i % len(cases)], True) for i in range(args.deliveries - args.ddp)]
    plan += [(cases[i % len(cases)], False) for i in range(args.stock)]
    fulls: dict[tuple[str, int, bool], tuple[RunResult, tuple[int, int]]] = {}
    for index, ((flow, workers), callback) in enumerate(plan):
        config = replace(CONFIG, num_workers=workers)
        key = (flow.name, workers, callback)
        label = f"{flow.name} nw={workers}{'' if callback else ' STOCK'}"
        with HangWatch(f"delivery {index + 1} ({label})"):
            if key not in fulls:
                full = uninterrupted(config, flow, out / f"full-{flow.name}-{workers}-{callback}", callback=callback)
                fulls[key] = (full, count_lines(config, flow, out / f"count-{key}", callback=callback))
            full, lines = fulls[key]
            at = rng.randint(*lines)
            outcome = deliver(config, flow, at, out / f"d{index}", full, callback=callback)
        outcomes.append((label, outcome))
        _report(f"[{index + 1}/{len(plan)}] {label} line {at}: landed in {outcome.landed}", outcome)
    if args.ddp or args.ddp_stock:
        full_dir = out / "ddp-full"
        codes = slurm_step_codes(full_dir, 0, None)
        assert codes == [0, 0], f"the uninterrupted DDP job (the oracle): exit codes {codes}\n{_log_tails(full_dir)}"
        training = _load(full_dir / "rank0-0.pt", "the uninterrupted job: rank 0")["seconds"]
        for index in range(args.ddp + args.ddp_stock):
            stock = index >= args.ddp
            flow_name = ("slurm", "sigterm")[index % 2]
            moments: list[float | None] = [rng.uniform(0, training * 0.8), rng.uniform(0, training * 0.8)]
            if flow_name == "sigterm" and index % 4 == 1:
                moments[rng.randrange(2)] = None  # SIGTERM to one rank only
            outcome = deliver_ddp(out / f"ddp{index}", full_dir, moments, stock=stock, flow_name=flow_name)
            label = f"{flow_name} ddp{' STOCK' if stock else ''}"
            outcomes.append((label, outcome))
            _report(f"[ddp {index + 1}/{args.ddp + args.ddp_stock}] {label} {outcome.landed}", outcome)
    clean = _uninterrupted_jobs(out, args.uninterrupted)
    _summary(outcomes, time.monotonic() - started)
    if args.validation_delay:
        validation_delays(out)
    ours = [outcome for label, outcome in outcomes if "STOCK" not in label]
    sys.exit(0 if clean and all(outcome.exact for outcome in ours) else 1)


def _uninterrupted_jobs(out: Path, jobs: int) -> bool:
    """Run ``jobs`` 2-rank SLURM jobs that nobody signals, with the callback: whether every task exited 0."""
    failed = 0
    for index in range(jobs):
        job_dir = out / f"uninterrupted{index}"
        codes = slurm_step_codes(job_dir, 0, None)
        note = "" if codes == [0, 0] else f"\n{_log_tails(job_dir)}"
        failed += codes != [0, 0]
        print(f"[uninterrupted {index + 1}/{jobs}] exit codes of the 2 tasks: {codes}{note}", flush=True)
    if jobs:
        print(f"uninterrupted 2-rank jobs: {jobs - failed} of {jobs} exited 0 on every rank", flush=True)
    return failed == 0


def _report(delivery: str, outcome: Outcome) -> None:
    verdict = "exact" if outcome.exact else f"INEXACT {outcome.why}"
    print(f"{delivery}; resumed from {outcome.checkpoint}: {verdict}", flush=True)


def _summary(outcomes: list[tuple[str, Outcome]], seconds: float) -> None:
    print(f"\n{len(outcomes)} deliveries in {seconds:.0f} s")
    per: dict[str, list[Outcome]] = collections.defaultdict(list)
    for label, outcome in outcomes:
        per[label].append(outcome)
    print(f"{'flow':<28}{'deliveries':>11}{'exact':>7}")
    for label, group in per.items():
        print(f"{label:<28}{len(group):>11}{sum(o.exact for o in group):>7}")
    print("\nwhere the signals landed (what the main thread was doing): deliveries, exact")
    areas = collections.Counter(
        (outcome.landed or "?").split(":")[0] for label, outcome in outcomes if "STOCK" not in label
    )
    exact = collections.Counter(
        (outcome.landed or "?").split(":")[0] for label, outcome in outcomes if "STOCK" not in label and outcome.exact
    )
    for area, count in areas.most_common():
        print(f"  {area:<28}{count:>5}{exact[area]:>6}")


if __name__ == "__main__":
    main()
