"""The release artifacts as a packager and a user get them (``make dist-check``, after ``make dist``).

The sdist carries exactly the project's source files (tests, docs, examples, benchmarks, requirements, Makefile) and
nothing else: no virtual environment, build output, cache or checkpoint other than the committed legacy fixtures.
Then the wheel, and a wheel that pip builds from the sdist, are each installed into one fresh virtual environment
(torch first, alone, pinned as in CI; Lightning from its local wheel; everything pinned as in CI) and used there from
a directory outside the source tree, without PYTHONPATH: the package imports from the environment's site-packages,
``lightning-midepoch --help`` runs, a real crash-and-resume is exact with ``lightning`` and with
``pytorch_lightning``, and every extra the README names installs and imports. Between the two, the package and both
Lightning distributions are uninstalled, so that each artifact brings them in itself.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from project import ROOT, pinned, pyproject, readme_extras, version

HERE = Path(__file__).resolve().parent
NAME = "lightning_midepoch"
# tracked files that are for the repository only, not for the sdist
REPOSITORY_ONLY = re.compile(r"^(\.github/|\.ci/|\.gitignore$)")
# what setuptools writes into every sdist
GENERATED = re.compile(rf"^(PKG-INFO|setup\.cfg|src/{NAME}\.egg-info/[^/]+)$")
FORBIDDEN = re.compile(
    r"(^|/)(\.venv[^/]*|build|dist|__pycache__|\.pytest_cache|\.mypy_cache|\.ruff_cache|\.hypothesis|\.git"
    r"|lightning_logs|demo-output|_build)(/|$)|\.py[cod]$|\.coverage|\.ckpt$"
)
LEGACY_CHECKPOINT = re.compile(r"^tests/legacy/checkpoints/[^/]+\.ckpt$")
TIMEOUT_S = 600
TORCH_VERSION = "import torch; print(torch.__version__)"
# run from the unpacked sdist against the installed package: a quick part of the suite (unit tests)
SDIST_TESTS = ("tests/test_rng.py", "tests/test_order.py")


def _artifact(dist_dir: Path, suffix: str) -> Path:
    found = sorted(dist_dir.glob(f"{NAME}-{version()}{suffix}"))
    assert len(found) == 1, f"{dist_dir}: expected one {NAME}-{version()}{suffix}, found {[p.name for p in found]}"
    return found[0]


def _sources() -> set[str]:
    """The project's files: tracked, or new and not ignored (git's view of the source tree)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert listed.returncode == 0, f"`make dist-check` runs in a git checkout: {listed.stderr}"
    return {path for path in listed.stdout.split("\0") if path and (ROOT / path).is_file()}


def _sdist_members(sdist: Path) -> dict[str, bytes]:
    prefix = f"{NAME}-{version()}/"
    with tarfile.open(sdist) as archive:
        members = [member for member in archive.getmembers() if member.isfile()]
        assert all(member.name.startswith(prefix) for member in members), f"{sdist.name}: not all under {prefix}"
        return {member.name[len(prefix) :]: archive.extractfile(member).read() for member in members}  # type: ignore[union-attr]


def test_sdist_carries_every_source_file_as_in_the_checkout(dist_dir):
    members = _sdist_members(_artifact(dist_dir, ".tar.gz"))
    wanted = {path for path in _sources() if not REPOSITORY_ONLY.match(path)}
    for key in ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "Makefile", "tests/conftest.py"):
        assert key in wanted, key  # the checkout itself is what it should be
    assert any(LEGACY_CHECKPOINT.match(path) for path in wanted)
    assert any(path.startswith("docs/") and path.endswith(".md") for path in wanted)
    missing = sorted(wanted - set(members))
    assert not missing, f"the sdist lacks {missing}"
    stale = sorted(path for path in wanted if members[path] != (ROOT / path).read_bytes())
    assert not stale, f"the sdist's copies differ from the checkout (rebuild with `make dist`): {stale}"


