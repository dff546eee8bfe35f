"""`lightning-midepoch inspect`: resume points, verdicts, the JSON schema, bad input and read-only access."""

from __future__ import annotations

import argparse
import copy
import hashlib
import io
import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from harness import Config, CrashPoint, checkpoint_path, run
from lightning_midepoch import __version__, _inspect
from lightning_midepoch import _state as S
from lightning_midepoch.__main__ import main
from lightning_midepoch._inspect import analyse
from lightning_midepoch._restart import Counts, ResumePoint, batch_stage, epoch_stage, resume_point

MID = CrashPoint("train_batch_end", epoch=1, batch=3)
CASES = {
    "exact": (Config(), True, MID),
    "iterable": (Config(iterable="plain"), True, MID),
    "stock_mid": (Config(), False, MID),
    "stock_end": (Config(), False, CrashPoint("train_epoch_end", epoch=1)),
}

TOP_KEYS = {
    "schema_version",
    "path",
    "written_by",
    "installed",
    "resume",
    "global_step",
    "world_size",
    "state",
    "rng",
    "last_batch",
    "loaders",
    "verdict",
    "blockers",
    "caveats",
    "conditions",
    "exit_code",
}
LOADER_KEYS = {
    "index",
    "kind",
    "dataset_length",
    "batch_size",
    "drop_last",
    "num_batches",
    "order",
    "seed_determined",
    "pass_index",
    "batches_consumed",
    "samples_consumed",
    "snapshot_present",
    "continues",
    "num_workers",
    "worker_states",
    "worker_states_expected",
}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real checkpoints written by the harness, once for the module."""
    paths = {}
    for name, (config, callback, crash) in CASES.items():
        directory = tmp_path_factory.mktemp(name)
        assert run(config, directory, callback=callback, crash=crash).crashed
        paths[name] = checkpoint_path(directory, crash)
    return paths


def load(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


def save_copy(checkpoint: Any, path: Path) -> Path:
    torch.save(checkpoint, path)
    return path


def cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    code = main(["inspect", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def cli_json(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, dict[str, Any]]:
    code, out, err = cli(capsys, "--json", *args)
    assert err == ""
    return code, json.loads(out)


def analysed(checkpoint: dict[str, Any]) -> _inspect.Report:
    return analyse(checkpoint, "in-memory.ckpt")


# ---------------------------------------------------------------------------------------------- resume position
@pytest.mark.parametrize(
    ("counts", "stage"),
    [
        (Counts(2, 1, 1, 1), "epoch_start"),
        (Counts(2, 2, 1, 1), "mid_epoch"),
        (Counts(2, 2, 2, 1), "epoch_end"),
        (Counts(3, 3, 3, 3), "between_epochs"),
        (Counts(3, 1, 1, 1), "unknown"),
    ],
)
def test_epoch_stage(counts, stage):
    assert epoch_stage(counts) == stage


@pytest.mark.parametrize(
    ("counts", "stage"),
    [
        (Counts(4, 4, 4, 3), "batch_end"),
        (Counts(4, 4, 3, 3), "in_batch"),  # in backward / the optimizer step / an exception
        (Counts(4, 3, 3, 3), "in_batch"),  # in on_train_batch_start
        (Counts(4, 4, 4, 4), "between_batches"),
        (Counts(4, 5, 5, 5), "unknown"),
    ],
)
def test_batch_stage(counts, stage):
    assert batch_stage(counts) == stage


E_MID = Counts(2, 2, 1, 1)


# counters as Lightning 2.6 writes them at each point (taken from harness checkpoints)
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(
            (1, E_MID, Counts(14, 14, 14, 13), Counts(4, 4, 4, 3), False),
            ResumePoint("batch_end", 1, 4, 4, False),
            id="on_train_batch_end",
        ),
        pytest.param(
            (1, E_MID, Counts(14, 14, 13, 13), Counts(4, 4, 3, 3), False),
            ResumePoint("in_batch", 1, 3, 3, False),
            id="inside-a-batch",
        ),
        pytest.param(
            (1, E_MID, Counts(14, 14, 14, 14), Counts(4, 4, 4, 4), False),
            ResumePoint("between_batches", 1, 4, 4, False),
            id="validation-mid-epoch",
        ),
        pytest.param(
            (1, E_MID, Counts(20, 20, 20, 19), Counts(10, 10, 10, 9), True),
            ResumePoint("batch_end", 1, 10, 10, True),
            id="last-batch",
        ),
        pytest.param(
            (1, E_MID, Counts(20, 20, 20, 20), Counts(10, 10, 10, 10), True),
            ResumePoint("between_batches", 1, 10, 10, True),
            id="validation-at-epoch-end",
        ),
        pytest.param(
            (1, Counts(2, 1, 1, 1), Counts(10, 10, 10, 10), Counts(10, 10, 10, 10), True),
            ResumePoint("epoch_start", 1, 0, 0, False),
            id="on_train_epoch_start",
        ),
        pytest.param(
            (1, Counts(2, 2, 2, 1), Counts(20, 20, 20, 20), Counts(10, 10, 10, 10), True),
            ResumePoint("epoch_end", 2, 0, 0, False),
            id="on_train_epoch_end",
        ),
        pytest.param(
            (3, Counts(3, 3, 3, 3), Counts(30, 30, 30, 30), Counts(10, 10, 10, 10), True),
            ResumePoint("between_epochs", 3, 0, 0, False),
            id="after-fit",
        ),
        pytest.param(
            # on_train_batch_end of batch_idx 6, after an earlier resume from on_train_batch_start of batch_idx 3:
            # the totals no longer say "on_train_batch_end", so Lightning runs batch_idx 6 again
            (1, E_MID, Counts(18, 17, 17, 16), Counts(7, 7, 7, 6), False),
            ResumePoint("batch_end", 1, 6, 7, False),
            id="drifted-totals",
        ),
        pytest.param(
            (1, Counts(3, 1, 1, 1), Counts(4, 4, 4, 3), Counts(4, 4, 4, 3), False),
            ResumePoint("unknown", 1, None, None, False),
            id="unknown-epoch-progress",
        ),
        pytest.param(
            (1, E_MID, Counts(4, 5, 5, 5), Counts(4, 5, 5, 5), False),
            ResumePoint("unknown", 1, None, None, False),
            id="unknown-batch-progress",
        ),
    ],
)
def test_resume_point(args, expected):
    point = resume_point(*args)
    assert point == expected
    assert point.continues_epoch == (
        expected.saved_at in ("batch_end", "in_batch", "between_batches") and not point.epoch_done
    )


@pytest.mark.parametrize(
    ("point", "saved", "resumes"),
    [
        (
            ResumePoint("epoch_start", 1, 0, 0, False),
            "in on_train_epoch_start of epoch 1",
            "the start of epoch 1 (batch_idx 0)",
        ),
        (
            ResumePoint("epoch_end", 2, 0, 0, False),
            "at the end of epoch 1 (on_train_epoch_end)",
            "the start of epoch 2 (batch_idx 0)",
        ),
        (ResumePoint("between_epochs", 0, 0, 0, False), "before the first epoch", "the start of epoch 0 (batch_idx 0)"),
        (
            ResumePoint("between_epochs", 3, 0, 0, False),
            "between epochs, after epoch 2 finished",
            "the start of epoch 3 (batch_idx 0)",
        ),
        (
            ResumePoint("batch_end", 1, 4, 4, False),
            "in on_train_batch_end of batch_idx 3, epoch 1",
            "epoch 1, batch_idx 4 (first the rest of batch_idx 3: a validation or scheduler step due after it)",
        ),
        (
            ResumePoint("batch_end", 1, 10, 10, True),
            "in on_train_batch_end of batch_idx 9, epoch 1",
            "the end of epoch 1: no batch is left, its validation and epoch-end hooks run, then epoch 2 starts at"
            " batch_idx 0",
        ),
        (
            ResumePoint("in_batch", 1, 3, 3, False),
            "inside batch_idx 3 of epoch 1, before it finished",
            "epoch 1, batch_idx 3 again (it had not finished)",
        ),
        (
            ResumePoint("between_batches", 1, 4, 4, False),
            "after batch_idx 3 of epoch 1 completed (e.g. in the validation after it)",
            "epoch 1, batch_idx 4",
        ),
        (ResumePoint("between_batches", 1, 0, 0, False), "in epoch 1, before its first batch", "epoch 1, batch_idx 0"),
        (
            ResumePoint("batch_end", 1, 6, 7, False),
            "in on_train_batch_end of batch_idx 6, epoch 1",
            "epoch 1, batch_idx 6",
        ),
    ],
)
def test_resume_point_text(point, saved, resumes):
    assert (_inspect._saved_text(point), _inspect._resumes_text(point)) == (saved, resumes)


def test_counts_parse_rejects_what_is_not_a_tracker():
    assert Counts.parse({"ready": 1, "started": 1, "processed": 1}) is None
    assert Counts.parse({"ready": True, "started": 1, "processed": 1, "completed": 1}) is None
    assert Counts.parse([1, 1, 1, 1]) is None


# ---------------------------------------------------------------------------------------------- verdicts
def test_exact_mid_epoch_checkpoint_text(ckpts, capsys):
    code, out, err = cli(capsys, ckpts["exact"])
    state_bytes = io.BytesIO()
    torch.save(load(ckpts["exact"])["callbacks"]["MidEpochResume"], state_bytes)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"Checkpoint:         {ckpts['exact']}"
    assert f"Written by:         lightning 2.6.6, lightning-midepoch {__version__}, torch" in out
    assert "Saved:              in on_train_batch_end of batch_idx 3, epoch 1" in lines
    assert "Resumes at:         epoch 1, batch_idx 4 (first the rest of batch_idx 3" in out
    assert "Global step:        14" in lines
    assert "World size:         1" in lines
    assert "RNG states:         present for every rank (1 of 1)" in lines
    assert (
        "Batch check:        last batch trained fingerprinted for every rank (4 parts): the resumed run loads it again"
        " and compares it before training"
    ) in lines
    assert f"MidEpochResume:     state version 1, adds {state_bytes.tell():,} bytes" in out
    table = lines.index("  #  kind  samples  batch size  drop_last  batches  consumed")
    assert lines[table + 1].split() == ["0", "map", "20", "2", "False", "10", "4", "batches,", "8", "samples"]
    assert lines[table + 2] == (
        "     order: BatchSampler over RandomSampler (global torch RNG), snapshot present; continues exactly"
    )
    assert "Verdict:            EXACT" in out
    assert "The verdict assumes the resumed run has 1 device(s) and the same 1 train dataloader(s)" in out
    assert "On another number of devices the interrupted epoch is finished elastically" in out
    assert 'MidEpochResume(on_mismatch="restart_epoch")' in out  # what would stop it, and the way out
    assert "caveat" not in out


def test_exact_mid_epoch_checkpoint_json(ckpts, capsys):
    code, doc = cli_json(capsys, ckpts["exact"])
    assert code == 0
    assert set(doc) == TOP_KEYS
    assert doc["schema_version"] == 1
    assert doc["path"] == str(ckpts["exact"])
    assert doc["written_by"] == {"lightning": "2.6.6", "lightning_midepoch": __version__, "torch": torch.__version__}
    assert doc["resume"] == {"saved_at": "batch_end", "epoch": 1, "batch": 4, "batches_trained": 4, "epoch_done": False}
    assert (doc["global_step"], doc["world_size"]) == (14, 1)
    assert doc["state"]["present"] is True
    assert doc["state"]["version"] == 1
    assert doc["state"]["bytes"] > 1000
    assert doc["rng"] == {"ranks_present": [0], "ranks_missing": [], "all_present": True, "cuda": False}
    assert doc["last_batch"] == {"ranks_present": [0], "parts": 4, "why_absent": None}
    (loader,) = doc["loaders"]
    assert set(loader) == LOADER_KEYS
    assert loader == {
        "index": 0,
        "kind": "map",
        "dataset_length": 20,
        "batch_size": 2,
        "drop_last": False,
        "num_batches": 10,
        "order": "BatchSampler over RandomSampler (global torch RNG)",
        "seed_determined": False,
        "pass_index": 0,
        "batches_consumed": 4,
        "samples_consumed": 8,
        "snapshot_present": True,
        "continues": "exactly",
        "num_workers": None,
        "worker_states": None,
        "worker_states_expected": None,
    }
    assert (doc["verdict"], doc["blockers"], doc["caveats"], doc["exit_code"]) == ("exact", [], [], 0)
    # the JSON says the same as the report object (round trip)
    assert doc == analyse(load(ckpts["exact"]), str(ckpts["exact"])).to_json()


def test_iterable_dataset_without_state_has_caveats(ckpts, capsys):
    code, doc = cli_json(capsys, ckpts["iterable"])
    assert (code, doc["verdict"]) == (1, "caveats")
    (loader,) = doc["loaders"]
    assert (loader["kind"], loader["snapshot_present"], loader["continues"]) == ("iterable", False, "from_epoch_start")
    (caveat,) = doc["caveats"]
    assert "IterableDataset that saved no state" in caveat
    out = cli(capsys, ckpts["iterable"])[1]
    assert "     order: IterableDataset via DataLoader, no dataset state; restarts its epoch" in out.splitlines()
    assert "restarts from the beginning for the rest of epoch 1" in caveat


def test_iterable_dataset_with_state_is_exact(ckpts):
    checkpoint = load(ckpts["iterable"])
    checkpoint["callbacks"]["MidEpochResume"]["ranks"][0]["dataset_states"] = [{"position": 8}]
    report = analysed(checkpoint)
    assert (report.verdict, report.loaders[0].continues) == ("exact", "exactly")


def test_stock_mid_epoch_checkpoint(ckpts, capsys):
    code, out, err = cli(capsys, ckpts["stock_mid"])
    assert (code, err) == (1, "")
    assert "Written by:         lightning 2.6.6, without MidEpochResume" in out
    assert "Resumes at:         epoch 1, batch_idx 4" in out
    assert "RNG states:         not saved" in out
    assert "Train dataloaders:  unknown (the checkpoint has no MidEpochResume state)" in out
    code, doc = cli_json(capsys, ckpts["stock_mid"])
    assert (code, doc["verdict"], doc["loaders"], doc["world_size"]) == (1, "caveats", None, None)
    assert doc["state"] == {"present": False, "version": None, "bytes": None, "mode": None}
    assert doc["rng"]["all_present"] is False
    no_rng, order = doc["caveats"]
    assert "holds no random states" in no_rng
    assert "SequentialSampler, DistributedSampler" in order
    assert "inspect cannot tell which" in order


def test_stock_epoch_end_checkpoint(ckpts, capsys):
    code, doc = cli_json(capsys, ckpts["stock_end"])
    assert (code, doc["verdict"]) == (1, "caveats")
    assert doc["resume"] == {"saved_at": "epoch_end", "epoch": 2, "batch": 0, "batches_trained": 0, "epoch_done": False}
    (caveat,) = doc["caveats"]  # only the random states: no batch of an epoch under way is at stake
    assert "holds no random states" in caveat


def test_future_state_version_is_not_possible(ckpts, tmp_path, capsys):
    checkpoint = load(ckpts["exact"])
    checkpoint["callbacks"]["MidEpochResume"]["version"] = 99
    code, out, err = cli(capsys, save_copy(checkpoint, tmp_path / "future.ckpt"))
    assert (code, err) == (2, "")
    assert "Verdict:            NOT POSSIBLE" in out
    assert "why: The checkpoint's MidEpochResume state has version 99" in out
    assert "opt-out: Upgrade lightning-midepoch, or resume without MidEpochResume" in out
    report = analysed(checkpoint)
    assert (report.verdict, report.loaders, report.exit_code) == ("not_possible", None, 2)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda state: state.update(loaders=None), "`loaders`: expected a list"),
        (lambda state: state.update(ranks="garbage"), "`ranks`: expected a list (one entry per rank), found a str"),
        (lambda state: state.update(mode=None), "`mode`: expected a str, found None."),
        (lambda state: state["loaders"][0].update(order=3), "`loaders[0].order`: expected a str, found an int (3)."),
        (
            lambda state: state["loaders"][0].update(batch_size="2"),
            "`loaders[0].batch_size`: expected None or an int >= 1, found a str ('2').",
        ),
        (lambda state: state.update(world_size=0), "`world_size`: expected an int >= 1, found an int (0)."),
        (lambda state: state["loaders"][0].update(kind="queue"), "`loaders[0].kind`: expected 'map' or 'iterable'"),
        (lambda state: state["ranks"][0].pop("passes"), "`ranks[0].passes`: expected a list"),
    ],
)
def test_damaged_state_is_not_possible(ckpts, damage, problem):
    checkpoint = load(ckpts["exact"])
    damage(checkpoint["callbacks"]["MidEpochResume"])
    report = analysed(checkpoint)
    assert report.verdict == "not_possible"
    (blocker,) = report.blockers
    assert blocker.reason.startswith(f"The checkpoint's MidEpochResume state is damaged: {problem}")
    assert "stops with a MidEpochResumeError naming that field" in blocker.reason
    assert blocker.opt_out.startswith("Resume from an earlier checkpoint, use MidEpochResume(on_mismatch=")
    assert "resume without MidEpochResume" in blocker.opt_out


def test_state_of_another_epoch_is_not_possible(ckpts):
    checkpoint = load(ckpts["exact"])
    checkpoint["callbacks"]["MidEpochResume"]["epoch"] = 5
    report = analysed(checkpoint)
    assert report.verdict == "not_possible"
    (blocker,) = report.blockers
    assert "malformed (its epoch (5) is not the checkpoint's (1))" in blocker.reason
    assert "resume without MidEpochResume" in blocker.opt_out


def test_state_that_is_not_a_dict_is_not_possible(ckpts):
    checkpoint = load(ckpts["exact"])
    checkpoint["callbacks"]["MidEpochResume"] = [1, 2]
    report = analysed(checkpoint)
    assert report.verdict == "not_possible"
    assert "it is a list, not a dict" in report.blockers[0].reason
    assert "MidEpochResume:     present, not a dict" in _inspect.render_text(report)


def test_weights_only_checkpoint_is_not_possible(ckpts):
    checkpoint = load(ckpts["stock_end"])
    del checkpoint["optimizer_states"], checkpoint["lr_schedulers"]
    report = analysed(checkpoint)
    assert report.verdict == "not_possible"
    assert "save_weights_only=True" in report.blockers[0].reason
    assert "load_from_checkpoint" in report.blockers[0].opt_out


def test_unsupported_lightning_here_is_not_possible(ckpts, monkeypatch):
    monkeypatch.setattr(_inspect, "_installed_lightning", lambda: ("lightning", "2.4.0"))
    report = analysed(load(ckpts["exact"]))
    assert report.verdict == "not_possible"
    assert "lightning 2.4.0 is installed" in report.blockers[0].reason
    assert (report.installed["lightning_package"], report.installed["lightning"]) == ("lightning", "2.4.0")


def test_cycling_loader_reports_its_pass(ckpts):
    checkpoint = load(ckpts["exact"])
    state = checkpoint["callbacks"]["MidEpochResume"]
    state["loaders"][0].update(dataset_length=6, num_batches=3)  # a short loader, restarted in max_size_cycle mode
    state["ranks"][0]["passes"][0]["index"] = 1
    report = analysed(checkpoint)
    loader = report.loaders[0]
    assert (loader.pass_index, loader.batches_consumed, loader.samples_consumed) == (1, 4, 8)
    assert (report.verdict, loader.continues) == ("exact", "exactly")
    assert "4 batches, 8 samples (pass 2 of the epoch)" in _inspect.render_text(report)


def test_cycling_loader_written_in_the_batch_that_restarted_it(tmp_path):
    """Inside the batch whose fetch started the loader's next pass, the resume continues in that recorded pass."""
    config = Config(dataset_size=5, batch_size=3, drop_last=True, combined="max_size_cycle")
    crash = CrashPoint("before_backward", epoch=0, batch=1)
    assert run(config, tmp_path, crash=crash).crashed
    report = analysed(load(checkpoint_path(tmp_path, crash)))
    loader = report.loaders[0]  # one batch per pass: batch 1 is its second pass's first
    assert (loader.pass_index, loader.batches_consumed, loader.continues) == (1, 1, "exactly")
    assert report.verdict == "exact"


