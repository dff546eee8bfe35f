"""Pre-emption: signals that ask for a checkpoint are served at consistent points, and the resumes are exact.

The Trainer-level cases deliver the signal at a counted line of the main thread (``tests/chaos.py``), or, for the
2-rank job, by a timer in each task (``tests/slurm_job.py``); ``make chaos`` runs at least 300 deliveries.
"""

from __future__ import annotations

import functools
import importlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from filelock import FileLock

import chaos
from harness import NAMESPACE, L
from lightning_midepoch import MidEpochResume
from lightning_midepoch._inspect import InspectError, load_checkpoint
from lightning_midepoch._preemption import SignalDeferral, candidate_signals, checkpointing_handler, writes_beside

SIGTERMException = importlib.import_module(f"{NAMESPACE}.utilities.exceptions").SIGTERMException

#: the seed of this run's sample of deliveries (``MIDEPOCH_CHAOS_SEED=S make test`` repeats one)
SEED = int(os.environ.get("MIDEPOCH_CHAOS_SEED", random.SystemRandom().randrange(2**31)))


@pytest.fixture
def usr2():
    """SIGUSR2 with a handler that records its calls and frames (the process's own handler is put back after)."""
    calls: list[int] = []
    frames: list[object] = []

    def handler(signum, frame):
        calls.append(signum)
        frames.append(frame)

    previous = signal.signal(signal.SIGUSR2, handler)
    calls_and_frames = (calls, frames)
    yield calls_and_frames
    signal.signal(signal.SIGUSR2, previous)


def _deferral_of(signum: int) -> SignalDeferral:
    deferral = SignalDeferral()
    deferral.install({signum: signal.getsignal(signum)})
    return deferral


def test_a_deferred_signal_runs_its_handler_only_when_served_with_the_frame_it_arrived_in(usr2):
    calls, frames = usr2
    deferral = _deferral_of(signal.SIGUSR2)
    signal.raise_signal(signal.SIGUSR2)
    signal.raise_signal(signal.SIGUSR2)  # a repeat before the point: one request
    assert calls == []
    assert deferral.serve() is True
    assert calls == [signal.SIGUSR2]
    assert frames[0] is not None
    assert (
        frames[0].f_code.co_name
        == "test_a_deferred_signal_runs_its_handler_only_when_served_with_the_frame_it_arrived_in"
    )
    assert deferral.serve() is False  # nothing pending
    deferral.uninstall()
    signal.raise_signal(signal.SIGUSR2)  # the handler is back
    assert calls == [signal.SIGUSR2, signal.SIGUSR2]


def test_a_repeat_while_its_handler_runs_is_coalesced_and_another_signal_waits():
    calls: list[int] = []

    def handler(signum, frame):
        calls.append(signum)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGUSR2)  # the same signal again, while the checkpoint is being written
            signal.raise_signal(signal.SIGUSR1)  # another one

    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGUSR1, signal.SIGUSR2)}
    try:
        deferral = SignalDeferral()
        deferral.install({signum: handler for signum in (signal.SIGUSR1, signal.SIGUSR2)})
        signal.raise_signal(signal.SIGUSR2)
        deferral.serve()
        assert calls == [signal.SIGUSR2]
        assert deferral.pending_signals() == [signal.SIGUSR1]
        deferral.serve()
        assert calls == [signal.SIGUSR2, signal.SIGUSR1]
        assert deferral.serve() is False  # the repeat asked for nothing more
        assert calls == [signal.SIGUSR2, signal.SIGUSR1]
        deferral.uninstall()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@pytest.mark.parametrize("handler", [signal.SIG_DFL, signal.SIG_IGN, signal.default_int_handler], ids=repr)
def test_the_default_action_ignoring_and_ctrl_c_never_count_as_checkpointing(handler):
    assert not checkpointing_handler(handler, object(), declared=True, ranks_exchange=True)


def test_a_users_handler_checkpoints_only_where_its_signal_is_declared():
    connector = L.Trainer(logger=False)._signal_connector

    def dump_stacks(signum, frame):
        pass

    assert not checkpointing_handler(dump_stacks, connector, declared=False, ranks_exchange=True)
    assert checkpointing_handler(dump_stacks, connector, declared=True, ranks_exchange=False)


def test_lightnings_slurm_handler_checkpoints_and_its_sigterm_notifier_only_exchanges_under_ddp(slurm_job):
    trainer = L.Trainer(logger=False, plugins=[chaos.SLURMEnvironment(auto_requeue=True)])
    connector = trainer._signal_connector
    connector.register_signal_handlers()
    try:
        requeue, sigterm = signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM)
        assert checkpointing_handler(requeue, connector, declared=False, ranks_exchange=False)
        assert not checkpointing_handler(sigterm, connector, declared=False, ranks_exchange=False)
        assert checkpointing_handler(sigterm, connector, declared=False, ranks_exchange=True)
    finally:
        connector.teardown()


def test_uninstall_leaves_a_handler_set_since_alone(usr2):
    deferral = _deferral_of(signal.SIGUSR2)
    replacement = lambda signum, frame: None  # noqa: E731
    signal.signal(signal.SIGUSR2, replacement)
    deferral.uninstall()
    assert signal.getsignal(signal.SIGUSR2) is replacement


