"""Apply the upstream patch series (``upstream/*.patch``) to the ``lightning`` installed in this interpreter's env.

``make upstream-check`` tests the feature as a patch to Lightning itself: the patches are written against Lightning's
repository (``a/src/lightning/...``, plus ``tests/`` and ``docs/``), but the check runs the Trainer-level tests on an
installed ``lightning`` wheel, whose ``lightning/`` package is ``src/lightning/`` of the repository (the release's
loop files are identical to the tag the patches are made against). So, run with the interpreter of the environment
to patch (``.venv-upstream/bin/python tools/apply_upstream.py upstream``), this script

1. reinstalls the installed ``lightning`` release (``pip install --force-reinstall --no-deps``), removes the files
   under ``lightning/`` that the wheel does not have (modules an earlier run's patches added), and checks every file
   against the wheel's ``RECORD`` hashes: a re-run starts from the pristine release, never from patched files;
2. applies, patch by patch in file-name order, only each patch's files under ``src/lightning/`` (not the
   ``CHANGELOG.md`` files there: the wheel's differ from the tag's), with ``git apply -p2`` in site-packages, which
   applies a patch wholly or not at all and without fuzz;
3. prints what each patch changed and what it left out.

A patch that does not apply ends the script with status 1 and says which, and why (``git apply``'s own message).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "lightning"
PACKAGE = "lightning"
#: the repository's folder that the wheel's ``lightning/`` package is
SOURCE_PREFIX = "src/lightning/"
#: ``git apply -p2`` turns ``a/src/lightning/x.py`` into ``lightning/x.py``, relative to site-packages
STRIP = 2
DIFF_HEADER = re.compile(r"^diff --git a/(?P<old>\S+) b/(?P<new>\S+)$")


class UpstreamError(Exception):
    """Why the series cannot be applied: printed, and the script exits with status 1."""


@dataclass
class Section:
    """One file's diff in a patch: its ``diff --git`` header line and what follows, up to the next file's."""

    old: str
    new: str
    lines: list[str] = field(default_factory=list)

    @property
    def path(self) -> str:
        """The file's repository path (``old -> new`` for a rename)."""
        return self.new if self.new == self.old else f"{self.old} -> {self.new}"


def wanted(path: str) -> bool:
    """Whether a repository path is in the wheel: under ``src/lightning/``, and not a ``CHANGELOG.md`` there."""
    return path.startswith(SOURCE_PREFIX) and Path(path).name != "CHANGELOG.md"


def split_patch(text: str) -> tuple[list[str], list[Section]]:
    """The lines before the first file's diff (the mail header, the diffstat) and each file's diff, in order."""
    header: list[str] = []
    sections: list[Section] = []
    for line in text.splitlines(keepends=True):
        match = DIFF_HEADER.match(line.rstrip("\n"))
        if match is not None:
            sections.append(Section(match["old"], match["new"]))
        if sections:
            sections[-1].lines.append(line)
        else:
            header.append(line)
    return header, sections


def select(patch: Path) -> tuple[str, list[Section], list[Section]]:
    """The part of ``patch`` to apply to the wheel (header and wanted sections), those sections, and the others."""
    header, sections = split_patch(patch.read_text(encoding="utf-8"))
    if not sections:
        raise UpstreamError(f"{patch}: no `diff --git` section: is it a git diff / git format-patch file?")
    kept: list[Section] = []
    left: list[Section] = []
    for section in sections:
        if wanted(section.old) != wanted(section.new):
            raise UpstreamError(f"{patch}: {section.path} moves a file into or out of {SOURCE_PREFIX}")
        (kept if wanted(section.new) else left).append(section)
    text = "".join(header) + "".join(line for section in kept for line in section.lines)
    return text, kept, left