def test_custom_batch_sampler_has_no_sample_count(ckpts):
    checkpoint = load(ckpts["exact"])
    checkpoint["callbacks"]["MidEpochResume"]["loaders"][0]["batch_size"] = None
    loader = analysed(checkpoint).loaders[0]
    assert (loader.batches_consumed, loader.samples_consumed) == (4, None)


def test_random_order_without_snapshot_continues_from_a_fresh_order(ckpts):
    checkpoint = load(ckpts["exact"])
    checkpoint["callbacks"]["MidEpochResume"]["ranks"][0]["passes"] = [None]
    report = analysed(checkpoint)
    assert report.verdict == "caveats"
    assert (report.loaders[0].snapshot_present, report.loaders[0].continues) == (False, "from_fresh_order")
    assert "recorded no order for epoch 1" in report.caveats[0]


def test_snapshot_of_an_earlier_epoch_does_not_count(ckpts):
    checkpoint = load(ckpts["exact"])
    checkpoint["callbacks"]["MidEpochResume"]["ranks"][0]["passes"][0]["epoch"] = 0
    assert analysed(checkpoint).loaders[0].continues == "from_fresh_order"


def test_seed_determined_order_needs_no_snapshot(ckpts):
    checkpoint = load(ckpts["exact"])
    state = checkpoint["callbacks"]["MidEpochResume"]
    state["ranks"][0]["passes"] = [None]
    state["loaders"][0].update(order="DistributedSampler (seed 5 + epoch, rank 0 of 1)", seed_determined=True)
    report = analysed(checkpoint)
    assert (report.verdict, report.loaders[0].continues) == ("exact", "exactly")
    assert "no snapshot (determined by its seed: none needed); continues exactly" in _inspect.render_text(report)