def test_a_signal_noted_as_training_ends_is_served_then_and_later_ones_at_once(usr2):
    calls, frames = usr2
    deferral = _deferral_of(signal.SIGUSR2)
    signal.raise_signal(signal.SIGUSR2)
    deferral.finish()  # the end of training: what is noted is served
    assert calls == [signal.SIGUSR2]
    signal.raise_signal(signal.SIGUSR2)  # after training (a callback uploading artifacts, teardown): at once
    assert calls == [signal.SIGUSR2, signal.SIGUSR2]
    assert frames[1] is not None
    deferral.uninstall()


def test_a_deferral_installs_only_in_the_main_thread(usr2):
    calls, _ = usr2
    deferral = SignalDeferral()
    worker = threading.Thread(target=deferral.install, args=({signal.SIGUSR2: signal.getsignal(signal.SIGUSR2)},))
    worker.start()
    worker.join()
    signal.raise_signal(signal.SIGUSR2)  # not deferred: its handler runs at once
    assert calls == [signal.SIGUSR2]


@pytest.mark.skipif(not hasattr(signal, "SIGRTMIN"), reason="no real-time signals on this platform")
def test_a_real_time_signal_is_deferred_and_served():
    signum = signal.SIGRTMIN + 3
    calls: list[int] = []
    previous = signal.signal(signum, lambda number, frame: calls.append(number))
    try:
        deferral = _deferral_of(signum)
        signal.raise_signal(signum)
        assert calls == []
        assert deferral.pending_signals() == [signum]
        deferral.serve()
        assert calls == [signum]
        deferral.uninstall()
    finally:
        signal.signal(signum, previous)


def test_candidate_signals_add_a_requeue_signal_and_the_declared_ones_once():
    assert candidate_signals(signal.SIGUSR1, [signal.SIGUSR1]) == (signal.SIGTERM, signal.SIGUSR1)
    assert candidate_signals(None, [signal.SIGTERM]) == (signal.SIGTERM,)


def test_a_checkpoint_written_beside_its_file_leaves_the_temporary_folder_and_fsspec_alone(tmp_path, monkeypatch):
    """The written file is torch.save's bytes; the temporary file lies beside it; tempfile's setting is untouched."""
    from lightning.fabric.plugins import TorchCheckpointIO

    class Strategy:
        checkpoint_io = TorchCheckpointIO()

    strategy = Strategy()
    made: list[str] = []
    real_mkstemp = tempfile.mkstemp
    monkeypatch.setattr(tempfile, "mkstemp", lambda *a, **k: made.append(k.get("dir")) or real_mkstemp(*a, **k))
    before = tempfile.tempdir
    target = tmp_path / "run" / "hpc_ckpt_1.ckpt"
    with writes_beside(strategy, TorchCheckpointIO):
        assert tempfile.tempdir == before
        strategy.checkpoint_io.save_checkpoint({"x": torch.arange(3)}, target)
    assert isinstance(strategy.checkpoint_io, TorchCheckpointIO)
    assert made == [str(target.parent)]
    assert sorted(path.name for path in target.parent.iterdir()) == ["hpc_ckpt_1.ckpt"]
    assert torch.equal(torch.load(target)["x"], torch.arange(3))


def test_a_users_checkpoint_plugin_writes_as_it_does(tmp_path):
    from lightning.fabric.plugins import TorchCheckpointIO

    class Mine(TorchCheckpointIO):
        pass

    class Strategy:
        checkpoint_io = Mine()

    strategy = Strategy()
    with writes_beside(strategy, TorchCheckpointIO):
        assert type(strategy.checkpoint_io) is Mine


