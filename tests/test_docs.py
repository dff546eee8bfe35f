"""The documentation: it builds without a warning, every example in it runs, and it keeps up with the code.

``make docs`` builds the HTML site; here the same build runs into a temporary directory, and so does Sphinx's doctest
builder, which executes every ``testcode``/``doctest`` block of the pages (their examples train tiny models on CPU,
including a crash and a resume) and the ``>>>`` examples of the API reference.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SRC = ROOT / "src" / "lightning_midepoch"
PAGES = sorted(DOCS.glob("*.md"))
#: The pages that answer one question each: they open with it, in bold, and the shortest complete answer.
QUESTION_PAGES = (
    "quickstart",
    "how-it-works",
    "exactness",
    "preemption",
    "signals",
    "distributed",
    "data-pipelines",
    "inspect",
    "migrating",
    "upgrading",
    "errors",
    "warnings",
    "warnings-data",
    "warnings-training",
    "development",
    "guide",
)
#: The most lines a page of docs/ and the README may have: a page is read in a few minutes.
PAGE_LINES = 300
README_LINES = 100
BUILD_TIMEOUT_S = 300


def _sphinx(builder: str, out: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", builder, str(DOCS), str(out)]
    command += ["-d", str(out / ".doctrees")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, tuple[int, str, Path]]:
    """The HTML and the doctest builds, run side by side: builder -> (exit code, output, output directory)."""
    out = tmp_path_factory.mktemp("docs")
    processes = {builder: (_sphinx(builder, out / builder), out / builder) for builder in ("html", "doctest")}
    results = {}
    for builder, (process, directory) in processes.items():
        output, _ = process.communicate(timeout=BUILD_TIMEOUT_S)
        results[builder] = (process.returncode, output, directory)
    return results


def test_html_builds_without_warnings(builds):
    code, output, html = builds["html"]
    assert code == 0, output[-8000:]
    for page in PAGES:
        assert (html / f"{page.stem}.html").is_file(), page.name
    assert (html / "_images" / "timeline.png").is_file()


def test_links_to_torch_and_lightning_resolve_offline(builds):
    """The local inventories are used: API names link to the real pages of the PyTorch and Lightning docs."""
    _, _, html = builds["html"]
    quickstart = (html / "quickstart.html").read_text(encoding="utf-8")
    assert 'href="https://pytorch.org/docs/stable/data.html#torch.utils.data.DataLoader"' in quickstart
    assert (
        'href="https://lightning.ai/docs/pytorch/stable/api/lightning.pytorch.callbacks.ModelCheckpoint.html'
        '#lightning.pytorch.callbacks.ModelCheckpoint"' in quickstart
    )


def test_every_example_runs(builds):
    code, output, directory = builds["doctest"]
    assert code == 0, output[-8000:]
    summary = (directory / "output.txt").read_text(encoding="utf-8")
    assert "0 failures in tests" in summary, summary[-4000:]
    ran = int(re.search(r"^\s*(\d+) tests$", summary, re.MULTILINE).group(1))  # type: ignore[union-attr]
    assert ran >= 30, summary[-4000:]


# code blocks that are shown but not executed: shell commands and quoted messages only
_SHOWN_ONLY = {"bash", "console", "shell", "text"}
_FENCE = re.compile(r"^(`{3,}|~{3,})[ \t]*(\{[^}]+\}|[\w+-]*)(.*)$", re.MULTILINE)
# the deliberate exception: code that cannot run here (it needs GPUs, several nodes, ...) is a
# ```{code-block} python directive with the option `:class: not-run`, so that a reviewer sees the choice
_NOT_RUN = re.compile(r"\A\n(?::[\w-]+:.*\n)*?:class:[^\n]*\bnot-run\b")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_python_examples_are_executed(page):
    """Python on a page is only ever in a block the doctest builder runs, so that no example can rot."""
    text = page.read_text(encoding="utf-8")
    for match in _FENCE.finditer(text):
        info = match.group(2)
        if info in ("{code-block}", "{code}", "{sourcecode}"):
            after = text[match.end() :]
            assert _NOT_RUN.match(after), (
                f"{page.name}: use {{testcode}}, or mark code that cannot run `:class: not-run`"
            )
        elif info and not info.startswith("{"):
            assert info in _SHOWN_ONLY, f"{page.name}: a ```{info} block is not executed; use ```{{testcode}}"
    for line in text.splitlines():
        if line.lstrip().startswith(">>>"):
            # a doctest outside a {doctest} block is rendered but never run
            preceding = text[: text.index(line)]
            assert preceding.rfind("```{doctest}") > preceding.rfind("\n```\n"), f"{page.name}: {line}"


#: The widest line of code a page shows without a scroll bar (the theme's content column in a 1280 px wide window).
#: Lines of ```text and ```console wrap there instead (docs/_static/custom.css), but a message quoted in ```text is
#: wrapped to this width too, except the verbatim output of `inspect` on its page.
CODE_COLUMNS = 88
_CODE = {"", "python", "bash", "shell", "{testcode}", "{testoutput}", "{doctest}", "{code-block}"}
_BLOCK = re.compile(r"^(`{3,})[ \t]*(\{[^}]+\}|[\w+-]*)[^\n]*\n(.*?)^\1[ \t]*$", re.MULTILINE | re.DOTALL)


# upstream.md is the upstream series' page, whose text its own helper writes
@pytest.mark.parametrize("page", [page for page in PAGES if page.name != "upstream.md"], ids=lambda page: page.name)
def test_code_blocks_fit_the_page_without_scrolling(page):
    checked = _CODE if page.name == "inspect.md" else _CODE | {"text"}
    for match in _BLOCK.finditer(page.read_text(encoding="utf-8")):
        if match.group(2) in checked:
            for line in match.group(3).splitlines():
                assert len(line) <= CODE_COLUMNS, f"{page.name}: a code line of {len(line)} characters scrolls: {line}"


def _constant_parts(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [part.value for part in node.values if isinstance(part, ast.Constant) and isinstance(part.value, str)]
    return []


#: How the package's modules give a warning.
_WARN_CALLS = ("_compat.warn", "warn", "self.warn", "self.ctx.warn", "session.warn", "warnings.warn")


@functools.cache
def _modules() -> list[tuple[Path, ast.Module]]:
    """The package's modules, parsed once for the tests that read its messages."""
    return [(path, ast.parse(path.read_text(encoding="utf-8"))) for path in sorted(SRC.glob("*.py"))]


