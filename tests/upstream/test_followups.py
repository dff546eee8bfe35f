"""Checkpoints written inside a training batch, on the patched Lightning with no callback.

`make upstream-check` runs this module like test_core.py (``MIDEPOCH_DELIVERY=lightning``, every patch of upstream/
applied). Lightning trains the interrupted batch again on resume. The series (upstream/0006) gives it the same data
and warns, before training, that the random states are those of the moment the checkpoint was written, not of the
batch's start: making that exact costs a read of the random states before every batch, a follow-up behind a switch
(upstream/README.md). In the default mode (``MIDEPOCH_DELIVERY=callback``) the package is exact there.
"""

from __future__ import annotations

import warnings

import pytest

from harness import DELIVERY, Config, CrashPoint, assert_exact, interrupt_and_resume

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
    """Written in a hook of batch 3 of epoch 1 (or by OnExceptionCheckpoint after training_step raised)."""
    crash = CrashPoint(hook, epoch=1, batch=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        comparison = interrupt_and_resume(config, crash, tmp_path)
    if DELIVERY == "callback":
        assert_exact(comparison)
        return
    # the interrupted batch is trained again on the same data, the epoch goes on with the same batch indices, and the
    # resume said that random draws (an order drawn later, as the cycling loader's next pass) differ from there on
    done = len(comparison.interrupted.seen)
    assert comparison.resumed.seen[0] == comparison.full.seen[done]
    assert [batch[:2] for batch in comparison.resumed.seen] == [batch[:2] for batch in comparison.full.seen[done:]]
    assert any("written inside a training batch" in str(warning.message) for warning in caught)
