"""Compare two junit XML reports of Lightning's tests: stock, and with ``MidEpochResume`` attached or patched.

``python compare.py STOCK.xml ATTACHED.xml --allowed allowed_failures.txt`` prints the counts of both runs, every test
that fails only when attached (split into allowed artifacts of the plugin, with their reasons, and unexpected ones),
the tests that fail in both runs (environment problems, not ours), and exits with 1 if any unexpected failure exists.

``python compare.py STOCK.xml PATCHED.xml --label patched --allowed changed_tests.txt --series SERIES.xml`` does the
same for ``make upstream-suite``: Lightning's tests on its own source tree, stock and with the patch series applied,
the listed tests being the ones the series changes on purpose. ``--series`` adds the report of the series' own tests
(the test files it adds or changes), and the exit status is also 1 if one of them fails.

The allowed-failures file has one test node id a line, then `` # `` and the reason; a node id ending in ``*`` covers
every node id it starts (all parametrizations of a test). Blank lines and lines starting with ``#`` are ignored.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

OUTCOMES = ("passed", "failed", "errors", "skipped")
BROKEN = ("failed", "errors")
#: the words of the report for each kind of second run (``--label``)
WORDING = {
    "attached": {
        "both": "fail in both runs (environment, not the callback)",
        "only_stock": "fail only in the stock run (flaky?)",
        "allowed": "allowed",
        "stale": "allowed but not failing (could be removed from the list)",
        "total": "allowed failures",
    },
    "patched": {
        "both": "fail in both runs (stock Lightning or the environment, not the series)",
        "only_stock": "fail only in the stock run (fixed by the series, or flaky?)",
        "allowed": "changed on purpose",
        "stale": "listed as changed on purpose but not failing (could be removed from the list)",
        "total": "changed on purpose",
    },
}


def node_id(case: ET.Element) -> str:
    """The test's node id: the ``nodeid`` property the plugin records, else ``classname::name``.

    >>> node_id(ET.fromstring('<testcase classname="loops.test_a" name="test_b[1]"/>'))
    'loops.test_a::test_b[1]'
    """
    for prop in case.iter("property"):
        if prop.get("name") == "nodeid":
            return str(prop.get("value"))
    return f"{case.get('classname', '')}::{case.get('name', '')}"


def outcome(case: ET.Element) -> str:
    """``passed``, ``failed``, ``errors`` (setup or teardown) or ``skipped`` (xfail included) for one testcase.

    >>> outcome(ET.fromstring('<testcase><failure/><error/></testcase>'))
    'failed'
    """
    tags = {child.tag for child in case}
    if "failure" in tags:
        return "failed"
    if "error" in tags:
        return "errors"
    if "skipped" in tags:
        return "skipped"
    return "passed"


def first_line(case: ET.Element) -> str:
    """The failure or error message of a testcase, shortened to one line."""
    for child in case:
        if child.tag in ("failure", "error"):
            message = (child.get("message") or child.text or "").strip().splitlines()
            return message[0][:200] if message else ""
    return ""


def load(path: Path) -> tuple[dict[str, ET.Element], float]:
    """Every testcase of a junit XML report by node id (a repeated id keeps its worst outcome), and the run time."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    cases: dict[str, ET.Element] = {}
    for case in root.iter("testcase"):
        key = node_id(case)
        if key not in cases or outcome(cases[key]) not in BROKEN:
            cases[key] = case
    return cases, sum(float(suite.get("time", 0.0)) for suite in suites)


def load_allowed(path: Path | None) -> dict[str, str]:
    """The allowed failures: node id (or prefix ending in ``*``) to reason."""
    allowed: dict[str, str] = {}
    if path is None:
        return allowed
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, reason = line.partition(" # ")
        allowed[key.strip()] = reason.strip()
    return allowed


def same_file(first: str, second: str) -> bool:
    """Whether two test-file paths name the same file: equal, or one is the other with leading folders.

    pytest names a test relative to the folder it takes as its root, which depends on the checkout's configuration
    files, so the same test may be ``loops/test_a.py::t`` in one run and ``tests/tests_pytorch/loops/...`` in a list.

    >>> same_file("loops/a.py", "tests/loops/a.py"), same_file("tests/loops/a.py", "loops/a.py")
    (True, True)
    >>> same_file("xloops/a.py", "loops/a.py"), same_file("b/a.py", "c/a.py")
    (False, False)
    """
    longer, shorter = sorted((first, second), key=len, reverse=True)
    return longer == shorter or longer.endswith("/" + shorter)


def allowed_reason(test: str, allowed: dict[str, str]) -> str | None:
    """The reason ``test`` may fail when attached, or ``None`` (the files' paths compared with ``same_file``).

    >>> allowed_reason("a.py::t[1]", {"a.py::t*": "why"}), allowed_reason("a.py::u", {"a.py::t*": "why"})
    ('why', None)
    >>> allowed_reason("loops/a.py::t", {"tests/loops/a.py::t": "why"}), allowed_reason("a.py::tt", {"a.py::t": ""})
    ('why', None)
    """
    path, _, name = test.partition("::")
    for key, reason in allowed.items():
        key_path, _, key_name = key.partition("::")
        if not same_file(path, key_path):
            continue
        if name == key_name or (key_name.endswith("*") and name.startswith(key_name[:-1])):
            return reason
    return None


