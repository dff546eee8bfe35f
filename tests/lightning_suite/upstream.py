"""The git side of ``make upstream-suite``: Lightning's source trees, the patch series applied, the series' tests.

``python upstream.py tree REPO REV DEST [--git]`` writes the files of revision ``REV`` of the Lightning repository
``REPO`` (a mirror without a work tree will do) into ``DEST``; a blob missing from the repository's objects is left
out and named. With ``--git``, ``DEST`` becomes a git work tree of its own: one commit of exactly those files.

``python upstream.py apply TREE PATCH...`` checks with ``git apply --check`` that the series applies, patch after
patch, to the tree as it is (each patch checked together with the ones before it, nothing written), prints the result
for each, and only then applies the series in order (``git apply --index``). Exit status 1 if a patch does not apply.

``python upstream.py counts PATCH...`` prints, per patch, the lines it changes (added and removed) under ``src/``
(``CHANGELOG.md`` files left out), in the tests and elsewhere: a reviewer's measure of its size.

``python upstream.py tests TREE PATCH...`` prints the test files of ``tests/tests_pytorch`` that the series adds or
changes (from the patches' diff headers; removed files left out), relative to ``TREE/tests/tests_pytorch``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

#: the folder of Lightning's tests the suite runs in, relative to the repository's root
TESTS_ROOT = "tests/tests_pytorch"
#: a test module, as pytest collects it by default
TEST_FILE = re.compile(r"(^|/)(test_[^/]*|[^/]*_test)\.py$")
#: the identity of the commit ``tree --git`` makes (git refuses to commit without one)
COMMITTER = ("-c", "user.name=upstream-suite", "-c", "user.email=upstream-suite@localhost")


def git(cwd: Path, *args: str, stdin: str | None = None) -> str:
    """Run git in ``cwd``; its standard output, or ``SystemExit`` with its error output if it fails."""
    done = subprocess.run(["git", *args], cwd=cwd, input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"git {' '.join(args[:3])} ... in {cwd} failed:\n{done.stderr.strip()}")
    return done.stdout


def blobs(listing: str) -> tuple[dict[str, str], list[str]]:
    """The files of ``git ls-tree -r -z`` output (path to object name), and the other entries (submodules).

    >>> blobs("100644 blob aa\\ta.py\\0" "160000 commit bb\\tsub\\0" "100755 blob cc\\tb c.sh\\0")
    ({'a.py': 'aa', 'b c.sh': 'cc'}, ['sub'])
    """
    files: dict[str, str] = {}
    others: list[str] = []
    for entry in listing.split("\0"):
        if not entry:
            continue
        meta, _, path = entry.partition("\t")
        _, kind, name = meta.split()
        if kind == "blob":
            files[path] = name
        else:
            others.append(path)
    return files, others


def missing_objects(batch_check: str) -> set[str]:
    """The object names ``git cat-file --batch-check`` reports missing.

    >>> sorted(missing_objects("aa blob 12\\nbb missing\\ncc blob 3\\n"))
    ['bb']
    """
    return {line.split()[0] for line in batch_check.splitlines() if line.endswith(" missing")}


def export_tree(repo: Path, rev: str, dest: Path, make_git: bool) -> int:
    """Write revision ``rev``'s files into ``dest`` (``git archive``), optionally as one commit of its own."""
    commit = git(repo, "rev-parse", "--verify", f"{rev}^{{commit}}").strip()
    files, others = blobs(git(repo, "ls-tree", "-r", "-z", commit))
    absent = missing_objects(git(repo, "cat-file", "--batch-check", stdin="".join(f"{n}\n" for n in files.values())))
    wanted = sorted(path for path, name in files.items() if name not in absent)
    left_out = sorted(path for path, name in files.items() if name in absent)
    dest.mkdir(parents=True, exist_ok=False)
    with tempfile.TemporaryFile(mode="w+") as errors:
        archive = subprocess.Popen(
            ["git", "archive", "--format=tar", commit, "--", *(f":(literal){path}" for path in wanted)],
            cwd=repo,
            stdout=subprocess.PIPE,
            stderr=errors,
        )
        extracted = subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=False)
        if archive.stdout is not None:
            archive.stdout.close()
        failed = archive.wait() != 0 or extracted.returncode != 0
        errors.seek(0)
        # git archive still names each missing blob it leaves out ("invalid object"): only other messages are shown
        for line in errors.read().splitlines():
            if not any(f"'{path}'" in line for path in left_out):
                print(line, file=sys.stderr)
    if failed:
        raise SystemExit(f"could not export {rev} of {repo} into {dest}")
    print(f"{dest}: {len(wanted)} files of {rev} ({commit[:10]}) from {repo}")
    for path in left_out:
        print(f"  left out (its blob is missing from the repository): {path}")
    for path in others:
        print(f"  left out (a submodule): {path}")
    if make_git:
        git(dest, "init", "-q")
        # -f: Lightning's own .gitignore files must not drop files that its repository tracks
        git(dest, "add", "-A", "-f")
        git(dest, *COMMITTER, "commit", "-q", "--no-verify", "-m", f"Lightning {rev} ({commit})")
        print(f"  a git work tree: {git(dest, 'log', '--oneline', '-1').strip()}")
    return 0


