"""The package's metadata agree with what is tested and documented (fast checks; ``make dist-check`` builds and
installs the artifacts themselves, see tests/packaging/)."""

from __future__ import annotations

import ast
import datetime
import re
import sys
from importlib import metadata

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from project import ROOT, makefile_pythons, pinned, pyproject, readme_extras, version


def test_version_is_set_in_one_place():
    project = pyproject()
    assert "version" not in project["project"], "pyproject.toml: the version comes from __about__.py (dynamic)"
    assert "version" in project["project"]["dynamic"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "lightning_midepoch.__about__.__version__"
    assert not (ROOT / "setup.cfg").exists(), "setup.cfg: the metadata live in pyproject.toml only"
    # setup.py is a shim (the layout of Lightning's repository): `from setuptools import setup; setup()`, nothing else
    shim = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    statements = [ast.dump(node) for node in shim.body]
    expected = [ast.dump(node) for node in ast.parse("from setuptools import setup\nsetup()").body]
    assert statements == expected, "setup.py: only `setup()` without arguments, the metadata live in pyproject.toml"
    # the installed (editable) package reports the same version: `make venv` reinstalls it when __about__.py changes
    assert metadata.version("lightning-midepoch") == version()


def _minor(python: str) -> int:
    major, minor = python.split(".")
    assert major == "3", python
    return int(minor)


def test_claimed_pythons_are_the_tested_ones():
    """The classifiers name exactly the Pythons `make pythons` tests, from requires-python's lowest on, each one.

    requires-python has a lower bound only, as Lightning's: a cap makes pip fall back to an older release on a newer
    Python and breaks the lock files of the projects that depend on this one.
    """
    project = pyproject()["project"]
    spec = SpecifierSet(project["requires-python"])
    classified = {
        line.rsplit(" :: ", 1)[1]
        for line in project["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", line)
    }
    assert classified, "the classifiers name no Python 3 release"
    assert classified == set(makefile_pythons()), "`make pythons` (the Makefile's PYTHONS) tests other Pythons"
    assert all(s.operator in (">=", ">") for s in spec), f"requires-python {spec}: a lower bound only"
    newest = max(_minor(python) for python in classified)
    allowed = {f"3.{minor}" for minor in range(newest + 1) if spec.contains(f"3.{minor}.0")}
    assert allowed == classified, f"requires-python allows {sorted(allowed)}, the classifiers say {sorted(classified)}"


def test_readme_names_exactly_the_extras():
    extras = set(pyproject()["project"]["optional-dependencies"])
    assert readme_extras() == extras, "README.md's install section and pyproject.toml's extras differ"


def test_build_backend_is_pinned_alike_everywhere():
    """The editable installs (`--no-build-isolation`) use the same setuptools as `python -m build`."""
    (backend,) = pyproject()["build-system"]["requires"]
    name, _, pin = backend.partition("==")
    assert name == "setuptools", backend
    assert pin, f"[build-system] requires {backend!r}: pin it exactly"
    for requirements in ("ci.txt", "compat.txt", "pythons.txt", "lightning-suite.txt"):
        assert pinned(requirements).get("setuptools") == pin, f"requirements/{requirements}: setuptools=={pin}"


def test_make_pythons_installs_what_ci_installs():
    """On CI's Python, `make pythons` pins what CI pins; a pin for other Pythons only (an environment marker, as
    numpy's newest for 3.10) replaces the same package's pin there, so that every Python gets the same packages."""
    ci_python = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert ci_python in makefile_pythons(), f"CI's Python {ci_python} is not one `make pythons` tests"
    ci = pinned("ci.txt")
    for name, pin in pinned("pythons.txt", ci_python).items():
        assert ci.get(name) == pin, f"requirements/pythons.txt pins {name}=={pin}, ci.txt {ci.get(name)}"
    names = set(pinned("pythons.txt", ci_python))
    for python in makefile_pythons():
        pins = set(pinned("pythons.txt", python))
        assert pins == names, f"requirements/pythons.txt: on Python {python}, {sorted(pins ^ names)} differ"


def test_make_upstream_check_installs_what_ci_installs_without_the_package():
    """`make upstream-check` tests the patched Lightning with CI's pins, and without lightning-midepoch."""
    ci = pinned("ci.txt")
    upstream = pinned("upstream-check.txt")
    assert "lightning" in upstream, "requirements/upstream-check.txt: the Lightning to patch"
    for name, pin in upstream.items():
        assert ci.get(name) == pin, f"requirements/upstream-check.txt pins {name}=={pin}, ci.txt {ci.get(name)}"
    text = (ROOT / "requirements" / "upstream-check.txt").read_text(encoding="utf-8")
    assert not re.search(r"^\s*(lightning[-_]midepoch|-e|\.)", text, re.MULTILINE), "upstream-check.txt: no package"


def test_make_floor_tests_the_lowest_accepted_torch_and_numpy():
    """requirements/floor.txt (`make floor`) pins the lower bounds of pyproject.toml's torch and numpy: torch exactly,
    numpy within the same minor release (the lowest patch release with a wheel for the floor's Python)."""
    bounds = {}
    for requirement in map(Requirement, pyproject()["project"]["dependencies"]):
        (lowest,) = [s.version for s in requirement.specifier if s.operator == ">="]
        bounds[requirement.name] = Version(lowest)
    floor = {name: Version(pin) for name, pin in pinned("floor.txt", "3.10").items()}
    assert floor["torch"] == bounds["torch"], f"requirements/floor.txt: torch=={bounds['torch']}"
    assert floor["numpy"].release[:2] == bounds["numpy"].release[:2], f"requirements/floor.txt: numpy {bounds['numpy']}"
    assert floor["numpy"].major < 2, "torch 2.1 is built against numpy 1: it cannot run with numpy 2"


def test_changelog_has_a_dated_section_for_this_version():
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## \[([^\]]+)\](?: - (\S+))?$", changelog, re.MULTILINE)
    assert headings[0] == ("Unreleased", ""), "the first section is [Unreleased]"
    dated = {name: date for name, date in headings[1:]}
    assert version() in dated, f"CHANGELOG.md has no '## [{version()}] - YYYY-MM-DD' section"
    datetime.date.fromisoformat(dated[version()])
