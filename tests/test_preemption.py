"""Pre-emption: signals that ask for a checkpoint are served at consistent points, and the resumes are exact.

The Trainer-level cases deliver the signal at a counted line of the main thread (``tests/chaos.py``), or, for the
2-rank job, by a timer in each task (``tests/slurm_job.py``); ``make chaos`` runs at least 300 deliveries.
"""

from __future__ import annotations

import os
import random
import signal
import tempfile
import threading
import time
from dataclasses import replace

import pytest
import torch

import chaos
from harness import L
from lightning_midepoch import MidEpochResume
from lightning_midepoch._inspect import InspectError, load_checkpoint
from lightning_midepoch._preemption import Agreement, SignalDeferral, candidate_signals, temporary_files_in

#: the seed of this run's sample of deliveries (``MIDEPOCH_CHAOS_SEED=S make test`` repeats one)
SEED = int(os.environ.get("MIDEPOCH_CHAOS_SEED", random.SystemRandom().randrange(2**31)))


@pytest.fixture
def usr2():
    """SIGUSR2 with a handler that records its calls (the process's own handler is put back after the test)."""
    calls: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))
    yield calls
    signal.signal(signal.SIGUSR2, previous)


def test_a_deferred_signal_runs_its_handler_only_when_served(usr2):
    deferral = SignalDeferral((signal.SIGUSR2,))
    deferral.install()
    signal.raise_signal(signal.SIGUSR2)
    signal.raise_signal(signal.SIGUSR2)  # a repeat before the point: one request
    assert usr2 == []
    assert deferral.serve() is True
    assert usr2 == [signal.SIGUSR2]
    assert deferral.serve() is False  # nothing pending
    deferral.uninstall()
    signal.raise_signal(signal.SIGUSR2)  # the handler is back
    assert usr2 == [signal.SIGUSR2, signal.SIGUSR2]


def test_a_repeat_while_its_handler_runs_is_coalesced_and_another_signal_waits():
    calls: list[int] = []

    def handler(signum, frame):
        calls.append(signum)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGUSR2)  # the same signal again, while the checkpoint is being written
            signal.raise_signal(signal.SIGUSR1)  # another one

    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGUSR1, signal.SIGUSR2)}
    try:
        deferral = SignalDeferral((signal.SIGUSR1, signal.SIGUSR2))
        deferral.install()
        signal.raise_signal(signal.SIGUSR2)
        deferral.serve()
        assert calls == [signal.SIGUSR2]
        assert deferral.pending == [signal.SIGUSR1]
        deferral.serve()
        assert calls == [signal.SIGUSR2, signal.SIGUSR1]
        assert deferral.received == 3
        deferral.uninstall()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@pytest.mark.parametrize("handler", [signal.SIG_DFL, signal.SIG_IGN, signal.default_int_handler], ids=repr)
def test_the_default_action_ignoring_and_ctrl_c_are_left_alone(handler):
    previous = signal.signal(signal.SIGUSR2, handler)
    try:
        deferral = SignalDeferral((signal.SIGUSR2,))
        deferral.install()
        assert not deferral.installed
        assert signal.getsignal(signal.SIGUSR2) == handler
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_uninstall_leaves_a_handler_set_since_alone(usr2):
    deferral = SignalDeferral((signal.SIGUSR2,))
    deferral.install()
    replacement = lambda signum, frame: None  # noqa: E731
    signal.signal(signal.SIGUSR2, replacement)
    deferral.uninstall()
    assert signal.getsignal(signal.SIGUSR2) is replacement


def test_the_ranks_agreement_decides_what_is_served(usr2):
    deferral = SignalDeferral((signal.SIGUSR1, signal.SIGUSR2))
    deferral.install()
    # another rank received SIGUSR2: this one serves it too, at the same point
    assert deferral.serve(agree=lambda pending: [*pending, int(signal.SIGUSR2)]) is True
    assert usr2 == [signal.SIGUSR2]
    deferral.uninstall()