def test_sdist_carries_nothing_else(dist_dir):
    members = set(_sdist_members(_artifact(dist_dir, ".tar.gz")))
    forbidden = sorted(p for p in members if FORBIDDEN.search(p) and not LEGACY_CHECKPOINT.match(p))
    assert not forbidden, f"the sdist carries {forbidden}"
    unexpected = sorted(p for p in members - _sources() if not GENERATED.match(p))
    assert not unexpected, f"the sdist carries files that are not the project's sources: {unexpected}"


def test_wheel_holds_the_package_and_its_metadata(dist_dir):
    wheel = _artifact(dist_dir, "-py3-none-any.whl")
    project = pyproject()["project"]
    info = f"{NAME}-{version()}.dist-info"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        fields = HeaderParser().parsestr(archive.read(f"{info}/METADATA").decode())
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    package = {path.removeprefix("src/") for path in _sources() if path.startswith(f"src/{NAME}/")}
    assert package <= names, f"the wheel lacks {sorted(package - names)}"
    assert f"{NAME}/py.typed" in package
    others = sorted(n for n in names - package if not n.startswith(f"{info}/"))
    assert not others, f"the wheel carries files outside the package: {others}"
    assert f"{info}/licenses/LICENSE" in names
    assert (fields["Name"], fields["Version"]) == ("lightning-midepoch", version())
    assert SpecifierSet(fields["Requires-Python"]) == SpecifierSet(project["requires-python"])
    assert fields["License-Expression"] == project["license"]
    assert set(fields.get_all("Provides-Extra")) == set(project["optional-dependencies"]) == readme_extras()
    assert "lightning-midepoch = lightning_midepoch.__main__:main" in entry_points


# -- installed into a fresh virtual environment --------------------------------------------------------------------