def _hash(path: Path) -> str:
    digest = hashlib.sha256(path.read_bytes()).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def restore(site: Path, version: str, reinstall: bool) -> str:
    """Make ``site/lightning`` the pristine release: reinstalled, stray files removed, every hash checked."""
    if reinstall:
        command = [sys.executable, "-m", "pip", "--disable-pip-version-check", "install", "--quiet"]
        command += ["--force-reinstall", "--no-deps", f"{DISTRIBUTION}=={version}"]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise UpstreamError(f"reinstalling {DISTRIBUTION}=={version} failed:\n{result.stderr}")
    files = metadata.distribution(DISTRIBUTION).files or []
    recorded = {str(file): file for file in files if file.parts and file.parts[0] == PACKAGE}
    removed = 0
    for path in sorted((site / PACKAGE).rglob("*")):
        relative = path.relative_to(site).as_posix()
        if path.is_file() and "__pycache__" not in path.parts and relative not in recorded:
            path.unlink()  # a file an earlier run's patch added
            removed += 1
    changed = [
        name
        for name, file in recorded.items()
        if file.hash is not None and (not (site / name).is_file() or _hash(site / name) != f"sha256={file.hash.value}")
    ]
    if changed:
        raise UpstreamError(
            f"{DISTRIBUTION} {version} in {site} differs from its wheel's RECORD after the reinstall: "
            f"{', '.join(changed[:10])}"
        )
    return f"{DISTRIBUTION} {version} restored to the release ({len(recorded)} files checked, {removed} removed)"


def apply(patch: Path, site: Path) -> str:
    """Apply the wheel's part of ``patch`` in ``site``; a one-line account of what was applied and left out."""
    text, kept, left = select(patch)
    if not kept:
        return f"{patch.name}: nothing under {SOURCE_PREFIX} (left out: {len(left)} files)"
    with tempfile.TemporaryDirectory() as scratch:
        selected = Path(scratch) / patch.name
        selected.write_text(text, encoding="utf-8")
        # site-packages may lie inside a git work tree (this repository's): a ceiling keeps `git apply` from finding
        # it, so that it works as a patch tool on paths relative to site-packages
        env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(site.parent)}
        command = ["git", "apply", f"-p{STRIP}", "--whitespace=nowarn", str(selected)]
        result = subprocess.run(command, cwd=site, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise UpstreamError(
            f"{patch} does not apply to the installed {DISTRIBUTION} ({site / PACKAGE}); `git apply` says:\n"
            f"{result.stderr.strip()}\n(the patches before it stay applied; the next run reinstalls {DISTRIBUTION})"
        )
    applied = ", ".join(section.path.replace(SOURCE_PREFIX, f"{PACKAGE}/") for section in kept)
    # outside src/lightning/ by top folder (tests/, docs/, ...); a CHANGELOG.md under it by name
    skipped = sorted({s.new if s.new.startswith(SOURCE_PREFIX) else s.new.split("/")[0] + "/" for s in left})
    note = f"; left out {len(left)} file(s): {', '.join(skipped)}" if left else ""
    return f"{patch.name}: {applied}{note}"


def main(argv: list[str] | None = None) -> int:
    """Restore the installed release, apply the series; the exit status (1: something did not apply)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("patches", type=Path, help="the folder of the series (its *.patch files, in name order)")
    parser.add_argument(
        "--no-reinstall",
        action="store_true",
        help=f"do not reinstall {DISTRIBUTION} first (still checked against its RECORD: fails if patched)",
    )
    args = parser.parse_args(argv)
    if shutil.which("git") is None:
        print("apply_upstream: `git` is needed (git apply)", file=sys.stderr)
        return 1
    try:
        distribution = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        print(f"apply_upstream: {DISTRIBUTION} is not installed for {sys.executable}", file=sys.stderr)
        return 1
    site = Path(str(distribution.locate_file("")))
    patches = sorted(args.patches.glob("*.patch"))
    try:
        if not patches:
            raise UpstreamError(f"no *.patch files in {args.patches}/: nothing to check")
        print(restore(site, distribution.version, reinstall=not args.no_reinstall))
        for patch in patches:
            print(f"applied {apply(patch, site)}")
    except UpstreamError as error:
        print(f"apply_upstream: {error}", file=sys.stderr)
        return 1
    print(f"{len(patches)} patch(es) from {args.patches}/ applied to {site / PACKAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