def _messages() -> list[tuple[str, list[str]]]:
    """The literal text of every exception and warning the package raises or gives, per call site."""
    found = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            call = None
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                # AttributeError from a __getattr__ is Python's attribute protocol, not a message of the package
                call = node.exc if ast.unparse(node.exc.func) != "AttributeError" else None
            elif isinstance(node, ast.Call) and ast.unparse(node.func) in _WARN_CALLS:
                call = node
            if call is not None and call.args:
                parts = _constant_parts(call.args[0])
                if parts:
                    found.append((f"{path.name}:{call.lineno}", parts))
    return found


def _normalized(text: str) -> str:
    return " ".join(text.split())


def test_every_error_and_warning_is_documented():
    """The docs quote each message the package can emit (errors and warnings pages), verbatim apart from the values."""
    docs = _normalized("\n".join(page.read_text(encoding="utf-8") for page in PAGES))
    messages = _messages()
    assert len(messages) >= 10
    for where, parts in messages:
        for part in parts:
            part = _normalized(part)
            if len(part) >= 12:  # the pieces between the values; short ones such as ", but " say nothing
                assert part in docs, f"{where}: no page of docs/ quotes {part!r}"


def test_readme_links_every_page_of_the_docs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = set(re.findall(r"\]\(([^)#]+)", readme))
    pages = {f"docs/{page.name}" for page in PAGES} - {"docs/index.md", "docs/changelog.md", "docs/guide.md"}
    assert pages <= links, sorted(pages - links)