@pytest.mark.parametrize("rank_1", [[], [None]], ids=["absent", "not-gathered"])
def test_rank_without_random_states_has_caveats(ckpts, rank_1):
    checkpoint = load(ckpts["exact"])
    state = checkpoint["callbacks"]["MidEpochResume"]
    state["world_size"] = 2  # saved as if rank 1's states could not be gathered (OnExceptionCheckpoint under DDP)
    state["ranks"] += rank_1
    report = analysed(checkpoint)
    assert report.verdict == "caveats"
    assert (report.rng.ranks_present, report.rng.ranks_missing, report.rng.all_present) == ([0], [1], False)
    assert report.caveats[0].startswith("No random states for rank(s) 1 of 2")
    assert report.loaders[0].continues == "from_fresh_order"  # rank 1 recorded no order either
    assert "RNG states:         missing for rank(s) 1 of 2" in _inspect.render_text(report)


def test_state_written_before_any_fit_has_caveats(ckpts):
    checkpoint = load(ckpts["stock_end"])
    checkpoint["callbacks"]["MidEpochResume"] = S.empty_state()
    report = analysed(checkpoint)
    assert report.verdict == "caveats"
    assert report.caveats == [
        "The MidEpochResume state was written before the trainer trained with the callback (e.g. by"
        " trainer.save_checkpoint before fit) and holds no random states: the resumed run draws them afresh."
    ]
    assert report.loaders == []
    text = _inspect.render_text(report)
    assert "Train dataloaders:  none recorded (the state was written before the trainer trained)" in text
    assert "RNG states:         not saved" in text


