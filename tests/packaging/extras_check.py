"""Check an *installed* lightning-midepoch's extras; exit status 0 only if each named extra is installed and imports.

``make dist-check`` runs it with the python of a fresh virtual environment, outside the source tree::

    python extras_check.py EXTRA [EXTRA ...]

For each extra, the requirements come from the installed distribution's own metadata (``Requires-Dist`` with
``extra == ...``): each must be installed in a version its specifier allows, and its top-level module must import.
An extra the installed metadata does not declare is a failure. It prints one line per requirement.
"""

from __future__ import annotations

import importlib
import sys
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

DISTRIBUTION = "lightning-midepoch"


def _module_of(distribution: str) -> str:
    """The top-level module a distribution provides under (nearly) its own name, e.g. pytest-cov -> pytest_cov."""
    provided = [name for name, dists in metadata.packages_distributions().items() if distribution in dists]
    wanted = canonicalize_name(distribution).replace("-", "_")
    for name in provided:
        if canonicalize_name(name).replace("-", "_") == wanted:
            return name
    if not provided:
        raise LookupError(f"{distribution} provides no importable top-level module")
    return sorted(provided)[0]


def main(argv: list[str]) -> int:
    installed = metadata.metadata(DISTRIBUTION)
    declared = set(installed.get_all("Provides-Extra") or [])
    requirements = [Requirement(text) for text in metadata.requires(DISTRIBUTION) or []]
    failures = 0
    for extra in argv:
        if extra not in declared:
            print(
                f"FAIL: [{extra}] is not an extra of {DISTRIBUTION} {installed['Version']} (it has {sorted(declared)})"
            )
            failures += 1
            continue
        needed = [r for r in requirements if r.marker is not None and r.marker.evaluate({"extra": extra})]
        if not needed:
            print(f"FAIL: [{extra}] requires nothing")
            failures += 1
        for requirement in needed:
            try:
                version = metadata.version(requirement.name)
            except metadata.PackageNotFoundError:
                print(f"FAIL: [{extra}] {requirement}: {requirement.name} is not installed")
                failures += 1
                continue
            if not requirement.specifier.contains(version, prereleases=True):
                print(f"FAIL: [{extra}] {requirement}: {requirement.name} {version} is installed")
                failures += 1
                continue
            dist_name = metadata.distribution(requirement.name).metadata["Name"]
            module = _module_of(dist_name)
            try:
                importlib.import_module(module)
            except Exception as error:  # any import failure is a finding, with its reason
                print(f"FAIL: [{extra}] {requirement}: import {module}: {type(error).__name__}: {error}")
                failures += 1
                continue
            print(f"ok: [{extra}] {requirement.name} {version}, import {module}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
