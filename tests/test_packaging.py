"""The package's metadata agree with what is tested and documented (fast checks; ``make dist-check`` builds and
installs the artifacts themselves, see tests/packaging/)."""

from __future__ import annotations

import datetime
import re
from importlib import metadata

from packaging.specifiers import SpecifierSet

from project import ROOT, makefile_pythons, pinned, pyproject, readme_extras, version


def test_version_is_set_in_one_place():
    project = pyproject()
    assert "version" not in project["project"], "pyproject.toml: the version comes from __about__.py (dynamic)"
    assert "version" in project["project"]["dynamic"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "lightning_midepoch.__about__.__version__"
    for legacy in ("setup.py", "setup.cfg"):
        assert not (ROOT / legacy).exists(), f"{legacy}: the metadata live in pyproject.toml only"
    # the installed (editable) package reports the same version: `make venv` reinstalls it when __about__.py changes
    assert metadata.version("lightning-midepoch") == version()


def test_claimed_pythons_are_the_tested_ones():
    """requires-python, the classifiers and `make pythons` name the same Python versions."""
    project = pyproject()["project"]
    spec = SpecifierSet(project["requires-python"])
    allowed = {f"3.{minor}" for minor in range(0, 40) if spec.contains(f"3.{minor}.0")}
    classified = {
        line.rsplit(" :: ", 1)[1]
        for line in project["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", line)
    }
    assert allowed, f"requires-python {spec} allows no Python 3 release"
    assert allowed == classified, f"requires-python allows {sorted(allowed)}, the classifiers say {sorted(classified)}"
    assert classified == set(makefile_pythons()), "`make pythons` (the Makefile's PYTHONS) tests other Pythons"


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
    ci = pinned("ci.txt")
    for name, pin in pinned("pythons.txt").items():
        assert ci.get(name) == pin, f"requirements/pythons.txt pins {name}=={pin}, ci.txt {ci.get(name)}"


def test_changelog_has_a_dated_section_for_this_version():
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## \[([^\]]+)\](?: - (\S+))?$", changelog, re.MULTILINE)
    assert headings[0] == ("Unreleased", ""), "the first section is [Unreleased]"
    dated = {name: date for name, date in headings[1:]}
    assert version() in dated, f"CHANGELOG.md has no '## [{version()}] - YYYY-MM-DD' section"
    datetime.date.fromisoformat(dated[version()])