@pytest.fixture
def one_rank_group():
    """A process group of one rank (gloo): the ranks' agreement runs its collective for real."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


def test_the_ranks_compare_at_an_interval_they_agree_on_and_at_the_end(one_rank_group, monkeypatch):
    clock = iter(float(second) for second in range(100))
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))  # each read: one second later
    agreement = Agreement((signal.SIGUSR1, signal.SIGTERM), torch.device("cpu"), period=4.0)
    # the first point compares and has measured nothing: the next compares too, and sizes the interval
    assert agreement([int(signal.SIGTERM)]) == [signal.SIGTERM]
    assert (agreement.comparisons, agreement.interval) == (1, 1)
    assert agreement([]) == []
    assert agreement.comparisons == 2
    compared_at = agreement.interval
    assert compared_at > 1  # points a second apart, a 4 s period
    assert [agreement([int(signal.SIGUSR1)]) for _ in range(compared_at - 1)] == [[]] * (compared_at - 1)
    assert agreement([int(signal.SIGUSR1)]) == [signal.SIGUSR1]  # the interval's last point compares
    agreement.compare_next()  # the end of training
    assert agreement([int(signal.SIGTERM)]) == [signal.SIGTERM]


def test_a_deferral_installs_only_in_the_main_thread(usr2):
    deferral = SignalDeferral((signal.SIGUSR2,))
    worker = threading.Thread(target=deferral.install)
    worker.start()
    worker.join()
    assert not deferral.installed


def test_uninstall_drops_what_is_pending(usr2):
    deferral = SignalDeferral((signal.SIGUSR2,))
    deferral.install()
    signal.raise_signal(signal.SIGUSR2)
    deferral.uninstall()
    assert usr2 == []
    assert deferral.pending == []


def test_candidate_signals_add_a_custom_requeue_signal_once():
    assert candidate_signals(signal.SIGUSR1) == candidate_signals()
    assert candidate_signals(signal.SIGHUP)[-1] == signal.SIGHUP


def test_handlers_served_write_their_temporary_files_beside_the_checkpoints(tmp_path):
    elsewhere = tempfile.gettempdir()
    with temporary_files_in(str(tmp_path)):
        assert tempfile.gettempdir() == str(tmp_path)
        with tempfile.NamedTemporaryFile() as file:
            assert os.path.dirname(file.name) == str(tmp_path)
    assert tempfile.gettempdir() == elsewhere
    with temporary_files_in(str(tmp_path / "missing")):  # not a local folder: as it was
        assert tempfile.gettempdir() == elsewhere


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


#: the files that write a checkpoint into place (fsspec's local transaction, shutil's move), and how many kills are
#: spread over their lines
WRITE = ("fsspec/implementations/local.py", "/shutil.py")
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
    requeued job would pick. The callback's handler writes beside the checkpoint: a kill at any line of the write
    leaves the newest file whole (or none)."""
    other = "/dev/shm"
    assert os.stat(other).st_dev != os.stat(tmp_path).st_dev, f"{other} must be another filesystem than {tmp_path}"
    flow, config = chaos.FLOWS["slurm"], chaos.CONFIG
    never = 10**12  # the trigger only counts lines, records those of shutil and kills; _SignalAt signals
    found = {}
    for callback in (True, False):
        signal_at = (_SignalAt(signal.SIGUSR1, 7),)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(tempfile, "tempdir", other)
            probe = chaos.run_job(
                config,
                flow,
                tmp_path / f"probe-{callback}",
                callback=callback,
                at=never,
                record=WRITE,
                extra_callbacks=signal_at,
            )
            assert probe.trigger is not None
            writes = probe.trigger.recorded
            assert writes, "the checkpoint's write ran no line of fsspec or shutil"
            states = []
            for index in range(KILLS):
                kill = writes[index * (len(writes) - 1) // (KILLS - 1)]
                job_dir = tmp_path / f"kill-{callback}-{index}"
                chaos.run_job(
                    config, flow, job_dir, callback=callback, at=never, kill_line=kill, extra_callbacks=signal_at
                )
                states.append(_newest_hpc_state(job_dir))
        found[callback] = states
    assert "truncated" not in found[True], found
    assert "truncated" in found[False], found  # the stock control: the harness does reach the copy


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


#: a moment within the 2-rank job's training however fast the machine: each of its steps takes at least
#: tests/slurm_job.py's Paced.PACE (0.01 s)
PACED_TRAINING_S = 0.6 * 0.01 * chaos.DDP_CONFIG.max_epochs * chaos.DDP_CONFIG.batches_per_epoch / 2


@pytest.mark.slow
def test_a_requeued_slurm_job_of_two_ranks_signalled_at_different_moments_resumes_exactly(tmp_path):
    """Each rank gets SLURM's signal at its own moment (timers): the ranks agree on one consistent point, rank 0
    requeues once the file is complete, no rank hangs, and the requeued job continues every rank exactly."""
    full_dir = tmp_path / "full"
    assert chaos.slurm_step(full_dir, 0, None) == "done"
    rng = random.Random(f"{SEED}-ddp")
    moments = [rng.uniform(0, PACED_TRAINING_S), rng.uniform(0, PACED_TRAINING_S)]
    outcome = chaos.deliver_ddp(tmp_path / "job", full_dir, moments)
    assert outcome.exact, f"{outcome} (MIDEPOCH_CHAOS_SEED={SEED} repeats this sample)"
    assert outcome.checkpoint is not None, "the signals came after training: the sample tested nothing"


@pytest.mark.slow
def test_sigterm_to_one_rank_of_two_stops_every_rank_at_one_point_and_resumes_exactly(tmp_path):
    """SIGTERM to rank 1 only (Lightning's notifier broadcasts from inside its handler; stock Lightning hangs here):
    every rank serves it at one agreed point, raises Lightning's SIGTERM exception there, and the
    ``OnExceptionCheckpoint`` file holds every rank's states, so the next job continues every rank exactly."""
    full_dir = tmp_path / "full"
    assert chaos.slurm_step(full_dir, 0, None) == "done"
    moment = random.Random(f"{SEED}-sigterm").uniform(0, PACED_TRAINING_S)
    outcome = chaos.deliver_ddp(tmp_path / "job", full_dir, [None, moment], flow_name="sigterm")
    assert outcome.exact, f"{outcome} (MIDEPOCH_CHAOS_SEED={SEED} repeats this sample)"
    assert outcome.checkpoint == "on_exception.ckpt"


def test_a_trainer_that_is_never_signalled_keeps_the_handlers_lightning_registers(tmp_path):
    """Between Lightning's registration and its teardown the deferral holds the signals; after fit the process's
    own handlers are back, as stock Lightning leaves them."""
    seen = {}

    class Look(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            handler = signal.getsignal(signal.SIGTERM)
            seen["during"] = type(getattr(handler, "__self__", None)).__name__

    before = signal.getsignal(signal.SIGTERM)
    model = chaos.Model(replace(chaos.CONFIG, max_epochs=1, validation=False))
    trainer = L.Trainer(
        max_epochs=1,
        limit_val_batches=0,
        callbacks=[MidEpochResume(), Look()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model)
    assert seen["during"] == "SignalDeferral"
    assert signal.getsignal(signal.SIGTERM) == before