@pytest.mark.parametrize(("saved", "verdict"), [(True, "exact"), (False, "caveats")])
def test_stateful_loader_relies_on_lightnings_loader_state(ckpts, saved, verdict):
    checkpoint = load(ckpts["exact"])
    checkpoint["callbacks"]["MidEpochResume"]["loaders"][0].update(kind="stateful", order="StatefulDataLoader")
    if saved:
        checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"] = [{"position": 4}]
    report = analysed(checkpoint)
    assert report.verdict == verdict
    assert report.loaders[0].continues == ("exactly" if saved else "from_epoch_start")
    recorded = "loader state saved by Lightning; continues exactly" if saved else "no loader state; restarts its epoch"
    assert f"order: stateful loader StatefulDataLoader, {recorded}" in _inspect.render_text(report)


def test_epoch_boundary_with_state_is_exact_and_needs_no_snapshot(ckpts):
    checkpoint = load(ckpts["exact"])
    checkpoint["loops"] = load(ckpts["stock_end"])["loops"]  # as if written in on_train_epoch_end
    checkpoint["epoch"] = 1
    report = analysed(checkpoint)
    assert (report.verdict, report.resume.epoch, report.resume.batch) == ("exact", 2, 0)
    assert (report.loaders[0].continues, report.loaders[0].snapshot_present) == ("new_epoch", None)
    assert "starts a new epoch (its order is drawn from the restored random states)" in _inspect.render_text(report)


