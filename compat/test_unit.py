"""compat/unit.py's rewrite, report reading and verdict, on small inputs written here."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # compat/ is a folder of scripts, not a package
import unit

SOURCE = """\
import unittest
from accelerate import Accelerator, no_such_name_in_x
from accelerate.hooks import ModelHook, attach_execution_device_hook as Align
from accelerate.test_utils import require_cpu


class T(unittest.TestCase):
    def test_uses_x(self):
        assert Accelerator(cpu=True).num_processes == 1 and ModelHook().no_grad is False

    def test_uses_a_missing_name(self):
        Align(execution_device="cpu")

    @require_cpu
    def test_scaffolding_stays(self):
        assert no_such_name_in_x is not None
"""


def test_x_side_imports_from_x_and_names_x_lacks_become_stand_ins() -> None:
    text, missing = unit.to_x(SOURCE, "test_t.py")
    assert missing == ["accelerate.hooks.attach_execution_device_hook", "accelerate.no_such_name_in_x"]
    assert "from x_runtime import Accelerator\n" in text and "from x_bigmodel import ModelHook\n" in text
    assert "Align = x_compat_missing.Missing('accelerate.hooks.attach_execution_device_hook')\n" in text
    assert "no_such_name_in_x = x_compat_missing.Missing('accelerate.no_such_name_in_x')\n" in text
    assert "from accelerate.test_utils import require_cpu\n" in text  # Accelerate's scaffolding stays
    assert "from accelerate import" not in text and "from accelerate.hooks" not in text


def test_a_stand_in_fails_only_where_it_is_used(tmp_path: Path) -> None:
    (tmp_path / f"{unit.MISSING_MODULE}.py").write_text(unit.MISSING_HELPER)
    (tmp_path / "test_t.py").write_text(unit.to_x(SOURCE, "test_t.py")[0])
    report = tmp_path / "junit.xml"
    pytest_args = ["test_t.py", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--junitxml", str(report)]
    subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_args],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""},
        check=False,
        capture_output=True,
    )
    outcomes = unit.parse_junit(report)
    assert outcomes["test_t.py::T::test_uses_x"].status == "passed"
    missing = outcomes["test_t.py::T::test_uses_a_missing_name"]
    assert missing.status == "failed" and "x has no accelerate.hooks.attach_execution_device_hook" in missing.message
    # A stand-in compared, not used, still runs: only a call or an attribute fails.
    assert outcomes["test_t.py::T::test_scaffolding_stays"].status == "passed"


def test_the_verdict_needs_every_failure_listed_and_no_stale_line() -> None:
    passed, failed = unit.Outcome("passed"), unit.Outcome("failed", "x has no accelerate.utils.foo")
    theirs = {"a.py::t1": passed, "a.py::t2": passed, "a.py::t3": passed, "a.py::t4": unit.Outcome("failed")}
    ours = {"a.py::t1": passed, "a.py::t2": failed, "a.py::t3": failed, "a.py::t4": failed}
    gaps = {"a.py::t2": ("gap", "missing name: accelerate.utils.foo")}
    unlisted, stale, table = unit.compare(theirs, ours, gaps)
    assert unlisted == ["a.py::t3: x has no accelerate.utils.foo"] and stale == []
    assert table["a.py"] == {"accelerate": 3, "x": 1, "gap": 1}
    listed = {**gaps, "a.py::t4": ("private", "r")}
    unlisted, stale, _ = unit.compare(theirs, {**ours, "a.py::t2": passed}, listed)
    assert stale == ["a.py::t2: listed as gap, but x passes it now: take its line out"]
    # Accelerate failing a listed test (its own test unsteady here) is said, and fails nothing.
    assert unit.unsettled(theirs, listed) == [
        "a.py::t4: listed, but Accelerate does not pass it here (failed); take the line out if it stays so"
    ]


def test_a_gaps_line_of_an_unknown_kind_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "gaps.txt"
    path.write_text(textwrap.dedent("# header\na.py::t | private | asserts _models\nb.py::t | maybe | ?\n"))
    with pytest.raises(SystemExit, match=r"b\.py::t: kind 'maybe' is not one of private, differs, gap"):
        unit.read_gaps(path)


def test_a_relative_out_folder_still_finds_its_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As nox runs it: a relative folder inside a checkout whose own pytest settings must not apply."""
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\nxfail_strict = true\n")
    side = tmp_path / ".nox" / "side"
    side.mkdir(parents=True)
    tests = "import pytest\n\ndef test_one():\n    pass\n\n@pytest.mark.xfail\ndef test_two():\n    pass\n"
    (side / "test_one.py").write_text(tests)
    monkeypatch.chdir(tmp_path)
    outcomes = unit.run_side(Path(".nox/side"), ("test_one.py",), timeout=120)
    statuses = {name: outcome.status for name, outcome in outcomes.items()}
    assert statuses == {"test_one.py::test_one": "passed", "test_one.py::test_two": "passed"}  # xpass, not strict


def test_an_unsteady_line_neither_fails_nor_goes_stale() -> None:
    passed, failed = unit.Outcome("passed"), unit.Outcome("failed", "assert 22261 <= (22045 + 50)")
    gaps = {"a.py::t": ("unsteady", "measures the machine's free RAM")}
    for mine, counted in ((passed, "x"), (failed, "unsteady")):
        unlisted, stale, table = unit.compare({"a.py::t": passed}, {"a.py::t": mine}, gaps)
        assert (unlisted, stale) == ([], [])
        assert table["a.py"] == {"accelerate": 1, counted: 1}