class Venv:
    """A fresh virtual environment, and commands run in it from a directory outside the source tree."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.torch_version = ""
        self.bin = root / "bin"
        self.python = self.bin / "python"
        self.workdir = root.parent / "work"  # the current directory of every command: outside the source tree
        self.workdir.mkdir()
        self.runs = root.parent / "runs"  # where the training runs write (not the current directory: no `lightning/`)
        self.constraints = root.parent / "constraints.txt"
        self.env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONSAFEPATH")
            and not key.startswith(("COV_CORE_", "MIDEPOCH_"))
        }
        self.env["PATH"] = f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}"
        self.env["PYTHONNOUSERSITE"] = "1"

    def run(self, *command: str | Path, cwd: Path | None = None, check: bool = True, stdout_only: bool = False) -> str:
        done = subprocess.run(
            [str(part) for part in command],
            cwd=cwd or self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        output = done.stdout + done.stderr
        if check:
            assert done.returncode == 0, f"{' '.join(map(str, command))} exited {done.returncode}:\n{output[-6000:]}"
        if stdout_only:
            return done.stdout
        return output if check else f"exit {done.returncode}\n{output}"

    def script(self, name: str) -> Path:
        """A copy of tests/packaging/NAME in the working directory: run as a script, its folder is on sys.path."""
        copy = self.workdir / name
        copy.write_bytes((HERE / name).read_bytes())
        return copy

    def pip(self, *args: str | Path) -> str:
        return self.run(self.python, "-m", "pip", "--disable-pip-version-check", *args)

    def install(self, *args: str | Path) -> str:
        return self.pip("install", "--quiet", "-c", self.constraints, *args)

    def finds(self, module: str) -> bool:
        code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
        return self.run(self.python, "-I", "-c", code, check=False).startswith("exit 0")  # -I: not from the cwd


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Venv:
    base = tmp_path_factory.mktemp("fresh")
    assert not base.is_relative_to(ROOT), f"{base} is inside the source tree"
    env = Venv(base / "venv")
    subprocess.run([sys.executable, "-m", "venv", str(env.root)], check=True, timeout=TIMEOUT_S)
    # torch first, alone, as CI pins it; then nothing may replace it, and the rest is pinned as in CI
    env.pip("install", "--quiet", "-r", ROOT / "requirements" / "torch-ci.txt")
    torch_version = env.run(env.python, "-c", TORCH_VERSION, stdout_only=True).strip()
    pins = {name: pin for name, pin in pinned("ci.txt").items() if name != "torch"}
    lines = [f"torch=={torch_version}"] + [f"{name}=={pin}" for name, pin in sorted(pins.items())]
    env.constraints.write_text("\n".join(lines) + "\n", encoding="utf-8")
    env.torch_version = torch_version
    return env


def _install_and_use(venv: Venv, wheel: Path, tag: str) -> None:
    """Install WHEEL with each extra in turn, and use it; the package and Lightning are uninstalled first."""
    venv.pip("uninstall", "--yes", "lightning-midepoch", "lightning", "pytorch-lightning")
    for module in (NAME, "lightning", "pytorch_lightning"):
        assert not venv.finds(module), f"{module} is still installed"

    # [pytorch-lightning] first: the standalone package does not bring `lightning` (which requires it)
    venv.install(f"{wheel}[pytorch-lightning]")
    where = venv.run(venv.python, "-c", f"import {NAME}; print({NAME}.__file__, {NAME}.__version__)", stdout_only=True)
    where = where.split()
    site_packages = venv.root / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    assert Path(where[0]).is_relative_to(site_packages), f"{NAME} was imported from {where[0]}, not {site_packages}"
    assert where[1] == version()
    assert venv.finds("pytorch_lightning"), "[pytorch-lightning] did not install pytorch_lightning"
    assert not venv.finds("lightning"), "[pytorch-lightning] installed lightning too"
    usage = venv.run(venv.bin / "lightning-midepoch", "--help")
    assert usage.startswith("usage: lightning-midepoch"), usage
    assert "inspect" in usage, usage
    assert venv.run(venv.bin / "lightning-midepoch", "--version", stdout_only=True).split() == [
        "lightning-midepoch",
        version(),
    ]
    resumed = venv.run(
        venv.python, venv.script("resume_check.py"), "pytorch_lightning", venv.runs / tag / "pytorch_lightning"
    )
    assert f"from {site_packages}" in resumed, resumed
    assert "ok: resumed with MidEpochResume: final weights bitwise equal to uninterrupted" in resumed, resumed

    venv.install(f"{wheel}[lightning]")
    assert venv.finds("lightning"), "[lightning] did not install lightning"
    resumed = venv.run(venv.python, venv.script("resume_check.py"), "lightning.pytorch", venv.runs / tag / "lightning")
    assert "ok: resumed with MidEpochResume: final weights bitwise equal to uninterrupted" in resumed, resumed

    extras = sorted(readme_extras())
    venv.install(f"{wheel}[{','.join(extras)}]")
    checked = venv.run(venv.python, venv.script("extras_check.py"), *extras)
    assert all(f"ok: [{extra}]" in checked for extra in extras), checked
    installed = venv.run(venv.python, "-c", TORCH_VERSION, stdout_only=True).strip()
    assert installed == venv.torch_version, f"torch {venv.torch_version} was replaced by {installed}"


def test_the_wheel_installs_and_works(dist_dir, venv):
    _install_and_use(venv, _artifact(dist_dir, "-py3-none-any.whl"), "wheel")


def test_a_wheel_built_from_the_sdist_installs_and_works(dist_dir, venv, tmp_path):
    sdist = _artifact(dist_dir, ".tar.gz")
    # as pip does for `pip install lightning-midepoch` from an sdist: an isolated build with the pinned backend
    venv.pip("wheel", "--quiet", "--no-deps", "--wheel-dir", tmp_path / "wheels", sdist)
    (wheel,) = (tmp_path / "wheels").glob(f"{NAME}-{version()}-py3-none-any.whl")
    _install_and_use(venv, wheel, "from-sdist")

    # the sdist's own tests run from it, against the installed package
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    unpacked = tmp_path / "unpacked" / f"{NAME}-{version()}"
    where = venv.run(venv.python, "-c", f"import {NAME}; print({NAME}.__file__)", cwd=unpacked, stdout_only=True)
    assert not Path(where.strip()).is_relative_to(unpacked), f"{NAME} was imported from the unpacked sdist"
    ran = venv.run(venv.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SDIST_TESTS, cwd=unpacked)
    summary = ran.strip().splitlines()[-1]
    assert re.match(r"\d+ passed", summary), ran[-3000:]
    assert "failed" not in summary, ran[-3000:]