def no_loops(checkpoint: dict[str, Any]) -> str:
    del checkpoint["loops"]
    return "the checkpoint has no loop progress"


def odd_epoch_counters(checkpoint: dict[str, Any]) -> str:
    checkpoint["loops"]["fit_loop"]["epoch_progress"]["total"] = {
        "ready": 5,
        "started": 1,
        "processed": 1,
        "completed": 1,
    }
    return "epochs: ready=5 started=1 processed=1 completed=1; batches of the epoch: ready=4 started=4 processed=4"


@pytest.mark.parametrize("damage", [no_loops, odd_epoch_counters])
def test_unrecognised_loop_progress_has_caveats(ckpts, damage):
    checkpoint = load(ckpts["exact"])
    found = damage(checkpoint)
    report = analysed(checkpoint)
    assert (report.verdict, report.resume.saved_at, report.loaders[0].continues) == ("caveats", "unknown", "unknown")
    assert f"inspect cannot tell where the resumed run continues ({found}" in report.caveats[0]
    text = _inspect.render_text(report)
    assert "Saved:              at a point inspect does not recognise" in text
    assert "Resumes at:         unknown (epoch 1)" in text
    assert "? batches, ? samples" in text


def test_drifted_batch_counters_have_caveats(ckpts):
    checkpoint = load(ckpts["exact"])
    batch_progress = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]
    batch_progress["total"] = {"ready": 18, "started": 17, "processed": 17, "completed": 16}
    batch_progress["current"] = {"ready": 7, "started": 7, "processed": 7, "completed": 6}
    report = analysed(checkpoint)
    assert report.verdict == "caveats"
    assert "batch_idx 6 of epoch 1 is trained twice" in report.caveats[0]