# ------------------------------------------------------------------------------------------- Trainer level
@pytest.fixture
def slurm_job(tmp_path, monkeypatch):
    """A one-task SLURM job's environment, with a fake ``scontrol`` on the PATH and the job's signals at their
    default actions, as a job's process starts (``nohup`` would have SIGHUP ignored)."""
    for name, value in chaos.SLURM_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PATH", f"{chaos.fake_scontrol(tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}")
    previous = {signum: signal.getsignal(signum) for signum in chaos.JOB_SIGNALS}
    chaos.fresh_job_signals()
    yield tmp_path
    for signum, handler in previous.items():
        signal.signal(signum, handler)


_WINDOWS: dict[tuple[str, int, bool], tuple[int, int]] = {}


def _window(config, flow, tmp_path, callback=True):
    key = (flow.name, config.num_workers, callback)
    if key not in _WINDOWS:
        _WINDOWS[key] = chaos.count_lines(config, flow, tmp_path / "count", callback=callback)
    return _WINDOWS[key]


#: per flow and worker count: how many deliveries ``make test`` samples (``make chaos`` runs hundreds)
SAMPLE = {0: 3, 2: 1}


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("flow", list(chaos.FLOWS))
def test_a_signal_anywhere_in_fit_resumes_exactly(flow, num_workers, slurm_job, tmp_path):
    """SLURM's user signal (and a custom requeue signal), SIGTERM with OnExceptionCheckpoint and a user's own handler:
    wherever the signal lands, the checkpoint the flow writes resumes bitwise as the uninterrupted run."""
    flow = chaos.FLOWS[flow]
    config = replace(chaos.CONFIG, num_workers=num_workers)
    full = chaos.uninterrupted(config, flow, tmp_path / "full")
    first, last = _window(config, flow, tmp_path)
    rng = random.Random(f"{SEED}-{flow.name}-{num_workers}")
    for index in range(SAMPLE[num_workers]):
        at = rng.randint(first, last)
        outcome = chaos.deliver(config, flow, at, tmp_path / f"d{index}", full)
        assert outcome.exact, f"{outcome} (MIDEPOCH_CHAOS_SEED={SEED} repeats this sample)"


@pytest.mark.slow
@pytest.mark.parametrize("offset", [0, 100])
def test_a_slurm_signal_while_lightning_registers_its_handlers_waits_for_the_deferral_and_resumes_exactly(
    offset, slurm_job, tmp_path
):
    """SLURM's signal in the lines between Lightning's registration of its handlers (the first line at which a
    delivery finds one) and the deferral taking their place (some 200 lines later) is held until then and served at
    a consistent point: the resume is exact. Run at once, Lightning's handler wrote its checkpoint before the first
    batch, and the resume trained other batches (``make chaos``, seed 3755595679)."""
    flow = chaos.FLOWS["slurm"]
    config = replace(chaos.CONFIG, num_workers=0)
    full = chaos.uninterrupted(config, flow, tmp_path / "full")
    first, _ = _window(config, flow, tmp_path)
    outcome = chaos.deliver(config, flow, first + offset, tmp_path / "d", full)
    assert outcome.exact, outcome


def _optimizer_lines(config, flow, tmp_path, callback):
    """The lines of a fit that run inside the optimizer's step (torch.optim's code)."""
    job = chaos.run_job(config, flow, tmp_path, at=-1, callback=callback, record=("torch/optim/",))
    assert job.trigger is not None
    assert job.trigger.recorded
    return job.trigger.recorded


@pytest.mark.slow
def test_a_signal_inside_the_optimizer_step_writes_a_whole_step_where_stock_writes_a_torn_one(slurm_job, tmp_path):
    """The stock control: the same SLURM flow without the callback writes its checkpoint inside ``optimizer.step()``
    and resumes from it with different weights; with the callback the checkpoint waits for the step's end."""
    flow = chaos.FLOWS["slurm"]
    config = chaos.CONFIG
    outcomes = {}
    for callback in (True, False):
        full = chaos.uninterrupted(config, flow, tmp_path / f"full-{callback}", callback=callback)
        lines = _optimizer_lines(config, flow, tmp_path / f"probe-{callback}", callback)
        at = lines[len(lines) * 3 // 4]  # in the second epoch
        outcomes[callback] = chaos.deliver(config, flow, at, tmp_path / f"d-{callback}", full, callback=callback)
        assert outcomes[callback].landed.startswith("optimizer step")
    assert outcomes[True].exact, outcomes[True]
    assert not outcomes[False].exact, outcomes[False]


def _newest_hpc_state(job_dir) -> str:
    """What the requeued job would find: "none", "whole" (it loads) or "truncated" (as ``inspect`` says)."""
    files = sorted(job_dir.glob("hpc_ckpt_*.ckpt"), key=lambda path: int(path.stem.rsplit("_", 1)[1]))
    if not files:
        return "none"
    try:
        load_checkpoint(str(files[-1]))
    except InspectError as error:
        return "truncated" if "TRUNCATED" in str(error) else f"unreadable: {error}"
    return "whole"


#: the files that write a checkpoint into place: stock, fsspec's local transaction and shutil's move; with the
#: callback, its own write beside the file (torch.save into a temporary file, a rename); the function each write
#: starts in; and how many kills are spread over the lines of the write
WRITE = {
    False: (("fsspec/implementations/local.py", "/shutil.py"), "move"),
    True: (("torch/serialization.py", "lightning_midepoch/_preemption.py"), "save_checkpoint"),
}
KILLS = 12


class _SignalAt(L.Callback):
    """Raises a signal at the end of one training batch (the handler runs there, traced, not inside a trace hook)."""

    def __init__(self, signum: int, batch: int) -> None:
        self.signum, self.batch = signum, batch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.batch:
            signal.raise_signal(self.signum)


@pytest.mark.slow
def test_a_kill_while_the_hpc_checkpoint_is_written_never_leaves_a_truncated_newest_file(slurm_job, tmp_path):
    """With the temporary directory on another filesystem (TMPDIR=/dev/shm), fsspec moves the written checkpoint into
    place by copying it: stock Lightning, killed in that copy, leaves a truncated ``hpc_ckpt_N.ckpt`` that the
    requeued job would pick. The callback's handler writes beside the checkpoint (tempfile's folder untouched): a
    kill at any line of the write leaves the newest file whole (or none)."""
    other = "/dev/shm"
    assert os.stat(other).st_dev != os.stat(tmp_path).st_dev, f"{other} must be another filesystem than {tmp_path}"
    flow, config = chaos.FLOWS["slurm"], chaos.CONFIG
    never = 10**12  # the trigger only counts lines, records those of shutil and kills; _SignalAt signals
    found = {}
    for callback in (True, False):
        signal_at = (_SignalAt(signal.SIGUSR1, 7),)
        files, start = WRITE[callback]
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(tempfile, "tempdir", other)
            probe = chaos.run_job(
                config,
                flow,
                tmp_path / f"probe-{callback}",
                callback=callback,
                at=never,
                record=files,
                extra_callbacks=signal_at,
            )
            assert probe.trigger is not None
            names = probe.trigger.recorded_names
            assert start in names, f"the checkpoint's write ran no line of {files}"
            # the write's lines, counted from its first (a count that does not drift from run to run)
            first, last = names.index(start), len(names) - 1 - names[::-1].index(start)
            states = []
            for index in range(KILLS):
                kill = (start, index * (last - first) // (KILLS - 1))
                job_dir = tmp_path / f"kill-{callback}-{index}"
                chaos.run_job(
                    config,
                    flow,
                    job_dir,
                    callback=callback,
                    at=never,
                    record=files,
                    kill_recorded=kill,
                    extra_callbacks=signal_at,
                )
                states.append(_newest_hpc_state(job_dir))
        found[callback] = states
    assert "truncated" not in found[True], found
    assert "truncated" in found[False], found  # the stock control: the harness does reach the copy


class _TemporaryFolderAtSave(L.Callback):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self.seen.append(tempfile.gettempdir())


@pytest.mark.slow
def test_a_served_checkpoint_leaves_the_process_temporary_folder_as_it_is(slurm_job, tmp_path):
    """SLURM's handler served at a batch's end writes its file beside it, yet every other thread of the process (a
    logger, an asynchronous checkpoint writer) still makes its temporary files where it did."""
    before = tempfile.gettempdir()
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    spy = _TemporaryFolderAtSave()
    chaos.run_job(chaos.CONFIG, chaos.FLOWS["slurm"], job_dir, extra_callbacks=(_SignalAt(signal.SIGUSR1, 7), spy))
    assert spy.seen == [before]
    assert _newest_hpc_state(job_dir) == "whole"
    assert not list(job_dir.glob("*.tmp"))


class _SignalAfterTraining(L.Callback):
    """Raises SLURM's signal in one of the hooks that follow training (after MidEpochResume's ``on_train_end``)."""

    def __init__(self, hook: str) -> None:
        self.hook = hook

    def _maybe(self, hook: str) -> None:
        if hook == self.hook:
            signal.raise_signal(signal.SIGUSR1)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.hook == "on_exception" and trainer.global_step == 5:
            raise RuntimeError("a user's error")

    def on_train_end(self, trainer, pl_module) -> None:
        self._maybe("on_train_end")

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._maybe("on_exception")


@pytest.mark.slow
@pytest.mark.parametrize("hook", ["on_train_end", "on_exception"])
def test_a_signal_after_training_reaches_its_handler_once(hook, slurm_job, tmp_path, monkeypatch):
    """A callback after MidEpochResume uploading artifacts, or handling an exception: SLURM's signal there runs
    Lightning's handler (one hpc checkpoint, one requeue), as stock Lightning's does. (Lightning gives the process its
    handlers back before the callbacks' teardown hooks.)"""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    monkeypatch.setenv("CHAOS_JOB_DIR", str(job_dir))
    run = functools.partial(chaos.run_job, chaos.CONFIG, chaos.FLOWS["slurm"], job_dir)
    if hook == "on_exception":
        with pytest.raises(RuntimeError, match="a user's error"):
            run(extra_callbacks=(_SignalAfterTraining(hook),))
    else:
        run(extra_callbacks=(_SignalAfterTraining(hook),))
    assert sorted(path.name for path in job_dir.glob("hpc_ckpt_*.ckpt")) == ["hpc_ckpt_1.ckpt"]
    assert len((job_dir / "requeued").read_text().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGRTMIN"), reason="no real-time signals on this platform")
def test_a_real_time_requeue_signal_is_served_and_resumes_exactly(slurm_job, tmp_path, monkeypatch):
    """``SLURMEnvironment(requeue_signal=SIGRTMIN + 2)`` (``#SBATCH --signal=RTMIN+2@90``): served at the batch's end,
    one hpc checkpoint, and the requeued job continues exactly."""
    flow, config = chaos.Flow("slurm-rt", signal.SIGRTMIN + 2, "hpc"), chaos.CONFIG
    previous = signal.signal(flow.signum, signal.SIG_DFL)
    try:
        full = chaos.uninterrupted(config, flow, tmp_path / "full")
        job_dir = tmp_path / "job"
        job_dir.mkdir()
        monkeypatch.setenv("CHAOS_JOB_DIR", str(job_dir))
        first = chaos.run_job(config, flow, job_dir, extra_callbacks=(_SignalAt(flow.signum, 7),))
        ckpt_path, source = chaos._resume_checkpoint(flow, job_dir)
        assert source is not None
        assert source.name == "hpc_ckpt_1.ckpt"
        trained = torch.load(source, weights_only=False)["chaos_trained"]
        second = chaos.run_job(config, flow, job_dir, ckpt_path=ckpt_path, seed=2)
    finally:
        signal.signal(flow.signum, previous)
    assert first.result is not None
    assert second.result is not None
    assert first.result.model.seen[:trained] + second.result.model.seen == full.model.seen
    chaos.assert_same_state(full, second.result)


class _SignalAgainWhileSaving(L.Callback):
    """Sends the signal again while a checkpoint is being written (from within the save's callback states)."""

    def __init__(self, signum: int) -> None:
        self.signum, self.saves = signum, 0

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self.saves += 1
        if self.saves == 1:
            signal.raise_signal(self.signum)


@pytest.mark.slow
@pytest.mark.parametrize("callback", [True, False], ids=["callback", "stock"])
def test_a_second_signal_while_the_checkpoint_is_written(callback, slurm_job, tmp_path, monkeypatch):
    """SLURM's signal again while its checkpoint is being written: with the callback the repeat asks for what is
    under way, one whole checkpoint is written, one requeue runs, and the requeued job resumes exactly; stock
    Lightning runs its handler again inside the first save."""
    flow, config = chaos.FLOWS["slurm"], chaos.CONFIG
    full = chaos.uninterrupted(config, flow, tmp_path / "full", callback=callback)
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    monkeypatch.setenv("CHAOS_JOB_DIR", str(job_dir))  # where the fake scontrol notes the requeue
    again = _SignalAgainWhileSaving(signal.SIGUSR1)
    first = chaos.run_job(
        config, flow, job_dir, callback=callback, extra_callbacks=(_SignalAt(signal.SIGUSR1, 7), again)
    )
    written = sorted(path.name for path in job_dir.glob("hpc_ckpt_*.ckpt"))
    if not callback:
        assert again.saves >= 2, "stock Lightning saved once: the harness did not reach the second signal"
        return
    assert written == ["hpc_ckpt_1.ckpt"]
    assert again.saves == 1
    assert (job_dir / "requeued").exists()
    trained = torch.load(job_dir / "hpc_ckpt_1.ckpt", weights_only=False)["chaos_trained"]
    second = chaos.run_job(config, flow, job_dir, seed=2)
    assert first.result is not None
    assert second.result is not None
    assert first.result.model.seen[:trained] + second.result.model.seen == full.model.seen
    chaos.assert_same_state(full, second.result)


class _SignalInValidation(L.Callback):
    """Raises ``signum`` as the second epoch's mid-epoch validation starts its first batch; notes, at each checkpoint
    written since, the validation batches begun by then (None: written outside a validation)."""

    def __init__(self, signum: int) -> None:
        self.signum, self.sent = signum, False
        self.at_save: list[int | None] = []

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if not self.sent and not trainer.sanity_checking and trainer.current_epoch == 1 and batch_idx == 0:
            self.sent = True
            signal.raise_signal(self.signum)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        if self.sent:  # (ModelCheckpoint saved at the first epoch's end, before)
            progress = trainer.fit_loop.epoch_loop.val_loop.batch_progress.current
            self.at_save.append(progress.ready if trainer.validating else None)


@pytest.mark.slow
@pytest.mark.parametrize("flow_name", ["slurm", "sigterm", "user"])
def test_a_checkpoint_asked_for_during_a_validation_is_written_within_one_validation_batch(
    flow_name, slurm_job, tmp_path, monkeypatch
):
    """SLURM's signal (served at the validation batch's end), SIGTERM (Lightning's exception at the batch's end) and
    a declared user handler: the checkpoint is written after the validation batch the signal landed in, not after
    the whole validation, and the next job resumes exactly (it runs that validation again, from its start)."""
    flow, config = chaos.FLOWS[flow_name], chaos.CONFIG
    full = chaos.uninterrupted(config, flow, tmp_path / "full")
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    monkeypatch.setenv("CHAOS_JOB_DIR", str(job_dir))
    signaller = _SignalInValidation(flow.signum)
    first = chaos.run_job(config, flow, job_dir, extra_callbacks=(signaller,))
    assert signaller.at_save == [1]
    ckpt_path, source = chaos._resume_checkpoint(flow, job_dir)
    assert source is not None
    trained = torch.load(source, weights_only=False)["chaos_trained"]
    second = chaos.run_job(config, flow, job_dir, ckpt_path=ckpt_path, seed=2)
    assert first.result is not None
    assert second.result is not None
    assert first.result.model.seen[:trained] + second.result.model.seen == full.model.seen
    chaos.assert_same_state(full, second.result)


#: a moment within the 2-rank job's training however fast the machine: each of its steps takes at least
#: tests/slurm_job.py's Paced.PACE (0.01 s)
PACED_TRAINING_S = 0.6 * 0.01 * chaos.DDP_CONFIG.max_epochs * chaos.DDP_CONFIG.batches_per_epoch / 2


@pytest.fixture(scope="session")
def ddp_oracle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted 2-rank SLURM job the DDP deliveries are compared with, read only: one job for the session,
    whichever pytest worker asks first (pytest-xdist's recipe for a session fixture made once, a file lock in the
    workers' common temporary folder), as ``make chaos`` has one for all its DDP deliveries."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if "PYTEST_XDIST_WORKER" in os.environ else base
    full_dir, done = root / "ddp-oracle", root / "ddp-oracle.done"
    with FileLock(str(root / "ddp-oracle.lock")):
        if not done.exists():
            assert chaos.slurm_step(full_dir, 0, None) == "done", chaos._log_tails(full_dir)
            done.touch()
    return full_dir


@pytest.mark.slow
def test_a_requeued_slurm_job_of_two_ranks_signalled_at_different_moments_resumes_exactly(ddp_oracle, tmp_path):
    """Each rank gets SLURM's signal at its own moment (timers): the ranks agree on one consistent point, rank 0
    requeues once the file is complete, no rank hangs, and the requeued job continues every rank exactly."""
    full_dir = ddp_oracle
    rng = random.Random(f"{SEED}-ddp")
    moments = [rng.uniform(0, PACED_TRAINING_S), rng.uniform(0, PACED_TRAINING_S)]
    outcome = chaos.deliver_ddp(tmp_path / "job", full_dir, moments)
    assert outcome.exact, f"{outcome} (MIDEPOCH_CHAOS_SEED={SEED} repeats this sample)"
    assert outcome.checkpoint is not None, "the signals came after training: the sample tested nothing"


@pytest.mark.slow
def test_sigterm_to_one_rank_of_two_stops_every_rank_at_one_point_and_resumes_exactly(ddp_oracle, tmp_path):
    """SIGTERM to rank 1 only (Lightning's notifier broadcasts from inside its handler; stock Lightning hangs here):
    every rank serves it at one agreed point, raises Lightning's SIGTERM exception there, and the
    ``OnExceptionCheckpoint`` file holds every rank's states, so the next job continues every rank exactly."""
    full_dir = ddp_oracle
    moment = random.Random(f"{SEED}-sigterm").uniform(0, PACED_TRAINING_S)
    outcome = chaos.deliver_ddp(tmp_path / "job", full_dir, [None, moment], flow_name="sigterm")
    assert outcome.exact, f"{outcome} (MIDEPOCH_CHAOS_SEED={SEED} repeats this sample)"
    assert outcome.checkpoint == "on_exception.ckpt"


def _small_trainer(tmp_path, callbacks, max_epochs=1, **kwargs):
    return L.Trainer(
        max_epochs=max_epochs,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        **kwargs,
    )


@pytest.mark.slow
def test_a_slurm_signal_that_reaches_rank_0_after_every_rank_served_it_is_not_served_again(ddp_oracle, tmp_path):
    """Rank 1 gets SLURM's signal first: both ranks serve it at one agreed point; rank 0's own delivery, a moment
    later, asks for nothing more (one hpc checkpoint, one requeue), and the requeued job resumes exactly."""
    full_dir = ddp_oracle
    outcome = chaos.deliver_ddp(tmp_path / "job", full_dir, [0.15, 0.05])
    assert outcome.exact, outcome
    assert outcome.checkpoint is not None, "the signals came after training: the case tested nothing"


@pytest.mark.slow
def test_uninterrupted_two_rank_slurm_jobs_exit_0_on_every_rank(tmp_path):
    """2-rank DDP jobs launched as SLURM tasks, never signalled, end as stock's do: every task exits 0 (each
    collective of the callback's is one every rank reaches, so no rank is left in one as another leaves; ``make
    chaos`` runs ten)."""
    for index in range(2):
        job_dir = tmp_path / f"job{index}"
        assert chaos.slurm_step_codes(job_dir, 0, None) == [0, 0], chaos._log_tails(job_dir)


def _fake_ddp_job(monkeypatch, written: dict[int, list[int]], checkpoint: bool) -> None:
    """``chaos.slurm_step`` replaced: each attempt's tasks "end" at once, and only the ranks ``written`` names for that
    attempt leave their result (the others were killed before they wrote it); with ``checkpoint``, the first attempt
    leaves an hpc checkpoint."""

    def step(job_dir, attempt, signal_after, **kwargs):
        job_dir.mkdir(parents=True, exist_ok=True)
        result = {"seen": [1, 2], "params": {"w": torch.ones(2)}, "signalled_in_training": False}
        for rank in written.get(attempt, []):
            torch.save(result if attempt == 0 else {**result, "seen": []}, job_dir / f"rank{rank}-{attempt}.pt")
        if checkpoint and attempt == 0:
            torch.save({"chaos_trained": 2}, job_dir / "hpc_ckpt_1.ckpt")
        return "done"

    monkeypatch.setattr(chaos, "slurm_step", step)


@pytest.mark.parametrize(
    ("written", "checkpoint", "why"),
    [
        ({0: [0]}, False, "the signalled job: rank 1 wrote no rank1-0.pt"),
        ({0: [0, 1], 1: [1]}, True, "the requeued job: rank 0 wrote no rank0-1.pt"),
        ({0: [1], 1: [0, 1]}, True, "the signalled job: rank 0 wrote no rank0-0.pt"),
    ],
    ids=["uninterrupted", "requeued", "signalled"],
)
def test_a_ddp_delivery_whose_rank_left_no_result_is_inexact_with_the_reason(
    written, checkpoint, why, monkeypatch, tmp_path
):
    """A rank killed before it wrote its result: every path of ``deliver_ddp`` (no checkpoint: the run compared as
    it is; a checkpoint: the requeued job compared) says so in an inexact outcome, never a success or a crash."""
    full_dir = tmp_path / "full"
    full_dir.mkdir()
    for rank in range(2):
        torch.save({"seen": [1, 2], "params": {"w": torch.ones(2)}}, full_dir / f"rank{rank}-0.pt")
    _fake_ddp_job(monkeypatch, written, checkpoint)
    outcome = chaos.deliver_ddp(tmp_path / "job", full_dir, [0.1, 0.1])
    assert not outcome.exact
    assert outcome.why.startswith(why), outcome.why
    assert outcome.checkpoint == ("hpc_ckpt_1.ckpt" if checkpoint else None)


def test_a_ddp_delivery_with_every_result_written_is_exact(monkeypatch, tmp_path):
    """The fake job of the test above, every rank's result written: exact (the comparison itself is not fooled)."""
    full_dir = tmp_path / "full"
    full_dir.mkdir()
    for rank in range(2):
        torch.save({"seen": [1, 2], "params": {"w": torch.ones(2)}}, full_dir / f"rank{rank}-0.pt")
    _fake_ddp_job(monkeypatch, {0: [0, 1], 1: [0, 1]}, True)
    outcome = chaos.deliver_ddp(tmp_path / "job", full_dir, [0.1, 0.1])
    assert outcome.exact, outcome.why
    assert outcome.checkpoint == "hpc_ckpt_1.ckpt"


def test_a_task_killed_while_it_writes_its_result_leaves_no_torn_file(monkeypatch, tmp_path):
    """``tests/slurm_job.py`` writes its result beside, then renames it into place: a write stopped half-way (here
    an error after the first bytes) leaves neither the result nor the temporary file."""
    import slurm_job

    def torn_save(obj, path):
        with open(path, "wb") as file:
            file.write(b"PK\x03\x04")
        raise KeyboardInterrupt  # (as a signal would stop the write)

    target = tmp_path / "rank0-0.pt"
    monkeypatch.setattr(slurm_job.torch, "save", torn_save)
    with pytest.raises(KeyboardInterrupt):
        slurm_job.write_result({"seen": [1]}, target)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    slurm_job.write_result({"seen": [1]}, target)
    assert list(tmp_path.iterdir()) == [target]
    assert torch.load(target, weights_only=False) == {"seen": [1]}


@pytest.mark.slow
@pytest.mark.parametrize("flow_name", ["slurm", "sigterm"])
def test_under_ddp_a_checkpoint_asked_for_during_a_validation_is_written_within_one_validation_batch(
    flow_name, tmp_path
):
    """Every rank of a 2-rank job gets SLURM's signal (or SIGTERM) as the second of its 3 validation batches starts:
    the checkpoint is written at that batch's end, as stock writes it within that batch (the ranks exchange their
    signals at the ends of validation batches every rank is sure to reach: same known length), not after the
    validation; the next job runs that validation again and continues every rank exactly."""
    full_dir = tmp_path / "full"
    assert chaos.slurm_step(full_dir, 0, None, extra=("--val-size", "12")) == "done"
    extra = ("--val-size", "12", "--signal-in-validation", "1")
    outcome = chaos.deliver_ddp(tmp_path / "job", full_dir, [None, None], flow_name=flow_name, extra=extra)
    assert outcome.exact, outcome
    for rank in range(2):
        batch, saves = torch.load(tmp_path / "job" / f"rank{rank}-0.pt", weights_only=False)["validation_signal"]
        assert batch == 1
        assert [begun for _, begun in saves] == [2], f"rank {rank}: validation batches begun at each checkpoint"


@pytest.mark.slow
@pytest.mark.parametrize("where", ["training", "validation"])
def test_an_error_on_one_rank_ends_every_rank_as_stock(where, tmp_path):
    """A user's error on rank 1 at step 5 (or at the end of the first validation batch, where the ranks exchange
    their signals): every rank ends with the exit code stock Lightning's does, none hangs."""
    error = ("--raise-on", "1", "5") if where == "training" else ("--raise-on", "1", "0", "--raise-in-validation")
    error = (*error, "--val-size", "12")
    stock = chaos.slurm_step_codes(tmp_path / "stock", 0, None, stock=True, timeout=120, extra=error)
    ours = chaos.slurm_step_codes(tmp_path / "ours", 0, None, timeout=120, extra=error)
    assert None not in stock, "stock Lightning hung: the case cannot tell"
    assert stock[1] != 0, "the error was not raised"
    assert ours == stock, chaos._log_tails(tmp_path / "ours")


class _StoppedHere(Exception):
    pass


def test_an_exception_while_the_recorders_are_installed_surfaces_and_leaves_the_loader_its_own_sampler(
    tmp_path, monkeypatch
):
    """An exception in the middle of the recorders' installation (make chaos: the kill of a signal served by
    Lightning's own handler, before the callback's deferral, lands there): ``on_exception`` takes every recorder out
    again, and no ``ValueError`` of the callback's clean-up joins the exception (Lightning's teardown may add its own:
    its fetcher was set up, its iterator not yet started, as in stock's shorter window between the two)."""
    from lightning_midepoch import _recording
    from lightning_midepoch._order import _IndexSamplerRecorder

    installed = []
    install = _recording.Recording._install_recorder

    def install_then_stop(self, loader):
        installed.append((loader, loader.batch_sampler, install(self, loader)))
        raise _StoppedHere  # after the recorder is in the loader, before attach lists it

    monkeypatch.setattr(_recording.Recording, "_install_recorder", install_then_stop)
    model = chaos.Model(replace(chaos.CONFIG, max_epochs=1, validation=False))
    with pytest.raises((_StoppedHere, RuntimeError)) as raised:  # (RuntimeError: Lightning's teardown)
        _small_trainer(tmp_path, [MidEpochResume()], limit_val_batches=0).fit(model)
    chain, error = [], raised.value
    while error is not None:
        chain.append(type(error))
        error = error.__context__
    assert _StoppedHere in chain
    assert ValueError not in chain, chain
    [(loader, own, recorder)] = installed
    assert isinstance(recorder, _IndexSamplerRecorder)
    assert loader.batch_sampler is own


def test_a_trainer_that_is_never_signalled_keeps_the_handlers_lightning_registers(tmp_path):
    """Lightning's SIGTERM notifier (it checkpoints nothing, in one process) stays as Lightning registers it; after
    fit the process's own handlers are back, as stock Lightning leaves them."""
    seen = {}

    class Look(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            seen["during"] = type(signal.getsignal(signal.SIGTERM)).__name__

    before = signal.getsignal(signal.SIGTERM)
    model = chaos.Model(replace(chaos.CONFIG, max_epochs=1, validation=False))
    _small_trainer(tmp_path, [MidEpochResume(), Look()], limit_val_batches=0).fit(model)
    assert seen["during"] == "_HandlersCompose"
    assert signal.getsignal(signal.SIGTERM) == before


class _SignalInStep(L.Callback):
    """Raises ``signum`` in ``on_train_batch_start`` of one batch, noting whether its handler ran before it returned."""

    def __init__(self, signum: int, batch: int, calls: list) -> None:
        self.signum, self.batch, self.calls = signum, batch, calls
        self.ran_at_once: bool | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.batch:
            signal.raise_signal(self.signum)
            self.ran_at_once = any(call == self.signum or isinstance(call, str) for call in self.calls)


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM], ids=lambda s: s.name)
def test_a_users_handler_that_does_not_checkpoint_runs_at_once_with_its_frame(signum, tmp_path):
    """A stack dump on SIGUSR1 (or a profiler toggle) runs where the signal lands, with that frame, as in stock."""
    calls: list[str | None] = []
    previous = signal.signal(signum, lambda number, frame: calls.append(frame.f_code.co_name if frame else None))
    try:
        raiser = _SignalInStep(signum, 2, calls)
        model = chaos.Model(replace(chaos.CONFIG, max_epochs=1, validation=False))
        trainer = _small_trainer(tmp_path, [MidEpochResume(), raiser], limit_val_batches=0)
        if signum == signal.SIGTERM:  # Lightning's notifier runs too: its exception ends the fit, as in stock
            with pytest.raises(SIGTERMException):
                trainer.fit(model)
        else:
            trainer.fit(model)
    finally:
        signal.signal(signum, previous)
    assert raiser.ran_at_once is True
    assert calls == ["on_train_batch_start"]


def test_a_declared_signals_handler_runs_at_the_batchs_end_once(tmp_path):
    calls: list[int] = []

    class Step(L.Callback):
        def on_train_batch_end(self, trainer, *args) -> None:
            calls.append(-trainer.global_step)

    previous = signal.signal(signal.SIGUSR2, lambda number, frame: calls.append(number))
    try:
        raiser = _SignalInStep(signal.SIGUSR2, 2, calls)
        model = chaos.Model(replace(chaos.CONFIG, max_epochs=1, validation=False))
        callbacks = [Step(), MidEpochResume(checkpoint_signals=[signal.SIGUSR2]), raiser]
        _small_trainer(tmp_path, callbacks, limit_val_batches=0, max_steps=4).fit(model)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert raiser.ran_at_once is False
    assert calls == [-1, -2, -3, signal.SIGUSR2, -4]  # at the end of the batch it landed in (global_step 3 then)


@pytest.mark.parametrize("bad", [signal.SIGKILL, 0, "SIGUSR1", 1.5], ids=repr)
def test_checkpoint_signals_must_be_signals_a_handler_can_catch(bad):
    with pytest.raises(ValueError, match="`checkpoint_signals` takes signals a handler can catch"):
        MidEpochResume(checkpoint_signals=[bad])


_STUCK_WORKER = """
import sys, time
import torch
sys.path.insert(0, sys.argv[1])
import chaos

class Stuck(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        time.sleep(60)

chaos.dump_on_sigquit()
with chaos.HangWatch("the stuck loader", timeout=1):
    next(iter(torch.utils.data.DataLoader(Stuck(), num_workers=1)))
"""


@pytest.mark.slow
def test_a_hang_in_the_chaos_campaign_ends_it_with_every_threads_stack_workers_included(tmp_path):
    """``make chaos`` once hung for good in a delivery; now the delivery's watch ends the process (exit 3) with the
    stacks of its threads and of its DataLoader workers' (here a worker stuck in ``__getitem__``)."""
    script = tmp_path / "stuck.py"
    script.write_text(_STUCK_WORKER)
    done = subprocess.run(
        [sys.executable, str(script), str(Path(chaos.__file__).parent)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert "HANG: the stuck loader still runs after 1 s" in done.stdout
    assert "in __getitem__" in done.stderr, done.stderr  # the worker's stack
    assert "in _get_data" in done.stderr or "in _try_get_data" in done.stderr, done.stderr  # the main thread's
