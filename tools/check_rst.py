"""Check reStructuredText pages with docutils, without Sphinx (``python tools/check_rst.py FILE...``).

Each file is parsed by docutils' reStructuredText parser, and docutils' standard transforms are applied (they report
unknown link targets and substitutions). Every system message of level WARNING or higher is reported as
``file:line: (LEVEL/n) message``, and the exit status is then 1 (else 0).

The roles and directives that Sphinx, its extensions and Lightning's theme add (``:class:``, ``:meth:``, ``:doc:``,
``:ref:``, ``:paramref:``, ``.. code-block::``, ``.. testcode::``, ``.. toctree::``, ``.. displayitem::``, ...) are
registered first as permissive no-ops: any argument, any option, no checking of their targets. What is left to report
is the reStructuredText itself: bad indentation, a misspelt directive or role, broken inline markup, a title underline
shorter than its title, a link to a target that does not exist. The content of the container-like Sphinx directives
(``.. seealso::``, ``.. versionadded::``, ``.. collapse::``, ...) is parsed as reStructuredText too; that of the others
(code, autodoc, toctree, cards) is not.

docutils' own directives keep their own checks (``.. raw::`` needs content, ``.. include::`` needs the file). As in
Sphinx, an included path starting with ``/`` is taken from the Sphinx source folder: the nearest folder above the page
holding a ``conf.py``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from docutils import frontend, nodes, utils  # type: ignore[import-untyped]
from docutils.parsers import rst  # type: ignore[import-untyped]
from docutils.parsers.rst import directives, roles  # type: ignore[import-untyped]
from docutils.readers import standalone  # type: ignore[import-untyped]

#: the lowest level reported: docutils' WARNING (1 is INFO, 3 ERROR, 4 SEVERE)
REPORT_LEVEL = 2

#: roles of Sphinx (the Python domain, with and without its ``py:`` prefix, and the standard domain) and its extensions
SPHINX_ROLES = (
    *(
        f"{prefix}{name}"
        for prefix in ("", "py:")
        for name in ("class", "meth", "func", "attr", "mod", "obj", "data", "exc", "const", "type", "property")
    ),
    *("doc", "ref", "numref", "term", "envvar", "option", "keyword", "token", "any", "download", "file", "samp"),
    *("program", "command", "kbd", "menuselection", "guilabel", "abbr", "dfn", "pep", "rfc", "paramref"),
)

#: Sphinx directives whose content is not reStructuredText to check (code, autodoc, tables of contents, cards)
LITERAL_DIRECTIVES = (
    *("code-block", "sourcecode", "code", "literalinclude", "highlight", "testcode", "testoutput", "testsetup"),
    *("testcleanup", "doctest", "autosummary", "automodule", "autoclass", "autofunction", "automethod"),
    *("autoattribute", "autodata", "autoexception", "autoproperty", "currentmodule", "module", "toctree"),
    *("index", "tabularcolumns", "glossary", "productionlist", "displayitem", "customcalloutitem", "tutoriallist"),
    *("video", "youtube", "py:function", "py:class", "py:method", "py:attribute", "py:module", "py:data"),
)

#: Sphinx directives whose content is reStructuredText, parsed (and checked) as such
NESTED_DIRECTIVES = (
    *("seealso", "versionadded", "versionchanged", "versionremoved", "deprecated", "only", "hlist", "centered"),
    *("rst-class", "todo", "collapse", "twocolumns", "tab", "tabs"),
)


class _AnyOption(dict[str, Callable[[str | None], Any]]):
    """An option spec that accepts every option with any value (or none: a flag)."""

    def __init__(self) -> None:
        super().__init__(name=directives.unchanged)  # not empty: docutils skips option parsing for an empty spec

    def __missing__(self, key: str) -> Callable[[str | None], Any]:
        return directives.unchanged  # type: ignore[no-any-return]


class _LiteralDirective(rst.Directive):  # type: ignore[misc]
    """A Sphinx directive taken on trust: any arguments, options and content, which is not parsed."""

    has_content = True
    required_arguments = 0
    optional_arguments = 1
    final_argument_whitespace = True
    option_spec = _AnyOption()

    def run(self) -> list[nodes.Node]:
        return [nodes.comment()]  # a stand-in for what Sphinx would put here (a section holding it is not empty)


class _NestedDirective(_LiteralDirective):
    """A Sphinx directive taken on trust whose content is parsed as reStructuredText."""

    def run(self) -> list[nodes.Node]:
        container = nodes.container()
        self.state.nested_parse(self.content, self.content_offset, container)
        return [container]


def _any_role(
    name: str,
    rawtext: str,
    text: str,
    lineno: int,
    inliner: Any,
    options: dict[str, Any] | None = None,
    content: Sequence[str] = (),
) -> tuple[list[nodes.Node], list[nodes.system_message]]:
    """A Sphinx role taken on trust: its text is kept as a literal."""
    return [nodes.literal(rawtext, text)], []


def register_sphinx_stand_ins() -> None:
    """Register the Sphinx roles and directives above with docutils (idempotent)."""
    for role in SPHINX_ROLES:
        roles.register_local_role(role, _any_role)
    for name in LITERAL_DIRECTIVES:
        directives.register_directive(name, _LiteralDirective)
    for name in NESTED_DIRECTIVES:
        directives.register_directive(name, _NestedDirective)


def _sphinx_source_folder(path: Path) -> Path | None:
    """The nearest folder above ``path`` holding a ``conf.py``, or None."""
    for folder in path.resolve().parents:
        if (folder / "conf.py").is_file():
            return folder
    return None


def check(path: Path) -> list[str]:
    """The problems docutils reports in the file at ``path``, each as ``file:line: (LEVEL/n) message``."""
    register_sphinx_stand_ins()
    parser = rst.Parser()
    reader = standalone.Reader()
    settings = frontend.get_default_settings(parser, reader)
    settings.report_level = 5  # nothing written to stderr: the observer below collects the messages
    settings.halt_level = 5  # never stop at the first error
    source_folder = _sphinx_source_folder(path)
    if source_folder is not None:
        settings.root_prefix = str(source_folder)
    document = utils.new_document(str(path), settings)
    messages: list[nodes.system_message] = []
    document.reporter.attach_observer(messages.append)
    parser.parse(path.read_text(encoding="utf-8"), document)
    document.transformer.populate_from_components((reader, parser))
    document.transformer.apply_transforms()
    problems = []
    for message in messages:
        if message["level"] < REPORT_LEVEL:
            continue
        where = message.get("source") or str(path)
        line = message.get("line")
        text = message.children[0].astext() if message.children else message.astext()
        location = f"{where}:{line}" if line is not None else where
        problems.append(f"{location}: ({message['type']}/{message['level']}) {text}")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    """Check the files named in ``argv``; print the problems; 1 if there are any, else 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("files", nargs="+", type=Path, help="reStructuredText files to check")
    args = parser.parse_args(argv)
    failed = False
    for path in args.files:
        try:
            problems = check(path)
        except OSError as error:
            problems = [f"{path}: cannot read: {error}"]
        for problem in problems:
            print(problem)
        failed = failed or bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
