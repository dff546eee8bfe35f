"""Write the small intersphinx inventories the docs link to: ``python docs/_inventories/make_inventories.py``.

The documentation build must not reach the network, so instead of downloading PyTorch's and Lightning's
``objects.inv`` the build reads these two files (committed beside this script). They hold only the objects the docs
reference, with the URIs those objects have in the real documentation sites, in Sphinx's inventory format version 2
(a four-line header, then zlib-compressed lines of ``name domain:role priority uri display-name``; a URI ending in
``$`` stands for the URI followed by the name, and a display name ``-`` for the name itself).

To link another object: add it below, run this script, and commit the regenerated ``.inv`` files.
"""

from __future__ import annotations

import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: https://pytorch.org/docs/stable/ : (name, role, page). The anchor is the object's full name.
TORCH = [
    *[
        (f"torch.utils.data.{name}", "class", "data.html")
        for name in (
            "DataLoader",
            "Dataset",
            "IterableDataset",
            "Sampler",
            "SequentialSampler",
            "RandomSampler",
            "SubsetRandomSampler",
            "WeightedRandomSampler",
            "BatchSampler",
        )
    ],
    ("torch.utils.data.distributed.DistributedSampler", "class", "data.html"),
    ("torch.utils.data.get_worker_info", "function", "data.html"),
    ("torch.Generator", "class", "generated/torch.Generator.html"),
    ("torch.load", "function", "generated/torch.load.html"),
    ("torch.save", "function", "generated/torch.save.html"),
    ("torch.manual_seed", "function", "generated/torch.manual_seed.html"),
    ("torch.get_rng_state", "function", "generated/torch.get_rng_state.html"),
    ("torch.randperm", "function", "generated/torch.randperm.html"),
]

_TRAINER = "api/lightning.pytorch.trainer.trainer.Trainer.html"
_CALLBACK = "api/lightning.pytorch.callbacks.Callback.html"
_MODULE = "api/lightning.pytorch.core.LightningModule.html"

#: https://lightning.ai/docs/pytorch/stable/ : (name, role, page), Lightning's API pages (one page per class).
LIGHTNING = [
    ("lightning.pytorch.trainer.trainer.Trainer", "class", _TRAINER),
    *[
        (f"lightning.pytorch.trainer.trainer.Trainer.{name}", "method", _TRAINER)
        for name in ("fit", "validate", "save_checkpoint")
    ],
    ("lightning.pytorch.callbacks.Callback", "class", _CALLBACK),
    *[
        (f"lightning.pytorch.callbacks.Callback.{name}", "method", _CALLBACK)
        for name in (
            "on_train_batch_start",
            "on_train_batch_end",
            "on_train_epoch_start",
            "on_train_epoch_end",
            "on_before_backward",
            "on_after_backward",
            "on_before_optimizer_step",
            "on_validation_end",
            "state_dict",
            "load_state_dict",
        )
    ],
    ("lightning.pytorch.callbacks.ModelCheckpoint", "class", "api/lightning.pytorch.callbacks.ModelCheckpoint.html"),
    (
        "lightning.pytorch.callbacks.OnExceptionCheckpoint",
        "class",
        "api/lightning.pytorch.callbacks.OnExceptionCheckpoint.html",
    ),
    ("lightning.pytorch.core.LightningModule", "class", _MODULE),
    *[
        (f"lightning.pytorch.core.LightningModule.{name}", "method", _MODULE)
        for name in ("training_step", "configure_optimizers")
    ],
    # the hooks a LightningModule inherits are documented on the pages of the classes that define them
    *[
        (
            f"lightning.pytorch.core.hooks.ModelHooks.{name}",
            "method",
            "api/lightning.pytorch.core.hooks.ModelHooks.html",
        )
        for name in ("on_train_batch_start", "on_train_batch_end", "on_train_epoch_start")
    ],
    *[
        (f"lightning.pytorch.core.hooks.DataHooks.{name}", "method", "api/lightning.pytorch.core.hooks.DataHooks.html")
        for name in ("on_after_batch_transfer", "train_dataloader")
    ],
    ("lightning.pytorch.core.LightningDataModule", "class", "api/lightning.pytorch.core.LightningDataModule.html"),
    (
        "lightning.pytorch.utilities.combined_loader.CombinedLoader",
        "class",
        "api/lightning.pytorch.utilities.combined_loader.html",
    ),
]


def inventory(project: str, version: str, objects: list[tuple[str, str, str]]) -> bytes:
    """An ``objects.inv`` (format version 2) for ``objects``, each linked to ``page#name``."""
    header = (
        "# Sphinx inventory version 2\n"
        f"# Project: {project}\n"
        f"# Version: {version}\n"
        "# The remainder of this file is compressed using zlib.\n"
    )
    lines = "".join(f"{name} py:{role} 1 {page}#$ -\n" for name, role, page in sorted(objects))
    return header.encode() + zlib.compress(lines.encode(), 9)


def main() -> None:
    for filename, project, version, objects in [
        ("torch.inv", "PyTorch", "stable", TORCH),
        ("lightning.inv", "PyTorch Lightning", "stable", LIGHTNING),
    ]:
        path = HERE / filename
        path.write_bytes(inventory(project, version, objects))
        print(f"{path}: {len(objects)} objects")


if __name__ == "__main__":
    main()
