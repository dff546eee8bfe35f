"""The Trainer-level exactness the core upstream patch gives ``Trainer.fit(ckpt_path=...)``, with no callback.

`make upstream-check` runs this module with ``MIDEPOCH_DELIVERY=lightning`` on a Lightning with upstream/*.patch
applied (tools/apply_upstream.py): each case trains uninterrupted, crashes at a checkpoint, resumes in a process whose
random states were scrambled, and compares (tests/harness.py). In the default mode (``MIDEPOCH_DELIVERY=callback``)
the same cases run with ``MidEpochResume`` attached, which shows the cases themselves are sound.

The core patch's scope: the loaders of ``harness.LOADERS`` read in the main process, DataLoader workers (fresh and
persistent), ``CombinedLoader`` in fit's modes, the checkpoint moments a ``ModelCheckpoint`` or a callback's
``save_checkpoint`` produce after a finished batch, at an epoch's end and after a mid-epoch validation, and repeated
resumes. Every case keeps ``reload_dataloaders_every_n_epochs=0`` (the Config default); what the core leaves to the
follow-up patches is in test_followups.py.
"""

from __future__ import annotations

import pytest

from harness import DELIVERY, LOADERS, Config, CrashPoint, assert_exact, interrupt_and_resume, resume_repeatedly

MID = CrashPoint("train_batch_end", epoch=1, batch=3)  # batch 3 of 10 in the second epoch
EPOCH0 = CrashPoint("train_batch_end", epoch=0, batch=6)  # in the first epoch, whose order the fresh run drew


@pytest.mark.parametrize("loader", LOADERS)
def test_loaders(loader, tmp_path):
    assert_exact(interrupt_and_resume(Config(loader=loader), MID, tmp_path))


# the first epoch's order is drawn before the fit loop's first hooks run (in `setup_data`): one loader per kind of
# order source (the global generator, a sampler's generator, a batch sampler drawing from numpy, none)
@pytest.mark.parametrize("loader", ["shuffle", "sampler_generator", "batch_sampler_numpy", "sequential"])
def test_loaders_in_the_first_epoch(loader, tmp_path):
    assert_exact(interrupt_and_resume(Config(loader=loader), EPOCH0, tmp_path))


WORKER_LOADERS = ["shuffle", "sampler_generator", "loader_generator", "batch_sampler_numpy", "batch_sampler_torch"]


@pytest.mark.parametrize("persistent", [False, True], ids=["workers", "persistent-workers"])
@pytest.mark.parametrize("loader", WORKER_LOADERS)
def test_workers(loader, persistent, tmp_path):
    config = Config(loader=loader, num_workers=2, persistent_workers=persistent)
    assert_exact(interrupt_and_resume(config, MID, tmp_path))


# A long loader (10 batches) and a short one (3 batches). max_size_cycle: the short one starts over after batch 2;
# max_size: it is exhausted after batch 2 (None afterwards); min_size: the epoch is 3 batches long, batch 2 its last.
COMBINED = [
    ("max_size_cycle", 1),
    ("max_size_cycle", 4),
    ("max_size", 1),
    ("max_size", 4),
    ("min_size", 1),
    ("min_size", 2),
]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(("mode", "batch"), COMBINED)
def test_combined_loader(mode, batch, num_workers, tmp_path):
    config = Config(combined=mode, num_workers=num_workers)
    assert_exact(interrupt_and_resume(config, CrashPoint("train_batch_end", epoch=1, batch=batch), tmp_path))


MOMENTS = [
    # ModelCheckpoint(every_n_train_steps=3) wrote last.ckpt and the process died: epoch 0 batch 5, epoch 1 batch 1
    pytest.param(Config(), CrashPoint("model_checkpoint", step=6, every=3), id="model-checkpoint-epoch0"),
    pytest.param(Config(), CrashPoint("model_checkpoint", step=12, every=3), id="model-checkpoint-epoch1"),
    # the end of the validation after batch 4 of 10 (val_check_interval=0.5)
    pytest.param(
        Config(validation=True, val_check_interval=0.5),
        CrashPoint("validation_end", epoch=1, batch=4),
        id="mid-epoch-validation-end",
    ),
    pytest.param(Config(), CrashPoint("train_batch_end", epoch=1, batch=9), id="last-batch"),
    pytest.param(Config(drop_last=True, dataset_size=21), CrashPoint("train_batch_end", 1, 3), id="drop-last"),
    pytest.param(Config(limit_train_batches=7), CrashPoint("train_batch_end", epoch=1, batch=4), id="limit-batches"),
    # batches 0-1 and 2-3 are the epoch's first two optimizer steps: the checkpoint follows the second
    pytest.param(
        Config(accumulate_grad_batches=2), CrashPoint("train_batch_end", epoch=1, batch=3), id="accumulate-boundary"
    ),
]


@pytest.mark.parametrize(("config", "crash"), MOMENTS)
def test_checkpoint_moments(config, crash, tmp_path):
    assert_exact(interrupt_and_resume(config, crash, tmp_path))


def test_checkpoint_at_an_epochs_end(tmp_path):
    """Written in ``on_train_epoch_end``. The package continues the random states from there too; the series leaves
    them alone (only mid-epoch resumes restore them, upstream/README.md): the resumed run trains the next epochs in
    full, on orders drawn from its own states, as stock Lightning does."""
    comparison = interrupt_and_resume(Config(), CrashPoint("train_epoch_end", epoch=0), tmp_path)
    if DELIVERY == "callback":
        assert_exact(comparison)
        return
    done = len(comparison.interrupted.seen)
    assert [batch[:2] for batch in comparison.resumed.seen] == [batch[:2] for batch in comparison.full.seen[done:]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_repeated_resumes(num_workers, tmp_path):
    crashes = [
        CrashPoint("train_batch_end", epoch=0, batch=4),
        CrashPoint("train_batch_end", epoch=1, batch=2),
        CrashPoint("train_batch_end", epoch=1, batch=7),
    ]
    assert_exact(resume_repeatedly(Config(num_workers=num_workers), crashes, tmp_path))
