"""The Trainer-level cases of the follow-up patches of the series, on the patched Lightning with no callback.

`make upstream-check` runs this module like test_core.py (``MIDEPOCH_DELIVERY=lightning``, every patch of upstream/
applied). Each section names the patch that delivers its cases; the core patch (0001) alone resumes them on the
right batches but warns that the random states differ (tests/tests_pytorch/loops/test_mid_epoch_resume.py of 0001).

- upstream/0002 (checkpoints inside a training batch): Lightning trains the interrupted batch again, and the
  checkpoint holds the random states from before that batch was fetched.

Planned follow-ups with no patch yet (upstream/README.md): randomness drawn in DataLoader workers, elastic resume,
signal-driven checkpoints at a step boundary (#21407), the data libraries' loaders, the inspector.
"""

from __future__ import annotations

import pytest

from harness import Config, CrashPoint, assert_exact, interrupt_and_resume

INSIDE_A_BATCH = ["train_batch_start", "before_backward", "after_backward", "before_optimizer_step", "exception"]


@pytest.mark.parametrize(
    "config",
    [
        Config(),
        Config(num_workers=2),
        Config(loader="sampler_generator"),
        # batch 3 is where the short loader (3 batches) starts over: the pass before it is the one saved
        Config(combined="max_size_cycle"),
    ],
    ids=["main-process", "workers", "sampler-generator", "cycling-loader"],
)
@pytest.mark.parametrize("hook", INSIDE_A_BATCH)
def test_checkpoint_inside_a_batch(hook, config, tmp_path):
    """0002: written in a hook of batch 3 of epoch 1 (or by OnExceptionCheckpoint after training_step raised)."""
    assert_exact(interrupt_and_resume(config, CrashPoint(hook, epoch=1, batch=3), tmp_path))
