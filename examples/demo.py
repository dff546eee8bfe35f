"""A real crash-and-resume: train, SIGKILL the process mid-epoch, resume from ModelCheckpoint's ``last.ckpt``.

Runs five training processes on synthetic data, augmented at random in 2 DataLoader workers:

1. the uninterrupted run (the oracle),
2. a run with ``MidEpochResume`` that is killed with SIGKILL in the middle of an epoch, then
3. resumed with ``trainer.fit(..., ckpt_path="last")``,
4. the same kill with stock Lightning, then
5. resumed with stock Lightning,

and prints a side-by-side report (is every step after the checkpoint the uninterrupted run's step, which samples of
the interrupted epoch were replayed or never seen, are the final weights bitwise equal, how long the resume took to
reach its first training step). The loss curves are saved as ``loss_curves.png`` and the numbers as ``report.json``.

Usage: ``python examples/demo.py [--out DIR] [--quick]`` (``make demo`` runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SEED = 42


def _train(args: argparse.Namespace) -> None:
    """One training process (run in a child): logs every step, kills itself at ``--kill-at-step``."""
    import lightning as L
    import numpy as np
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    from lightning_midepoch import MidEpochResume

    class Synthetic(Dataset):
        """A regression task whose sample ``i`` is fixed by ``i`` (so batches can be named by their samples).

        Each sample is augmented with random noise drawn in the DataLoader worker that loads it, from torch's and
        numpy's global generators: the hardest common case for an exact resume.
        """

        def __init__(self, size: int) -> None:
            generator = torch.Generator().manual_seed(0)
            self.x = torch.randn(size, 16, generator=generator)
            self.y = (self.x[:, :4].sum(dim=1, keepdim=True) + 0.1 * torch.randn(size, 1, generator=generator)).sin()

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, index: int) -> tuple[int, torch.Tensor, torch.Tensor]:
            noise = 0.05 * torch.randn(16) * (1.0 + float(np.random.rand()))
            return index, self.x[index] + noise, self.y[index]

    class Regressor(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 1))
            self.log_file = open(Path(args.run_dir) / "steps.jsonl", "a")  # noqa: SIM115 - closed at the end
            self.first_step_time: float | None = None

        def train_dataloader(self) -> DataLoader:
            return DataLoader(Synthetic(args.samples), batch_size=32, shuffle=True, num_workers=2)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if self.first_step_time is None:
                self.first_step_time = time.perf_counter()
            ids, x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            record = {
                "step": self.global_step,
                "epoch": self.current_epoch,
                "batch": batch_idx,
                "ids": ids.tolist(),
                "loss": loss.item(),
            }
            self.log_file.write(json.dumps(record) + "\n")
            self.log_file.flush()
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=3e-3)

    class KillAt(L.Callback):
        def on_train_batch_start(self, trainer: L.Trainer, *_: Any) -> None:
            if trainer.global_step == args.kill_at_step:
                os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no exception handling: a real crash

    L.seed_everything(SEED if not args.resume else SEED + 1, verbose=False)
    model = Regressor()
    callbacks: list[L.Callback] = [
        ModelCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=args.every, save_last=True, save_top_k=0)
    ]
    if args.callback:
        callbacks.append(MidEpochResume())
    if args.kill_at_step is not None:
        callbacks.append(KillAt())
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        callbacks=callbacks,
        default_root_dir=args.run_dir,
    )
    start = time.perf_counter()
    trainer.fit(model, ckpt_path="last" if args.resume else None)
    resume_seconds = (model.first_step_time or time.perf_counter()) - start
    torch.save({k: v for k, v in model.state_dict().items()}, Path(args.run_dir) / "final.pt")
    (Path(args.run_dir) / "timing.json").write_text(json.dumps({"fit_to_first_step_s": resume_seconds}))
    model.log_file.close()


def _child(run_dir: Path, ckpt_dir: Path, settings: dict[str, Any], **flags: Any) -> int:
    run_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, __file__, "--child", "--run-dir", str(run_dir), "--ckpt-dir", str(ckpt_dir)]
    for key, value in {**settings, **flags}.items():
        if value is True:
            command.append(f"--{key.replace('_', '-')}")
        elif value not in (False, None):
            command += [f"--{key.replace('_', '-')}", str(value)]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True).returncode


def _steps(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "steps.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _analyse(
    name: str,
    full: list[dict[str, Any]],
    killed: list[dict[str, Any]],
    resumed: list[dict[str, Any]],
    run_dir: Path,
    full_dir: Path,
    samples: int,
) -> dict[str, Any]:
    import torch

    resume_step = resumed[0]["step"]  # the step last.ckpt was written at
    before = [s for s in killed if s["step"] < resume_step]  # what the checkpoint contains
    epoch = resumed[0]["epoch"]
    expected_after = [s for s in full if s["step"] >= resume_step]
    identical = sum(
        a["ids"] == b["ids"] and a["batch"] == b["batch"] for a, b in zip(resumed, expected_after, strict=False)
    )
    trained = [i for s in before + resumed if s["epoch"] == epoch for i in s["ids"]]
    final = torch.load(run_dir / "final.pt", weights_only=True)
    oracle = torch.load(full_dir / "final.pt", weights_only=True)
    timing = json.loads((run_dir / "timing.json").read_text())
    return {
        "name": name,
        "killed_at_step": killed[-1]["step"] + 1 if killed else None,
        "resumed_from_step": resume_step,
        "interrupted_epoch": epoch,
        "batch_in_epoch": resumed[0]["batch"],
        "steps_after_checkpoint": len(expected_after),
        "steps_identical": identical,
        "samples_replayed_in_epoch": len(trained) - len(set(trained)),
        "samples_never_seen_in_epoch": samples - len(set(trained)),
        "weights_equal": all(torch.equal(final[k], oracle[k]) for k in oracle),
        "fit_to_first_step_s": round(timing["fit_to_first_step_s"], 3),
    }


def _plot(out: Path, curves: dict[str, list[dict[str, Any]]], resume_step: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def smooth(values: list[float], width: int = 15) -> list[float]:
        return [
            sum(values[max(0, i - width + 1) : i + 1]) / len(values[max(0, i - width + 1) : i + 1])
            for i in range(len(values))
        ]

    figure, axis = plt.subplots(figsize=(9, 4.5))
    styles = {
        "uninterrupted": ("black", "-", 2.5),
        "resumed with MidEpochResume": ("tab:green", "--", 1.8),
        "resumed with stock Lightning": ("tab:red", ":", 1.8),
    }
    for label, steps in curves.items():
        color, style, width = styles[label]
        axis.plot(
            [s["step"] for s in steps], smooth([s["loss"] for s in steps]), style, color=color, lw=width, label=label
        )
    axis.axvline(resume_step, color="grey", lw=1)
    bottom, top = axis.get_ylim()
    axis.text(resume_step, bottom + 0.03 * (top - bottom), " SIGKILL: resumed from last.ckpt", color="grey")
    axis.set_xlabel("global step")
    axis.set_ylabel("training loss (moving average of 15 steps)")
    axis.set_title("Mid-epoch crash and resume: the callback continues the uninterrupted run exactly")
    axis.legend(loc="upper right")
    figure.tight_layout()
    figure.savefig(out / "loss_curves.png", dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="demo-output", help="where runs, report.json and loss_curves.png go")
    parser.add_argument("--quick", action="store_true", help="a smaller run (used by the test suite)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("--ckpt-dir", help=argparse.SUPPRESS)
    parser.add_argument("--callback", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kill-at-step", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--samples", type=int, default=4000, help=argparse.SUPPRESS)
    parser.add_argument("--epochs", type=int, default=3, help=argparse.SUPPRESS)
    parser.add_argument("--every", type=int, default=50, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _train(args)
        return 0

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    settings = {"samples": 640, "epochs": 2, "every": 8} if args.quick else {"samples": 4000, "epochs": 3, "every": 50}
    batches = -(-settings["samples"] // 32)
    kill_at = batches + batches // 2 + 3  # inside the second epoch, a few steps after a checkpoint
    print(
        f"Training {settings['epochs']} epochs of {batches} batches; ModelCheckpoint every {settings['every']} steps;"
        f" SIGKILL at step {kill_at}."
    )
    for name, flags in [
        ("uninterrupted", {"callback": True}),
        ("callback-killed", {"callback": True, "kill_at_step": kill_at}),
        ("callback-resumed", {"callback": True, "resume": True}),
        ("stock-killed", {"kill_at_step": kill_at}),
        ("stock-resumed", {"resume": True}),
    ]:
        ckpt_dir = out / name.split("-")[0] / "checkpoints"
        code = _child(out / name, ckpt_dir, settings, **flags)
        expected = -signal.SIGKILL if "kill_at_step" in flags else 0
        status = "killed by SIGKILL" if code == -signal.SIGKILL else f"exit code {code}"
        print(f"  {name:<17} {status}")
        if code != expected:
            print(f"unexpected {status} for {name}", file=sys.stderr)
            return 1

    full = _steps(out / "uninterrupted")
    rows = [
        _analyse(
            "MidEpochResume",
            full,
            _steps(out / "callback-killed"),
            _steps(out / "callback-resumed"),
            out / "callback-resumed",
            out / "uninterrupted",
            settings["samples"],
        ),
        _analyse(
            "stock Lightning",
            full,
            _steps(out / "stock-killed"),
            _steps(out / "stock-resumed"),
            out / "stock-resumed",
            out / "uninterrupted",
            settings["samples"],
        ),
    ]
    report = {"settings": settings, "kill_at_step": kill_at, "results": rows}
    (out / "report.json").write_text(json.dumps(report, indent=2))

    first = rows[0]
    print(
        f"\nKilled at step {first['killed_at_step']} (epoch {first['interrupted_epoch']}); last.ckpt was written at"
        f" step {first['resumed_from_step']} (batch {first['batch_in_epoch']} of {batches}).\n"
    )
    header = f"{'':<44}{'MidEpochResume':>18}{'stock Lightning':>18}"
    print(header)
    print("-" * len(header))
    lines = [
        (
            "steps after the checkpoint equal to uninterrupted",
            lambda r: f"{r['steps_identical']}/{r['steps_after_checkpoint']}",
        ),
        ("samples replayed in the interrupted epoch", lambda r: str(r["samples_replayed_in_epoch"])),
        ("samples never seen in the interrupted epoch", lambda r: str(r["samples_never_seen_in_epoch"])),
        ("final weights bitwise equal to uninterrupted", lambda r: "yes" if r["weights_equal"] else "no"),
        ("fit(ckpt_path) to first training step (s)", lambda r: f"{r['fit_to_first_step_s']:.2f}"),
    ]
    for label, value in lines:
        print(f"{label:<44}{value(rows[0]):>18}{value(rows[1]):>18}")

    curves = {
        "uninterrupted": full,
        "resumed with MidEpochResume": [
            s for s in _steps(out / "callback-killed") if s["step"] < first["resumed_from_step"]
        ]
        + _steps(out / "callback-resumed"),
        "resumed with stock Lightning": [
            s for s in _steps(out / "stock-killed") if s["step"] < rows[1]["resumed_from_step"]
        ]
        + _steps(out / "stock-resumed"),
    }
    _plot(out, curves, first["resumed_from_step"])
    print(f"\nLoss curves: {out / 'loss_curves.png'}\nReport:      {out / 'report.json'}")
    exact = rows[0]["weights_equal"] and rows[0]["steps_identical"] == rows[0]["steps_after_checkpoint"]
    print("\nThe resumed run " + ("equals" if exact else "DOES NOT equal") + " the uninterrupted one.")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
