"""tools/check_asserts.py (`make lint`) reports each kind of assertion that cannot fail, and passes real ones."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

CANNOT_FAIL = {
    "assert True": "the constant True",
    "assert 'always'": "the constant 'always'",
    "assert (resumed == full, 'message')": "non-empty tuple",
    "assert resumed.seen == resumed.seen": "compares resumed.seen with itself",
    "assert a < b == b": "compares b with itself",
    "assert torch.equal(torch.get_rng_state(), torch.get_rng_state())": "equal() compares torch.get_rng_state()",
    "assert np.array_equal(x, x)": "array_equal() compares x with itself",
    "assert not torch.allclose(w[0], w[0], atol=1)": "allclose() compares w[0] with itself",
    "assert all(states_equal(r, r) for r in runs)": "states_equal() compares r with itself",
    "assert math.isclose(x, x) and y": "isclose() compares x with itself",
    "torch.testing.assert_close(weights, weights)": "assert_close() compares weights with itself",
    "np.testing.assert_equal(a.b, a.b)": "assert_equal() compares a.b with itself",
}

CAN_FAIL = """
assert False, "unreachable"
assert ()
assert resumed.seen == full.seen[3:]
assert a < b == c
assert a == b == a
assert torch.equal(resumed.rng["torch"], full.rng["torch"])
assert np.array_equal(x, y)
assert not torch.allclose(w[0], w[1])
torch.testing.assert_close(weights, expected)
assert all(states_equal(r, full) for r in runs)
assert f"{x}" in text
equal(x, x)  # not an assertion: a plain call, no test
"""


def _tool() -> Any:
    spec = importlib.util.spec_from_file_location("check_asserts_tool", ROOT / "tools" / "check_asserts.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_assertion_that_cannot_fail_is_reported_with_its_line(tmp_path, capsys):
    tool = _tool()
    nested = tmp_path / "tests" / "unit"
    nested.mkdir(parents=True)
    source = "\n".join(f"def test_{i}():\n    {line}\n" for i, line in enumerate(CANNOT_FAIL))
    (nested / "test_bad.py").write_text(source)
    assert tool.main([str(tmp_path / "tests")]) == 1
    reported = capsys.readouterr().out.splitlines()
    assert len(reported) == len(CANNOT_FAIL)
    for i, ((line, why), report) in enumerate(zip(CANNOT_FAIL.items(), reported, strict=True)):
        assert report.startswith(f"{nested / 'test_bad.py'}:{3 * i + 2}: assertion cannot fail"), (line, report)
        assert why in report, (line, report)


def test_assertions_that_can_fail_pass(tmp_path, capsys):
    tool = _tool()
    (tmp_path / "test_good.py").write_text(textwrap.dedent(CAN_FAIL))
    assert tool.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out == ""
