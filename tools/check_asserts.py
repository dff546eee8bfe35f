"""Report test assertions that cannot fail (``make lint``).

A resume test that compares a run with itself passes whatever the callback does: ``assert resumed.seen ==
resumed.seen`` or ``torch.equal(weights, weights)`` reads like a check and checks nothing. Such slips have reached
this repository's tests before, so every ``assert`` statement under the given folders is parsed and reported
(``file:line: why``) when its test is

- a constant (``assert True``, ``assert 1``, ``assert "text"``; ``assert False`` and other falsy constants are
  left alone: they fail on purpose),
- a non-empty tuple (``assert (x == y, "message")``: always truthy),
- a comparison of an expression with itself (``a == a``, ``a is a``, also ``x < a == a`` within a chain; expressions
  are compared by their ``ast.dump``), or
- a call of a function or method whose name ends in ``equal``, ``array_equal``, ``allclose``, ``assert_close``,
  ``assert_equal``, ``isclose`` or ``states_equal`` whose first two positional arguments are the same expression
  (``torch.equal(a, a)``), also under ``not``, ``all(...)``, ``and``/``or``.

Bare calls of the ``assert_*`` functions (``torch.testing.assert_close(a, a)`` as a statement) are reported too.
The exit status is 1 when anything is reported, else 0. Usage: ``python tools/check_asserts.py tests [more ...]``.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

#: names (of functions, or of methods after the last dot) that compare their first two arguments
COMPARISON_SUFFIXES = ("equal", "array_equal", "allclose", "assert_close", "assert_equal", "isclose", "states_equal")


def _same(left: ast.expr, right: ast.expr) -> bool:
    """Whether two expressions are written the same (positions ignored)."""
    return ast.dump(left) == ast.dump(right)


def _callee_name(call: ast.Call) -> str | None:
    """The called name (``equal`` for ``torch.equal(...)``), or None for a call of something else."""
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _self_comparing_call(node: ast.expr) -> str | None:
    """Why ``node`` is a comparing call of an expression with itself, or None."""
    if not isinstance(node, ast.Call):
        return None
    name = _callee_name(node)
    if name is None or not name.endswith(COMPARISON_SUFFIXES):
        return None
    positional = [arg for arg in node.args if not isinstance(arg, ast.Starred)]
    if len(positional) >= 2 and _same(positional[0], positional[1]):
        return f"{name}() compares {ast.unparse(positional[0])} with itself"
    return None


def _why(test: ast.expr) -> str | None:
    """Why an assertion of ``test`` cannot fail, or None if it can."""
    if isinstance(test, ast.Constant):
        return f"the test is the constant {test.value!r}" if test.value else None
    if isinstance(test, ast.Tuple):
        return "the test is a non-empty tuple, always true" if test.elts else None
    if isinstance(test, (ast.List, ast.Set, ast.Dict)):
        return None  # a literal display: empty ones fail, and a non-empty one is a slip ruff reports elsewhere
    if isinstance(test, ast.JoinedStr):
        return "the test is a non-empty f-string, always true" if test.values else None
    if isinstance(test, ast.Compare):  # `a < b == c` is `a < b and b == c`: each operand with the next
        operands = [test.left, *test.comparators]
        for left, right in itertools.pairwise(operands):
            if _same(left, right):
                return f"compares {ast.unparse(left)} with itself"
        return None
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _self_comparing_call(test.operand)
    if isinstance(test, ast.BoolOp):
        for value in test.values:
            reason = _why(value)
            if reason is not None:
                return reason
        return None
    if isinstance(test, ast.Call) and _callee_name(test) in ("all", "any") and len(test.args) == 1:
        argument = test.args[0]
        if isinstance(argument, (ast.GeneratorExp, ast.ListComp)):
            return _why(argument.elt)
    return _self_comparing_call(test)


def findings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``(line, why)`` for every assertion in ``tree`` that cannot fail."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            reason = _why(node.test)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            name = _callee_name(node.value)
            reason = _self_comparing_call(node.value) if name and name.startswith("assert") else None
        else:
            continue
        if reason is not None:
            yield node.lineno, reason


def check_file(path: Path) -> list[str]:
    """The report lines (``path:line: why``) of one file; a file that does not parse is reported as such."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as error:
        return [f"{path}:{error.lineno}: does not parse: {error.msg}"]
    return [f"{path}:{line}: assertion cannot fail: {why}" for line, why in sorted(findings(tree))]


def python_files(roots: Sequence[Path]) -> list[Path]:
    """Every ``*.py`` file under ``roots`` (a root may be a file), sorted."""
    files: set[Path] = set()
    for root in roots:
        files.update([root] if root.is_file() else root.rglob("*.py"))
    return sorted(files)


def main(argv: Sequence[str] | None = None) -> int:
    """Check every Python file under the given folders; 1 if an assertion cannot fail, else 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("paths", nargs="+", type=Path, help="folders (searched recursively) or files")
    args = parser.parse_args(argv)
    missing = [path for path in args.paths if not path.exists()]
    if missing:
        parser.error(f"no such file or folder: {', '.join(map(str, missing))}")
    files = python_files(args.paths)
    problems = [line for path in files for line in check_file(path)]
    for line in problems:
        print(line)
    if problems:
        print(f"{len(problems)} assertion(s) that cannot fail in {len(files)} file(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
