"""Sphinx configuration of the lightning-midepoch documentation (``make docs``; checked by ``tests/test_docs.py``).

The build reads nothing from the network: intersphinx uses the small inventories in ``_inventories/``.
Every Python example in the pages is a ``testcode``/``doctest`` block run by ``sphinx-build -b doctest``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
# document the package of this working tree, also when it is not installed in editable mode
sys.path.insert(0, str(ROOT / "src"))
# the examples the pages show with literalinclude and import in their testsetup (docs/_examples/)
sys.path.insert(0, str(DOCS / "_examples"))

_about = (ROOT / "src" / "lightning_midepoch" / "__about__.py").read_text(encoding="utf-8")
release = re.search(r'^__version__ = "([^"]+)"', _about, re.MULTILINE).group(1)  # type: ignore[union-attr]
version = release

project = "lightning-midepoch"
author = "lightning-midepoch developers"
copyright = "lightning-midepoch developers"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
    "sphinx.ext.intersphinx",
    "sphinx.ext.viewcode",
    "myst_parser",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_inventories", "Thumbs.db", ".DS_Store"]
templates_path: list[str] = []

# -- Markdown ------------------------------------------------------------------------------------------------------
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# -- API reference -------------------------------------------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# -- Links to PyTorch and Lightning, from local inventories (no network at build time) ----------------------------
intersphinx_mapping = {
    "torch": ("https://pytorch.org/docs/stable/", "_inventories/torch.inv"),
    "lightning": ("https://lightning.ai/docs/pytorch/stable/", "_inventories/lightning.inv"),
}

# -- Doctests: every example runs in a fresh temporary working directory, with Lightning's chatter silenced --------
doctest_global_setup = """
import logging as _logging
import os as _os
import shutil as _shutil
import tempfile as _tempfile
import warnings as _warnings

_docs_previous_cwd = _os.getcwd()
_docs_workdir = _tempfile.mkdtemp(prefix="midepoch-docs-")
_os.chdir(_docs_workdir)
for _name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric"):
    _logging.getLogger(_name).setLevel(_logging.ERROR)
_warnings.filterwarnings("ignore", message=r".*(does not have many workers|number of training batches|LeafSpec).*")
_warnings.filterwarnings("ignore", message=r".*no last checkpoint available.*")
"""
doctest_global_cleanup = """
_os.chdir(_docs_previous_cwd)
_shutil.rmtree(_docs_workdir, ignore_errors=True)
"""
doctest_test_doctest_blocks = "default"  # the `>>>` examples of the API reference run too

# -- HTML ----------------------------------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"lightning-midepoch {release}"
html_static_path = ["_static/custom.css"]  # the figures are copied where the pages use them
html_css_files = ["custom.css"]
html_show_sourcelink = False
html_theme_options = {"navigation_with_keys": True}
pygments_style = "friendly"
pygments_dark_style = "monokai"