# ---------------------------------------------------------------------------------------------- bad input
def assert_one_line_error(code: int, out: str, err: str, expected: str) -> None:
    assert code == 3
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("lightning-midepoch: error: ")
    assert expected in err
    assert "Traceback" not in err


def test_missing_file(tmp_path, capsys):
    assert_one_line_error(*cli(capsys, tmp_path / "nope.ckpt"), f"{tmp_path / 'nope.ckpt'}: no such file")


def test_directory(tmp_path, capsys):
    assert_one_line_error(*cli(capsys, tmp_path), "is a directory, not a checkpoint file")


def test_sharded_checkpoint_directory_is_read_from_its_metadata_file(ckpts, tmp_path, capsys):
    """FSDP's sharded checkpoints are directories: Lightning keeps the callbacks' states in their `meta.pt`."""
    checkpoint = load(ckpts["exact"])
    del checkpoint["state_dict"], checkpoint["optimizer_states"]  # what Lightning writes into the shards instead
    directory = tmp_path / "sharded.ckpt"
    directory.mkdir()
    save_copy(checkpoint, directory / _inspect.SHARDED_METADATA)
    code, doc = cli_json(capsys, directory)
    expected_code, expected = cli_json(capsys, ckpts["exact"])
    assert code == expected_code == 0
    assert (doc["verdict"], doc["resume"], doc["blockers"]) == (expected["verdict"], expected["resume"], [])