_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCED = re.compile(r"^(`{3,}).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
_HEADING = re.compile(r"^(#{1,3}) (.+)$", re.MULTILINE)


def _prose(text: str) -> str:
    """The text outside fenced blocks and inline code, where links are links."""
    return re.sub(r"`[^`\n]*`", "", _FENCED.sub("", text))


def _anchors(page: Path) -> set[str]:
    """The anchors of a page's headings (levels 1 to 3: conf.py's myst_heading_anchors), made as MyST and GitHub do."""
    from myst_parser.slugs import github_slugify

    text = _FENCED.sub("", page.read_text(encoding="utf-8"))
    titles = [re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title) for _, title in _HEADING.findall(text)]
    return {github_slugify(title.replace("`", "")) for title in titles}


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES], ids=lambda page: page.name)
def test_every_internal_link_resolves(page):
    """Each relative link of the README and of the pages names a file that exists and, for a page, a heading in it.

    Sphinx checks the links between pages too (``make docs`` fails on a missing one); this also covers the README,
    which GitHub renders, in milliseconds."""
    for target in _LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not ours to check offline
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}: links to {target}, which does not exist"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked), f"{page.name}: links to {target}, a heading that {path} does not have"


def test_messages_name_pages_and_sections_that_exist():
    """A message that sends the user to the docs names a page by its title, and a section of it that exists."""
    titles = {page.read_text(encoding="utf-8").split("\n", 1)[0].removeprefix("# "): page for page in PAGES}
    strings = [
        node.value
        for _, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]
    named = [string for string in strings if "the docs' page" in string]
    assert len(named) >= 2
    for message in named:
        for title, section in re.findall(r"the docs' page '([^']+)'(?:, section '([^']+)')?", message):
            assert title in titles, f"a message names the page {title!r}, which no page of docs/ has as its title"
            text = _FENCED.sub("", titles[title].read_text(encoding="utf-8"))
            assert not section or f"## {section}\n" in text, f"{title!r} has no section {section!r}"


def test_every_shown_example_file_is_run():
    """A page that shows a file of docs/_examples (literalinclude) imports it in its testsetup, so that it runs."""
    shown = 0
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for name in re.findall(r"^```\{literalinclude\} _examples/(\w+)\.py$", text, re.MULTILINE):
            shown += 1
            setups = re.findall(r"^```\{testsetup\}[^\n]*\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
            assert any(re.search(rf"^from {name} import", setup, re.MULTILINE) for setup in setups), page.name
    assert shown == len(list((DOCS / "_examples").glob("*.py")))


def test_readme_and_every_page_are_short():
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines < README_LINES, f"README.md has {lines} lines: move the detail into a page of docs/"
    for page in PAGES:
        lines = len(page.read_text(encoding="utf-8").splitlines())
        assert lines < PAGE_LINES, f"{page.name} has {lines} lines: split it, one question per page"


@pytest.mark.parametrize("name", QUESTION_PAGES)
def test_each_page_opens_with_its_question_and_answer(name):
    """Under the title, the first paragraph starts with the page's question in bold and goes on with the answer."""
    text = (DOCS / f"{name}.md").read_text(encoding="utf-8")
    text = re.sub(r"\A---\n.*?\n---\n", "", text, flags=re.DOTALL)  # front matter
    title, _, rest = text.lstrip().partition("\n\n")
    assert title.startswith("# "), name
    paragraph = rest.split("\n\n", 1)[0]
    question = re.match(r"\*\*([^*]+\?)\*\*\s+(.+)", paragraph, re.DOTALL)
    assert question, f"{name}.md: the first paragraph is not **question?** answer"
    assert len(question.group(2).split()) >= 8, f"{name}.md: the question has no answer after it"


def _png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", header[16:24])


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_timeline_figure_is_generated_by_its_script(tmp_path):
    script = _load(DOCS / "_static" / "make_timeline.py")
    script.draw(tmp_path / "timeline.png")
    assert _png_size(tmp_path / "timeline.png") == _png_size(DOCS / "_static" / "timeline.png")


def _inventory_lines(data: bytes) -> list[str]:
    header_end = 0
    for _ in range(4):
        header_end = data.index(b"\n", header_end) + 1
    return zlib.decompress(data[header_end:]).decode().splitlines()


def test_inventories_are_generated_by_their_script():
    script = _load(DOCS / "_inventories" / "make_inventories.py")
    for filename, objects in (("torch.inv", script.TORCH), ("lightning.inv", script.LIGHTNING)):
        committed = _inventory_lines((DOCS / "_inventories" / filename).read_bytes())
        assert committed == _inventory_lines(script.inventory("", "", objects)), filename


def _exactness_rows() -> list[list[str]]:
    """The rows of every table of exactness.md that has the columns Setting, Exact, Checked by, Notes."""
    text = (DOCS / "exactness.md").read_text()
    tables = [table.split("\n\n", 1)[0] for table in text.split("| Setting | Exact |")[1:]]
    lines = [line for table in tables for line in table.splitlines()[2:]]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]


