"""The supported-Lightning check, and the one place private Lightning names are used."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import lightning
import lightning.pytorch as pl_new
import pytest

from lightning_midepoch import _compat


def _trainer() -> pl_new.Trainer:
    return pl_new.Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False)


def test_installed_lightning_is_supported():
    _compat.check_supported(_trainer())


@pytest.mark.parametrize("version", ["2.4.0", "2.7.0", "3.0.0"])
def test_unsupported_version_is_a_clear_error(version, monkeypatch):
    monkeypatch.setattr(lightning, "__version__", version)
    with pytest.raises(RuntimeError, match=rf"supports lightning >=2.5.0,<2.7.0, but lightning {version} is installed"):
        _compat.check_supported(_trainer())


def test_missing_private_names_are_listed(monkeypatch):
    trainer = _trainer()
    stripped = SimpleNamespace(**{k: v for k, v in vars(trainer.fit_loop).items() if k != "_combined_loader"})
    stripped.epoch_loop = SimpleNamespace()
    monkeypatch.setattr(type(trainer), "fit_loop", property(lambda self: stripped), raising=False)
    with pytest.raises(RuntimeError, match=r"lack fit_loop\._combined_loader, .*epoch_loop\._batches_that_stepped"):
        _compat.check_supported(trainer)


def test_namespace():
    import pytorch_lightning

    assert _compat.namespace(_trainer()) == "lightning"
    assert _compat.namespace(pytorch_lightning.Trainer(logger=False, enable_progress_bar=False)) == "pytorch_lightning"
    assert _compat.namespace(object()) == "lightning"


def test_warn_once_per_set():
    seen: set[str] = set()
    trainer = _trainer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _compat.warn("hello", trainer, seen)
        _compat.warn("hello", trainer, seen)
    assert [str(w.message) for w in caught] == ["hello"]


def test_stock_warning_suppressed_only_that_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _compat.stock_warning_suppressed():
            warnings.warn(
                _compat.STOCK_NOT_RESUMABLE_WARNING + " and your dataloader is not resumable.",
                UserWarning,
                stacklevel=1,
            )
            warnings.warn("something else", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["something else"]


def test_importing_the_package_changes_no_lightning_class():
    """Lightning's classes stay untouched at import: compared attribute by attribute in a fresh interpreter."""
    import subprocess
    import sys

    script = (
        "import lightning.pytorch as pl, pytorch_lightning as ptl\n"
        "from lightning.pytorch.loops import fit_loop, training_epoch_loop, fetchers\n"
        "from pytorch_lightning.loops import fit_loop as pfit\n"
        "classes = [fit_loop._FitLoop, training_epoch_loop._TrainingEpochLoop, fetchers._DataFetcher,\n"
        "           fetchers._PrefetchDataFetcher, pl.Trainer, pl.Callback, pfit._FitLoop, ptl.Trainer]\n"
        "import torch.utils.data as data\n"
        "classes += [data.DataLoader, data.BatchSampler, data.RandomSampler, data.DistributedSampler]\n"
        "before = [dict(vars(c)) for c in classes]\n"
        "import lightning_midepoch\n"
        "assert [dict(vars(c)) for c in classes] == before\n"
        "print('untouched')\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert completed.stdout.strip() == "untouched", completed.stderr[-2000:]


def test_check_fetcher_names_what_is_missing():
    from lightning.pytorch.loops.fetchers import _PrefetchDataFetcher
    from lightning.pytorch.utilities import CombinedLoader

    fetcher = _PrefetchDataFetcher()
    fetcher.setup(CombinedLoader([[1, 2]]))
    _compat.check_fetcher(fetcher)
    del fetcher.fetched
    fetcher._combined_loader._limits = None
    del fetcher._combined_loader._limits
    with pytest.raises(RuntimeError, match=r"train data fetcher lacks fetcher\.fetched, combined_loader\._limits"):
        _compat.check_fetcher(fetcher)
