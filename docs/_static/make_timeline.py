"""Draw the epoch timeline of the guide: ``python docs/_static/make_timeline.py`` writes ``timeline.png`` beside it.

The figure is committed; rerun this script after changing it. Only matplotlib (Agg) is needed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle

N = 12  # batches in the epoch
K = 5  # batches consumed when the checkpoint was written

TRAINED = "#2a9d8f"
LOST = "#e9ecef"
SKIPPED = "#ffffff"
CHECKPOINT = "#c0392b"
TEXT = "#212529"
MUTED = "#6c757d"

BOX_W, BOX_H, GAP = 0.86, 0.62, 0.14
X0 = 3.0  # left edge of batch 0 (room for the row labels)


def _x(batch: int) -> float:
    return X0 + batch * (BOX_W + GAP)


def _box(axis, batch: int, y: float, face: str, *, hatch: str | None = None, dashed: bool = False, label: str = ""):
    axis.add_patch(
        Rectangle(
            (_x(batch), y),
            BOX_W,
            BOX_H,
            facecolor=face,
            edgecolor=MUTED if face != TRAINED else TRAINED,
            hatch=hatch,
            linewidth=1.0,
            linestyle="--" if dashed else "-",
        )
    )
    color = "white" if face == TRAINED else TEXT
    axis.text(_x(batch) + BOX_W / 2, y + BOX_H / 2, label, ha="center", va="center", fontsize=11, color=color)


def draw(path: Path) -> None:
    plt.rcParams.update({"font.family": "DejaVu Sans", "hatch.color": "#adb5bd", "hatch.linewidth": 0.8})
    figure, axis = plt.subplots(figsize=(10, 4.6))
    axis.set_xlim(0, _x(N) + 0.2)
    axis.set_ylim(-1.1, 3.75)
    axis.axis("off")

    top, bottom = 2.55, 0.55  # y of the two rows of boxes
    axis.text(0.05, top + BOX_H / 2, "Interrupted run", ha="left", va="center", fontsize=12, weight="bold")
    axis.text(0.05, top + BOX_H / 2 - 0.36, "epoch e", ha="left", va="center", fontsize=10.5, color=MUTED)
    axis.text(0.05, bottom + BOX_H / 2, "Resumed run", ha="left", va="center", fontsize=12, weight="bold")
    axis.text(0.05, bottom + BOX_H / 2 - 0.36, "same epoch e", ha="left", va="center", fontsize=10.5, color=MUTED)

    for batch in range(N):
        if batch < K:
            _box(axis, batch, top, TRAINED, label=str(batch))
            _box(axis, batch, bottom, SKIPPED, hatch="////", label=str(batch))
        else:
            _box(axis, batch, top, LOST, dashed=True, label=str(batch))
            _box(axis, batch, bottom, TRAINED, label=str(batch))

    # the checkpoint, between batch k-1 and batch k, through both rows
    line_x = _x(K) - GAP / 2
    axis.plot([line_x, line_x], [bottom - 0.12, top + BOX_H + 0.12], color=CHECKPOINT, linewidth=2.2)
    axis.text(
        line_x,
        top + BOX_H + 0.2,
        f"checkpoint after batch k \u2212 1 (k = {K})",
        ha="center",
        va="bottom",
        fontsize=11,
        color=CHECKPOINT,
        weight="bold",
    )

    # captions of the interrupted run
    axis.text(
        (_x(0) + _x(K - 1) + BOX_W) / 2,
        top - 0.14,
        "trained, in the checkpoint",
        ha="center",
        va="top",
        fontsize=10.5,
        color=TEXT,
    )
    axis.text(
        (_x(K) + _x(N - 1) + BOX_W) / 2,
        top - 0.14,
        "lost at the crash, or never reached",
        ha="center",
        va="top",
        fontsize=10.5,
        color=MUTED,
    )

    # the resumed run: the order of the whole epoch comes from the recorded states
    bracket_y = bottom + BOX_H + 0.42
    axis.annotate(
        "",
        xy=(_x(0), bracket_y),
        xytext=(_x(N - 1) + BOX_W, bracket_y),
        arrowprops={"arrowstyle": "|-|,widthA=0.25,widthB=0.25", "color": MUTED, "linewidth": 1.0},
    )
    axis.text(
        (_x(0) + _x(N - 1) + BOX_W) / 2,
        bracket_y + 0.08,
        "order re-created from the random states recorded when the epoch's order was drawn",
        ha="center",
        va="bottom",
        fontsize=10.5,
        color=TEXT,
        bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.5},
    )

    axis.text(
        (_x(0) + _x(K - 1) + BOX_W) / 2,
        bottom - 0.14,
        "skipped at the sampler level:\nindices only, no sample loaded",
        ha="center",
        va="top",
        fontsize=10.5,
        color=TEXT,
        linespacing=1.25,
    )
    axis.text(
        (_x(K) + _x(N - 1) + BOX_W) / 2,
        bottom - 0.14,
        "batch k onward: loaded and trained,\nexactly as in the uninterrupted run",
        ha="center",
        va="top",
        fontsize=10.5,
        color=TEXT,
        linespacing=1.25,
    )

    # where the live random states are restored
    label_y = bottom - 1.2
    axis.add_patch(
        FancyArrowPatch(
            (line_x + 0.3, label_y + 0.05),
            (line_x + 0.05, bottom - 0.06),
            arrowstyle="-|>",
            mutation_scale=12,
            color=CHECKPOINT,
            linewidth=1.4,
            connectionstyle="arc3,rad=0.2",
        )
    )
    axis.text(
        line_x + 0.38,
        label_y,
        "live random states restored here, before batch k\n(torch CPU and CUDA, numpy, python)",
        ha="left",
        va="center",
        fontsize=10.5,
        color=CHECKPOINT,
    )

    figure.savefig(path, dpi=160, bbox_inches="tight", pad_inches=0.08, metadata={"Software": None})
    plt.close(figure)


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("timeline.png")
    draw(out)
    print(out)