@functools.cache
def _test_functions() -> set[str]:
    """Every ``tests/<file>::<function>`` defined in the test suite."""
    found = set()
    for path in (ROOT / "tests").glob("test_*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                found.add(f"tests/{path.name}::{node.name}")
    return found


def test_every_claim_of_the_exactness_table_names_its_test():
    """Each "yes" row of the exactness tables names the test that checks it; each "no" or "partly" row names what a user
    sees (the warning, or why there is none); every test named exists."""
    defined = _test_functions()
    rows = _exactness_rows()
    assert len(rows) > 20
    for setting, exact, evidence, _ in rows:
        named = []
        for reference in re.findall(r"`(tests/test_\w+\.py)::(test_\w+)", evidence):
            named.append("::".join(reference))
        # a row may name further tests of the same file by their bare name
        file = named[0].split("::")[0] if named else None
        named += [f"{file}::{name}" for name in re.findall(r"`(test_\w+)", evidence) if file]
        assert all(name in defined for name in named), f"{setting}: names a test that does not exist: {named}"
        if exact in ("yes", "unchanged", "error", "every remaining sample once"):
            assert named or "every test above" in evidence, f"{setting}: a '{exact}' row names no test"
        else:
            assert exact in ("no", "partly"), f"{setting}: unknown verdict {exact!r}"
            assert "warning" in evidence, f"{setting}: a '{exact}' row names no warning"


def test_every_row_of_the_strategy_table_names_tests_that_exist():
    """The distributed page's table of strategies (and data libraries): a row that claims exactness names its tests."""
    text = (DOCS / "distributed.md").read_text()
    table = text[text.index("| Strategy / data library | Exact |") :].split("\n\n", 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in table.splitlines()[2:]]
    assert len(rows) >= 8
    defined = {name.split("::")[1] for name in _test_functions()}
    for setting, exact, evidence in rows:
        named = re.findall(r"`(?:tests/test_\w+\.py::)?(test_\w+)", evidence)
        assert set(named) <= defined, f"{setting}: names a test that does not exist: {named}"
        if exact.startswith(("yes", "every remaining sample once", "no")):
            assert named, f"{setting}: a '{exact}' row names no test"
        else:
            assert exact.startswith("expected"), f"{setting}: unknown verdict {exact!r}"


def test_the_state_table_is_written_from_the_schema():
    """The API page's table of the checkpoint state is the one the schema writes (``_schema.markdown_table``)."""
    from lightning_midepoch import _schema

    assert _schema.markdown_table() in (DOCS / "api.md").read_text(encoding="utf-8")
