"""tools/check_rst.py passes a page written with Sphinx's roles and directives, and reports real RST errors by line."""

from __future__ import annotations

import importlib.util
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

GOOD = """
:orphan:

.. _a_page:

#########
A page
#########
See :class:`~torch.utils.data.DataLoader`, :meth:`Trainer.fit`, :paramref:`~x.y.z`,
:doc:`other <../x>` and :ref:`a_page`.

.. displayitem::
   :header: A card
   :button_link: other.html
   :height: 150

.. code-block:: python

    trainer.fit(model, ckpt_path="last")

.. testcode::
   :skipif: not _TORCH_GREATER_EQUAL_2_0

   print(1)

.. seealso:: The :func:`print` function.

.. note::

   A ``literal``, *emphasis* and a `link <https://lightning.ai>`_.

.. include:: /links.rst
"""

BROKEN = {
    "title underline too short": ("A longer title\n=====\n\nText.\n", 2, "Title underline too short"),
    "misspelt directive": ("Text.\n\n.. code-blok:: python\n\n    x = 1\n", 3, 'Unknown directive type "code-blok"'),
    "misspelt role": ("Text with :clas:`Foo`.\n", 1, 'Unknown interpreted text role "clas"'),
    "unclosed inline literal": ("Text with ``unclosed.\n", 1, "Inline literal start-string without end-string"),
    "bad indentation": ("- item\n text\n", 2, "Bullet list ends without a blank line"),
    "unknown link target": ("See target_.\n", 1, 'Unknown target name: "target"'),
    "error inside a Sphinx note": (".. seealso::\n\n   Text with *unclosed.\n", 3, "Inline emphasis start-string"),
}


def _tool() -> Any:
    spec = importlib.util.spec_from_file_location("check_rst_tool", ROOT / "tools" / "check_rst.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_page_with_sphinx_roles_and_directives_passes(tmp_path, capsys):
    tool = _tool()
    (tmp_path / "conf.py").write_text("")  # the Sphinx source folder, where `.. include:: /links.rst` is looked up
    (tmp_path / "links.rst").write_text(".. _Lightning: https://lightning.ai\n")
    page = tmp_path / "common" / "page.rst"
    page.parent.mkdir()
    page.write_text(textwrap.dedent(GOOD) + "\nThe `Lightning`_ site.\n")
    assert tool.main([str(page)]) == 0
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(("text", "line", "message"), BROKEN.values(), ids=BROKEN.keys())
def test_a_broken_page_is_reported_with_its_line(tmp_path, capsys, text, line, message):
    tool = _tool()
    page = tmp_path / "broken.rst"
    page.write_text(text)
    assert tool.main([str(page)]) == 1
    reported = capsys.readouterr().out.splitlines()
    assert reported, text
    assert reported[0].startswith(f"{page}:{line}: ("), reported
    assert message in reported[0], reported


def test_a_missing_file_fails(tmp_path, capsys):
    assert _tool().main([str(tmp_path / "missing.rst")]) == 1
    assert "cannot read" in capsys.readouterr().out


def test_the_series_documentation_page_is_valid_rst(tmp_path, capsys):
    """The page the upstream series adds (docs/source-pytorch/common/checkpointing_mid_epoch.rst), as the whole series
    leaves it: its hunks of every upstream/*.patch applied, in order, to an empty folder (the page is new in 0001)."""
    page = "docs/source-pytorch/common/checkpointing_mid_epoch.rst"
    patches = sorted((ROOT / "upstream").glob("*.patch"))
    assert patches, "no patch series in upstream/"
    for patch in patches:
        subprocess.run(
            ["git", "apply", f"--include={page}", str(patch)],
            cwd=tmp_path,
            check=True,
            capture_output=True,
        )
    written = tmp_path / page
    assert "Resume mid-epoch" in written.read_text()
    assert _tool().main([str(written)]) == 0, capsys.readouterr().out
