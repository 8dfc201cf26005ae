"""The libraries' own test suites, from their sdists, under the real Accelerate and under x serving it.

    python ecosystem/peer_suites.py --out OUT_DIR [--suites peft,transformers] [--update-gaps]

Nothing of the libraries is kept in this repository: each suite's ``tests/`` comes from the sdist of
the version installed here (``pip download NAME==VERSION --no-binary :all: --no-deps``), run offline
on CPU by pytest twice, in fresh processes: once as it is (the real Accelerate), once with
``X_PROVIDE_ACCELERATE=1`` (x serving ``import accelerate``). The two JUnit reports are compared test
by test: every test that passes with Accelerate must pass with x, or be listed in ``peer_gaps.txt``
with its kind and reason; a listed test that now passes fails the run too, so the list only shrinks.

- **peft**: the files and classes ``peer/peft_subset.txt`` names (those that run offline here; the
  rest need models from the Hub), with ``peer/peft_conftest.py`` as ``tests/conftest.py`` so that a
  test needing the Hub fails at once instead of retrying.
- **transformers**: its common model tests (``ModelTesterMixin``) on a tiny Llama built from its
  config (``peer/test_x_tiny_llama.py``; the sdist ships the mixins but no model's tester), with empty
  stand-ins for the two mixins ``test_modeling_common.py`` imports from folders the sdist leaves out.

Both get an empty ``tests/__init__.py``: their tests import each other relatively, and neither sdist
has one.

Tests failing under both are not counted: they need the Hub or a GPU here.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
GAPS = HERE / "peer_gaps.txt"
KINDS = ("differs", "gap")


@dataclass(frozen=True)
class Suite:
    name: str  # the distribution
    args: tuple[str, ...]  # what pytest runs, relative to the extracted sdist

    def prepare(self, root: Path) -> None:
        tests = root / "tests"
        (tests / "__init__.py").write_text("")  # the tests import each other relatively; neither sdist has one
        if self.name == "peft":
            shutil.copy(HERE / "peer" / "peft_conftest.py", tests / "conftest.py")
        else:
            for folder, name in (("exporters", "ExportTesterMixin"), ("generation", "GenerationTesterMixin")):
                (tests / folder).mkdir(exist_ok=True)
                (tests / folder / "__init__.py").write_text("")
                stub = "test_export.py" if folder == "exporters" else "test_utils.py"
                (tests / folder / stub).write_text(f"class {name}:  # left out of the sdist\n    pass\n")
            shutil.copy(HERE / "peer" / "test_x_tiny_llama.py", tests / "test_x_tiny_llama.py")


def _peft_args() -> tuple[str, ...]:
    lines = (HERE / "peer" / "peft_subset.txt").read_text().splitlines()
    return tuple(line.strip() for line in lines if line.strip() and not line.startswith("#"))


SUITES = {
    "peft": Suite("peft", _peft_args()),
    "transformers": Suite("transformers", ("tests/test_x_tiny_llama.py",)),
}


def fetch(name: str, into: Path) -> Path:
    """The sdist of the installed ``name``, extracted; its folder."""
    version = importlib.metadata.version(name)
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            f"{name}=={version}",
            "--no-binary",
            ":all:",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-d",
            str(into),
        ],
        check=True,
    )
    archive = next(into.glob(f"{name}-{version}.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / f"{name}-{version}"


def run(suite: Suite, root: Path, side: str, out: Path) -> dict[str, str]:
    """pytest on one side; each test's outcome (passed, failed, skipped) by its id."""
    report = out / f"{suite.name}-{side}.xml"
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("X_PROVIDE", "ACCELERATE_"))}
    environ.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"})
    if side == "x":
        environ["X_PROVIDE_ACCELERATE"] = "1"
    started = time.monotonic()
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "-W",
        "ignore::DeprecationWarning",
    ]
    done = subprocess.run(
        [*argv, f"--junitxml={report}", *suite.args], cwd=root, env=environ, capture_output=True, text=True
    )
    print(f"{suite.name} on {side}: {time.monotonic() - started:.0f} s")
    if not report.is_file():
        raise SystemExit(f"pytest wrote no report for {suite.name} on {side}:\n{(done.stdout + done.stderr)[-3000:]}")
    outcomes: dict[str, str] = {}
    for case in ElementTree.parse(report).iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        outcomes[test] = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
    return outcomes


def read_gaps() -> dict[str, tuple[str, str]]:
    gaps: dict[str, tuple[str, str]] = {}
    for line in GAPS.read_text().splitlines() if GAPS.exists() else []:
        if line.strip() and not line.startswith("#"):
            test, kind, reason = (part.strip() for part in line.split("|", 2))
            assert kind in KINDS, f"{GAPS}: {test}: kind {kind!r} is not one of {KINDS}"
            gaps[test] = (kind, reason)
    return gaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--suites", default=",".join(SUITES))
    parser.add_argument("--update-gaps", action="store_true", help="rewrite peer_gaps.txt from this run")
    args = parser.parse_args()
    args.out = args.out.resolve()  # pytest runs inside each sdist's folder
    gaps = read_gaps()
    failures, rows, found = [], [], {}
    for name in args.suites.split(","):
        suite = SUITES[name]
        root = fetch(suite.name, args.out / "sdists")
        suite.prepare(root)
        theirs, ours = run(suite, root, "accelerate", args.out), run(suite, root, "x", args.out)
        passing = sorted(test for test, outcome in theirs.items() if outcome == "passed")
        missed = [test for test in passing if ours.get(test) != "passed"]
        found.update({f"{name}:{test}": ours.get(test, "absent") for test in missed})
        rows.append((name, len(theirs), len(passing), len(passing) - len(missed), len(missed)))
        for test in missed:
            if f"{name}:{test}" not in gaps:
                failures.append(
                    f"{name}: {test} passes with Accelerate, {ours.get(test, 'absent')} with x (not listed)"
                )
        for key in gaps:
            if key.startswith(f"{name}:") and ours.get(key.split(":", 1)[1]) == "passed":
                failures.append(f"{key} is listed in peer_gaps.txt but passes with x now: take its line out")
    print(f"{'suite':<14}{'tests':>7}{'pass with Accelerate':>22}{'pass with x':>13}{'listed':>8}")
    for name, total, passing, same, missed in rows:
        print(f"{name:<14}{total:>7}{passing:>22}{same:>13}{missed:>8}")
    if args.update_gaps:
        lines = [
            f"{key} | {gaps.get(key, ('gap', 'to explain'))[0]} | {gaps.get(key, ('gap', 'to explain'))[1]}"
            for key in sorted(found)
        ]
        header = [line for line in GAPS.read_text().splitlines() if line.startswith("#")] if GAPS.exists() else []
        GAPS.write_text("\n".join([*header, *lines]) + "\n")
        return
    if failures:
        print("\n".join(failures), file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