def test_text_file(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("hello\n")
    assert_one_line_error(*cli(capsys, path), "is corrupted or not written by torch.save")


@pytest.mark.parametrize(("keep", "expected"), [(0.5, "a zip archive without its end"), (0.0, "an empty file")])
def test_truncated_checkpoint(keep, expected, ckpts, tmp_path, capsys):
    """A file cut short while being written (a killed job) is named as truncated, with what to do."""
    data = ckpts["exact"].read_bytes()
    path = tmp_path / "truncated.ckpt"
    path.write_bytes(data[: int(len(data) * keep)])
    assert_one_line_error(*cli(capsys, path), f"it is TRUNCATED ({expected}")


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"model": {"w": torch.zeros(2)}}, "has no epoch, global_step, state_dict (its keys: 'model')"),
        ([1, 2], "holds a list"),
    ],
)
def test_not_a_lightning_checkpoint(tmp_path, capsys, obj, expected):
    path = save_copy(obj, tmp_path / "other.pt")
    assert_one_line_error(*cli(capsys, path), f"is not a Lightning checkpoint: it {expected}")


def test_epoch_that_is_not_an_int(tmp_path, capsys):
    path = save_copy({"epoch": "1", "global_step": 0, "state_dict": {}}, tmp_path / "odd.ckpt")
    assert_one_line_error(*cli(capsys, path), "is not a Lightning checkpoint: its 'epoch' is not an int")


def test_trust_does_not_make_other_files_readable(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("hello\n")
    assert_one_line_error(*cli(capsys, "--trust", path), "cannot read")
    path = tmp_path / "plain.pkl"  # a plain pickle: refused weights-only, and not a torch.save file
    path.write_bytes(pickle.dumps({"a": 1}))
    assert_one_line_error(*cli(capsys, path), "rerun with --trust")
    assert_one_line_error(*cli(capsys, "--trust", path), "cannot read")


def test_unforeseen_errors_are_one_line(ckpts, monkeypatch, capsys):
    def fail(checkpoint: Any, path: str) -> None:
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(_inspect, "analyse", fail)
    expected = f"cannot inspect {ckpts['exact']}: RuntimeError: boom second line"
    assert_one_line_error(*cli(capsys, ckpts["exact"]), expected)


def test_http_urls_are_left_to_lightnings_loader():
    # Lightning downloads http(s) checkpoints with torch.hub, not fsspec: nothing to check beforehand (and not a
    # sharded checkpoint's directory)
    assert _inspect._check_exists("https://example.invalid/last.ckpt", _inspect._cloud_io()) is False


def test_unknown_url_protocol(capsys):
    assert_one_line_error(*cli(capsys, "nosuchproto://bucket/x.ckpt"), "cannot open nosuchproto://bucket/x.ckpt")


def test_objects_refused_by_weights_only_need_trust(ckpts, tmp_path, capsys):
    checkpoint = load(ckpts["stock_mid"])
    checkpoint["hyper_parameters"] = argparse.Namespace(lr=0.1)
    path = save_copy(checkpoint, tmp_path / "hparams.ckpt")
    assert_one_line_error(*cli(capsys, path), "argparse.Namespace")
    code, out, err = cli(capsys, path)
    assert "rerun with --trust" in err
    code, out, err = cli(capsys, "--trust", path)
    assert (code, err) == (1, "")
    assert "Resumes at:         epoch 1, batch_idx 4" in out


def test_command_line_errors_exit_3(capsys):
    assert main([]) == 3
    assert "error: the following arguments are required: COMMAND" in capsys.readouterr().err
    assert main(["inspect"]) == 3
    assert "error: the following arguments are required: CKPT" in capsys.readouterr().err


def test_help_documents_exit_codes(capsys):
    assert main(["inspect", "--help"]) == 0
    out = capsys.readouterr().out
    for line in (
        "0  exact resume possible",
        "1  resume possible, with caveats",
        "2  resume not possible",
        "3  bad input",
    ):
        assert line in out


# ---------------------------------------------------------------------------------------------- access
def test_loads_through_the_pytorch_lightning_namespace(ckpts, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "lightning.fabric.utilities.cloud_io", None)  # as if `lightning` were absent
    assert _inspect._cloud_io().__name__ == "lightning_fabric.utilities.cloud_io"
    assert cli(capsys, ckpts["exact"])[0] == 0


def test_file_url(ckpts, capsys):
    url = ckpts["exact"].as_uri()
    code, doc = cli_json(capsys, url)
    assert (code, doc["path"], doc["verdict"]) == (0, url, "exact")


def test_checkpoint_is_never_written(ckpts, capsys):
    path = ckpts["exact"]
    before = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns, sorted(path.parent.iterdir()))
    cli(capsys, path)
    cli(capsys, "--json", path)
    cli(capsys, "--trust", path.as_uri())
    after = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns, sorted(path.parent.iterdir()))
    assert after == before