def apply_series(tree: Path, patches: Sequence[Path]) -> int:
    """Check that each patch applies after the ones before it (nothing written), then apply them all in order."""
    if not patches:
        print("no patches given")
        return 1
    names = [str(patch.resolve()) for patch in patches]
    texts = [patch.read_text(encoding="utf-8") for patch in patches]
    print(f"git apply --check, patch after patch, against {tree} ({git(tree, 'log', '--oneline', '-1').strip()}):")
    for index, patch in enumerate(patches):
        # one input of this patch and the ones before it: git apply follows a file through them (given as separate
        # files, each would be checked against the unpatched tree alone)
        series = "\n".join(texts[: index + 1])
        done = subprocess.run(
            ["git", "apply", "--check"], cwd=tree, input=series, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            print(f"  {patch.name}: DOES NOT APPLY\n" + "\n".join(f"      {line}" for line in done.stderr.splitlines()))
            for rest in patches[index + 1 :]:
                print(f"  {rest.name}: not checked (it comes after one that does not apply)")
            return 1
        stat = git(tree, "apply", "--numstat", names[index]).splitlines()
        print(f"  {patch.name}: applies ({len(stat)} files)")
    for name in names:
        git(tree, "apply", "--index", name)
    print(f"applied, in order: {len(patches)} patches\n{git(tree, 'diff', '--cached', '--stat', 'HEAD').rstrip()}")
    return 0


def changed_paths(patch: str) -> list[str]:
    """The paths a patch leaves a file at (added, changed, renamed or copied to; not removed), from its diff headers.

    >>> changed_paths(
    ...     "diff --git a/x.py b/x.py\\n--- a/x.py\\n+++ b/x.py\\n"
    ...     "diff --git a/old.py b/new.py\\nsimilarity index 100%\\nrename from old.py\\nrename to new.py\\n"
    ...     "diff --git a/gone.py b/gone.py\\ndeleted file mode 100644\\n--- a/gone.py\\n+++ /dev/null\\n"
    ... )
    ['x.py', 'new.py']
    """
    paths: list[str] = []
    in_header = False
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            in_header = True
        elif in_header and line.startswith(("+++ b/", "rename to ", "copy to ")):
            path = line.split("+++ b/", 1)[1] if line.startswith("+++") else line.split(" to ", 1)[1]
            if path not in paths:
                paths.append(path)
        elif line.startswith("@@"):
            in_header = False
    return paths


def series_tests(paths: Iterable[str]) -> list[str]:
    """The test modules among ``paths``, relative to ``tests/tests_pytorch``, in order and each once.

    >>> series_tests(["src/a.py", "tests/tests_pytorch/loops/test_a.py", "tests/tests_pytorch/helpers/util.py",
    ...               "tests/tests_fabric/test_b.py", "tests/tests_pytorch/loops/test_a.py"])
    ['loops/test_a.py']
    """
    found: list[str] = []
    for path in paths:
        if path.startswith(f"{TESTS_ROOT}/") and TEST_FILE.search(path):
            relative = path[len(TESTS_ROOT) + 1 :]
            if relative not in found:
                found.append(relative)
    return found


def list_tests(tree: Path, patches: Sequence[Path]) -> int:
    """Print the series' test files that exist in ``tree`` (space-separated, for a shell command line)."""
    paths = [path for patch in patches for path in changed_paths(patch.read_text(encoding="utf-8"))]
    tests = [test for test in series_tests(paths) if (tree / TESTS_ROOT / test).is_file()]
    print(" ".join(tests))
    return 0


def count_lines(patch: str) -> dict[str, tuple[int, int]]:
    """Added and removed lines per part (``src``: under ``src/`` without ``CHANGELOG.md``; ``tests``; ``other``).

    >>> count_lines(
    ...     "diff --git a/src/x.py b/src/x.py\\n--- a/src/x.py\\n+++ b/src/x.py\\n@@ -1 +1,2 @@\\n-a\\n+b\\n+c\\n"
    ...     "diff --git a/src/CHANGELOG.md b/src/CHANGELOG.md\\n--- a/src/CHANGELOG.md\\n+++ b/src/CHANGELOG.md\\n"
    ...     "@@ -1 +1,2 @@\\n x\\n+- y\\n"
    ... )
    {'src': (2, 1), 'tests': (0, 0), 'other': (1, 0)}
    """
    counts = {"src": [0, 0], "tests": [0, 0], "other": [0, 0]}
    part = ""  # before the first file's diff: the commit message
    in_header = False
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            path = line.rsplit(" b/", 1)[-1]
            if path.startswith("src/") and not path.endswith("CHANGELOG.md"):
                part = "src"
            else:
                part = "tests" if path.startswith("tests/") else "other"
            in_header = True
        elif line.startswith("@@"):
            in_header = False
        elif not part:
            continue
        elif not in_header and line.startswith("+"):
            counts[part][0] += 1
        elif not in_header and line.startswith("-") and line != "-- ":
            counts[part][1] += 1
    return {name: (added, removed) for name, (added, removed) in counts.items()}


def print_counts(patches: Sequence[Path]) -> int:
    """Print each patch's changed lines of ``src/``, the tests and the rest."""
    for patch in patches:
        counts = count_lines(patch.read_text(encoding="utf-8"))
        parts = ", ".join(f"{name} {a + r} (+{a} -{r})" for name, (a, r) in counts.items())
        print(f"  {patch.name}: {parts}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run one of the sub-commands ``tree``, ``apply`` and ``tests``."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    tree = commands.add_parser("tree", help="write a revision's files into a folder")
    tree.add_argument("repo", type=Path)
    tree.add_argument("rev")
    tree.add_argument("dest", type=Path)
    tree.add_argument("--git", action="store_true", help="make the folder a git work tree (one commit)")
    counts = commands.add_parser("counts", help="the lines each patch changes")
    counts.add_argument("patches", type=Path, nargs="+")
    for name, text in (("apply", "check, then apply, a patch series"), ("tests", "list the series' test files")):
        command = commands.add_parser(name, help=text)
        command.add_argument("tree", type=Path)
        command.add_argument("patches", type=Path, nargs="*")
    args = parser.parse_args(argv)
    if args.command == "tree":
        return export_tree(args.repo, args.rev, args.dest, args.git)
    if args.command == "counts":
        return print_counts(args.patches)
    if args.command == "apply":
        return apply_series(args.tree, args.patches)
    return list_tests(args.tree, args.patches)


if __name__ == "__main__":
    sys.exit(main())
