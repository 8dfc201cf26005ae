"""The generator's two rewrites and the harness's records, on small scripts written here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # compat/ is a folder of scripts, not a package
import generate
import run

SCRIPT = """
from accelerate import Accelerator, no_such_name_in_x
from accelerate.utils import set_seed as seed
from accelerate.test_utils import RegressionModel

def check(value, flag=False):
    assert value != 2, "two is refused"

def helper():
    return 1

def main():
    x = helper()
    check(x)
    for flag in [True, False]:
        if flag or not flag:
            check(x, flag=flag)
    check(2)
    print("done")

if __name__ == "__main__":
    main()
"""


def test_sub_tests_are_wrapped_with_the_sources_of_their_arguments() -> None:
    text, found = generate.transform_script(SCRIPT, rename=None)
    assert found == ["check", "check", "check"]  # helper() is an assignment, print is not the script's
    assert "_compat_run(check, ('x',), x)" in text
    assert "_compat_run(check, ('x', 'flag'), x, flag=flag)" in text
    assert "x = helper()" in text and "main()" in text.splitlines()[-1]
    assert text.startswith("from x_compat_harness import Missing as _CompatMissing, run as _compat_run")


def test_imports_are_renamed_and_missing_names_stand_in() -> None:
    renamer = generate.Renamer("accelerate.test_utils.scripts")
    text, _ = generate.transform_script(SCRIPT, rename=renamer)
    assert "from x_runtime import Accelerator" in text
    assert "from x_runtime import set_seed as seed" in text
    assert "no_such_name_in_x = _CompatMissing('accelerate.no_such_name_in_x')" in text
    assert "from x_compat_test_utils import RegressionModel" in text
    assert "accelerate." not in text.replace("'accelerate.no_such_name_in_x'", "")
    assert renamer.missing == {"accelerate.no_such_name_in_x"}
    assert renamer.helper_names == {"RegressionModel"}


def test_the_harness_records_each_sub_test_and_stops_at_the_first_failure(tmp_path: Path) -> None:
    out = tmp_path / "gen"
    out.mkdir()
    text, _ = generate.transform_script(SCRIPT.replace("from accelerate", "# from accelerate"), rename=None)
    (out / "script.py").write_text(text)
    (out / "x_compat_harness.py").write_text(Path(generate.__file__).with_name("harness.py").read_text())
    results = tmp_path / "results"
    results.mkdir()
    environ = {**os.environ, "PYTHONPATH": str(out), "X_COMPAT_RESULTS": str(results)}
    done = subprocess.run([sys.executable, str(out / "script.py")], env=environ, capture_output=True, text=True)
    assert done.returncode == 3, done.stderr
    events = run.read_events(results)
    assert [(e["event"], e["id"]) for e in events] == [
        ("START", "check(x)"),
        ("PASS", "check(x)"),
        ("START", "check(x, flag=True)"),
        ("PASS", "check(x, flag=True)"),
        ("START", "check(x, flag=False)"),
        ("PASS", "check(x, flag=False)"),
        ("START", "check(2)"),
        ("FAIL", "check(2)"),
    ]
    assert events[-1]["detail"] == "AssertionError: two is refused"
    # A second launch skips what is decided and reaches the end of main().
    environ["X_COMPAT_SKIP"] = json.dumps([e["id"] for e in events])
    (results / "rank0.jsonl").unlink()
    again = subprocess.run([sys.executable, str(out / "script.py")], env=environ, capture_output=True, text=True)
    assert again.returncode == 0 and "done" in again.stdout
    assert run.read_events(results) == []


def test_known_gaps_match_by_script_mode_and_sub_test(tmp_path: Path) -> None:
    path = tmp_path / "gaps.txt"
    path.write_text("# comment\ntest_ops.py | * | test_gather(state) | not yet\ntest_sync.py | 1 | a() | why\n")
    gaps = run.known_gaps(path)
    assert run.is_known(gaps, "test_ops.py", "torchrun-2", "test_gather(state)")
    assert run.is_known(gaps, "test_sync.py", "1", "a()")
    assert not run.is_known(gaps, "test_sync.py", "torchrun-2", "a()")


def test_a_run_in_which_nothing_ran_fails(tmp_path: Path) -> None:
    # A script that cannot start (here: one that does not exist) passes nothing on Accelerate:
    # the run must fail rather than report "0 of 0" as a success.
    done = subprocess.run(
        [sys.executable, str(Path(run.__file__)), "--scripts", "no_such_script.py", "--modes", "1", "--out", "out"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "compat: Accelerate passed no sub-test in mode 1" in done.stdout