@pytest.mark.slow  # a fresh interpreter imports torch and Lightning
def test_python_dash_m(ckpts):
    result = subprocess.run(
        [sys.executable, "-m", "lightning_midepoch", "inspect", "--json", str(ckpts["iterable"])],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert json.loads(result.stdout)["verdict"] == "caveats"


def test_reports_are_deterministic(ckpts):
    checkpoint = load(ckpts["exact"])
    first = _inspect.render_text(analysed(copy.deepcopy(checkpoint)))
    assert _inspect.render_text(analysed(checkpoint)) == first


def test_elastic_condition_names_what_prevents_it(ckpts):
    checkpoint = load(ckpts["exact"])
    checkpoint["callbacks"]["MidEpochResume"]["loaders"][0]["global_order"] = None
    conditions = analysed(checkpoint).conditions
    assert any(
        condition.startswith("On another number of devices this epoch cannot be finished exactly (its train")
        and "has no global order to re-shard" in condition
        for condition in conditions
    )


def test_partial_gradients_are_reported(ckpts):
    checkpoint = load(ckpts["exact"])
    checkpoint["callbacks"]["MidEpochResume"]["ranks"][0]["grads"] = {"net.0.bias": torch.zeros(16)}
    assert any("not yet used by an optimizer step" in condition for condition in analysed(checkpoint).conditions)


def test_a_checkpoint_written_inside_a_batch_names_what_is_not_exact(tmp_path):
    crash = CrashPoint("after_backward", epoch=1, batch=3)
    assert run(Config(), tmp_path, crash=crash).crashed
    report = analysed(load(checkpoint_path(tmp_path, crash)))
    assert report.resume.saved_at == "in_batch"
    assert report.verdict == "exact"
    assert any("from the random states (torch, numpy, Python) it started with" in c for c in report.conditions)
    assert any("dataloader_iter" in c for c in report.conditions)


def test_a_checkpoint_written_after_training_stopped_early_continues_its_epoch(tmp_path):
    """fit stopped by max_steps at epoch 1, batch_idx 2; Lightning counts epoch 1 as finished, the callback does not."""
    stopped = run(Config(max_steps=13), tmp_path)
    stopped.trainer.save_checkpoint(tmp_path / "after_fit.ckpt")
    report = analysed(load(tmp_path / "after_fit.ckpt"))
    assert report.resume == ResumePoint("stopped", epoch=1, batch=3, batches_trained=3, epoch_done=False)
    assert report.resume.continues_epoch
    assert report.verdict == "exact"
    assert report.loaders[0].continues == "exactly"
    text = _inspect.render_text(report)
    assert "after training stopped early in epoch 1, after batch_idx 2" in text


def test_worker_states_are_reported(tmp_path, capsys):
    crash = CrashPoint("train_batch_end", epoch=0, batch=4)
    assert run(Config(augment=True, num_workers=2, max_epochs=1), tmp_path, crash=crash).crashed
    code, out, _ = cli(capsys, checkpoint_path(tmp_path, crash))
    assert code == 0
    assert (
        "     workers: num_workers=2, random states of 2 of 2 worker(s) recorded; with num_workers=2 they continue"
        " exactly" in out.splitlines()
    )
    assert "Train dataloader 0 read its batches in 2 worker process(es)" in out


def test_missing_worker_states_are_a_caveat(tmp_path, capsys):
    crash = CrashPoint("train_batch_end", epoch=0, batch=4)
    assert run(Config(augment=True, num_workers=2, max_epochs=1), tmp_path, crash=crash).crashed
    checkpoint = load(checkpoint_path(tmp_path, crash))
    checkpoint["callbacks"]["MidEpochResume"]["ranks"][0]["workers"][0]["workers"][1]["state"] = None
    report = analyse(checkpoint, "edited")
    (loader,) = report.loaders
    assert (loader.num_workers, loader.worker_states, loader.worker_states_expected) == (2, 1, 2)
    assert any("holds the random states of 1 of its 2 DataLoader workers" in caveat for caveat in report.caveats)
    assert report.verdict == "caveats"


@pytest.mark.parametrize(
    ("crash", "why"),
    [
        (CrashPoint("before_backward", epoch=1, batch=3), "written inside a batch"),
        (CrashPoint("train_epoch_end", epoch=0), "written at an epoch's end"),
    ],
    ids=["inside-a-batch", "epoch-end"],
)
def test_a_checkpoint_without_a_fingerprint_says_why(crash, why, tmp_path, capsys):
    assert run(Config(), tmp_path, crash=crash).crashed
    _, out, _ = cli(capsys, checkpoint_path(tmp_path, crash))
    (line,) = [line for line in out.splitlines() if line.startswith("Batch check:")]
    assert line.startswith(f"Batch check:        no fingerprint ({why}")
    assert line.endswith("the resumed run cannot check its batches")
    _, doc = cli_json(capsys, checkpoint_path(tmp_path, crash))
    assert doc["last_batch"]["ranks_present"] == []
    assert doc["last_batch"]["why_absent"].startswith(why)