def count_row(label: str, cases: dict[str, ET.Element], seconds: float) -> str:
    """One line of the table of counts: each outcome, the number of tests and the run time.

    >>> count_row("run", {"a::t": ET.fromstring("<testcase/>")}, 2.0)
    'run                1         0         0         0         1         2'
    """
    counts = Counter(outcome(case) for case in cases.values())
    return f"{label:10}" + "".join(f"{counts[name]:>10}" for name in OUTCOMES) + f"{len(cases):>10}{seconds:>10.0f}"


def series_report(path: Path) -> int:
    """Print the outcome of the series' own tests (``--series``); the number of them that fail."""
    cases, seconds = load(path)
    broken = sorted(test for test, case in cases.items() if outcome(case) in BROKEN)
    print(f"\nthe series' own tests ({path.name}):")
    print(f"{'':10}" + "".join(f"{name:>10}" for name in (*OUTCOMES, "total", "seconds")))
    print(count_row("series", cases, seconds))
    if not cases:
        print("  no test ran: the series adds or changes no test file of tests/tests_pytorch")
    for test in broken:
        print(f"  {test} ({outcome(cases[test])}) [SERIES TEST FAILS]\n      {first_line(cases[test])}")
    return len(broken)


def main(argv: list[str] | None = None) -> int:
    """Print the comparison; 1 if a test fails only in the second run and is not in the allowed list."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("stock", type=Path)
    parser.add_argument("attached", type=Path, help="the second run's report (attached or patched)")
    parser.add_argument("--allowed", type=Path, default=None)
    parser.add_argument("--label", choices=sorted(WORDING), default="attached", help="what the second run is")
    parser.add_argument("--series", type=Path, default=None, help="the report of the series' own tests")
    args = parser.parse_args(argv)
    label: str = args.label
    words = WORDING[label]

    stock, stock_time = load(args.stock)
    attached, attached_time = load(args.attached)
    allowed = load_allowed(args.allowed)

    print(f"{'':10}" + "".join(f"{name:>10}" for name in (*OUTCOMES, "total", "seconds")))
    print(count_row("stock", stock, stock_time))
    print(count_row(label, attached, attached_time))

    only_attached = sorted(
        test
        for test, case in attached.items()
        if outcome(case) in BROKEN and (test not in stock or outcome(stock[test]) not in BROKEN)
    )
    both = sorted(
        test for test, case in attached.items() if outcome(case) in BROKEN and outcome(stock.get(test, case)) in BROKEN
    )
    only_stock = sorted(
        test
        for test, case in stock.items()
        if outcome(case) in BROKEN and test in attached and outcome(attached[test]) not in BROKEN
    )
    unexpected = [test for test in only_attached if allowed_reason(test, allowed) is None]

    print(f"\nfail only when {label}: {len(only_attached)}")
    for test in only_attached:
        reason = allowed_reason(test, allowed)
        before = outcome(stock[test]) if test in stock else "not run"
        tag = f"{words['allowed']}: {reason}" if reason is not None else "UNEXPECTED"
        print(f"  {test} (stock: {before}) [{tag}]\n      {first_line(attached[test])}")
    print(f"\n{words['both']}: {len(both)}")
    for test in both:
        print(f"  {test}\n      {first_line(attached[test])}")
    if only_stock:
        print(f"\n{words['only_stock']}: {len(only_stock)}")
        for test in only_stock:
            print(f"  {test}\n      {first_line(stock[test])}")
    missing = sorted(set(stock) ^ set(attached))
    if missing:
        print(f"\nin one run only: {len(missing)}")
        for test in missing:
            run, cases = ("stock", stock) if test in stock else (label, attached)
            print(f"  {test} ({run}: {outcome(cases[test])})")
    used = {key for test in only_attached for key in allowed if allowed_reason(test, {key: key}) is not None}
    files_run = {test.partition("::")[0] for test in attached}
    # an entry is stale only if its file ran (a run of a few folders leaves the others' entries alone)
    stale = sorted(
        key for key in set(allowed) - used if any(same_file(path, key.partition("::")[0]) for path in files_run)
    )
    if stale:
        print(f"\n{words['stale']}: {len(stale)}")
        for key in stale:
            print(f"  {key}")
    series_broken = series_report(args.series) if args.series is not None else 0
    print(f"\n{words['total']}: {len(only_attached) - len(unexpected)}; unexpected failures: {len(unexpected)}", end="")
    print(f"; the series' own tests failing: {series_broken}" if args.series is not None else "")
    return 1 if unexpected or series_broken else 0


if __name__ == "__main__":
    sys.exit(main())
