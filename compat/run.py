"""Run Accelerate's own test scripts on Accelerate and on x, side by side, one sub-test at a time.

    python compat/run.py --out /tmp/compat                     # both, every script and mode
    python compat/run.py --impl x --scripts test_ops.py --modes 1

Modes: ``1`` (``python script.py``), ``launcher-2`` (``x-launch`` or ``accelerate launch``,
``--multi_gpu --num_processes 2``) and ``torchrun-2`` (plain ``torchrun --nproc-per-node 2``, the same
for both). ``test_notebook.py`` starts its own processes (``notebook_launcher``): it runs with plain
``python``, ``ACCELERATE_NUM_PROCESSES=2`` standing for its two-process mode.

Each launch records its sub-tests (``compat/harness.py``); after a failure or a hang the script is
launched again, skipping what is decided, so one broken sub-test does not hide the rest. The run
fails (exit 1) when a sub-test Accelerate passes does not pass on x; what Accelerate itself fails
here is shown in the table with its own error. ``--table`` writes the markdown table that
docs/compatibility.md records.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import generate  # the generator beside this file

MODES = ("1", "launcher-2", "torchrun-2")
IMPLS = ("accelerate", "x")
NOTEBOOK = "test_notebook.py"
LAUNCH_LIMIT_S = 900  # a whole launch; each sub-test has its own, shorter watchdog


@dataclass
class Outcome:
    status: str  # PASS or FAIL
    detail: str = ""


@dataclass
class Run:
    """What one script did in one mode under one implementation."""

    results: dict[str, Outcome] = field(default_factory=dict)  # sub-test -> outcome, in run order
    launches: int = 0
    seconds: float = 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(impl: str, mode: str, script: Path) -> tuple[list[str], dict[str, str], int] | None:
    """The command line, extra environment and number of recording ranks; None if not applicable."""
    if script.name == NOTEBOOK:
        if mode == "torchrun-2":
            return None  # notebook_launcher is its own launcher
        return [sys.executable, str(script)], {"ACCELERATE_NUM_PROCESSES": "1" if mode == "1" else "2"}, 1
    if mode == "1":
        return [sys.executable, str(script)], {}, 1
    port = str(free_port())
    # On a machine without GPUs Accelerate forms one world of CPU processes only when told to use
    # the CPU (otherwise each torchrun rank runs as a separate single process): both get the same.
    cpu = {"ACCELERATE_USE_CPU": "1"}
    if mode == "torchrun-2":
        return (
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc-per-node",
                "2",
                "--master-port",
                port,
                str(script),
            ],
            cpu,
            2,
        )
    launcher = (
        [shutil.which("x-launch") or "x-launch"]
        if impl == "x"
        else [shutil.which("accelerate") or "accelerate", "launch"]
    )
    # The same words for both launchers. Without a config file Accelerate runs "--num_processes 2"
    # (with or without --cpu) as ONE process on a machine without GPUs; --multi_gpu starts two.
    return [*launcher, "--multi_gpu", "--num_processes", "2", "--main_process_port", port, str(script)], cpu, 2


def clean_env(extra: dict[str, str], generated: Path) -> dict[str, str]:
    # Nothing from the caller's launcher settings may leak into a run.
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "X_", "FSDP_", "PJRT_"))}
    environ.update(extra)
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(generated), os.environ.get("PYTHONPATH", "")) if p)
    environ.setdefault("HF_DATASETS_OFFLINE", "1")
    return environ


def read_events(folder: Path) -> list[dict[str, str]]:
    events = []
    for path in sorted(folder.glob("rank*.jsonl")):
        events += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return events


def tail(path: Path, lines: int = 3) -> str:
    """The error a crashed launch printed: its last exception line, else its last lines."""
    text = [line for line in path.read_text(errors="replace").splitlines() if line.strip()] if path.exists() else []
    errors = [
        line
        for line in text
        if "ChildFailedError" not in line and re.match(r"^(\[rank\d+\]: )?[\w.]*(Error|Exception)\b", line.strip())
    ]
    return errors[-1].strip()[-300:] if errors else " | ".join(text[-lines:])[-300:]


def become_subreaper() -> None:
    """Adopt the processes a launch leaves behind, so that they can be found and ended."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def descendants() -> list[int]:
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    mine, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - mine
        mine |= frontier
    return sorted(mine)


def end_leftovers() -> int:
    """SIGKILL every process still below this one (launchers' workers start their own sessions)."""
    left = descendants()
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG) != (0, 0):
            pass
    return len(left)


def launch(cmd: list[str], environ: dict[str, str], cwd: Path, log: Path) -> int:
    with log.open("w") as out:
        process = subprocess.Popen(cmd, env=environ, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        try:
            code = process.wait(timeout=LAUNCH_LIMIT_S)
        except subprocess.TimeoutExpired:
            # Ask first, as a user's Ctrl-C would: launchers pass it on to their workers.
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            code = 124
        left = end_leftovers()
        if left:
            out.write(f"[compat] {left} processes were still running after the launch ended; killed\n")
        return code


def run_script(impl: str, mode: str, script: Path, work: Path, subtest_limit: float) -> Run | None:
    """Launch until every sub-test the script reaches is decided."""
    spec = command(impl, mode, script)
    if spec is None:
        return None
    cmd, extra, ranks = spec
    run = Run()
    started_at = time.monotonic()
    while run.launches < 60:
        run.launches += 1
        attempt = work / f"{impl}-{mode}-{script.stem}-{run.launches}"
        attempt.mkdir(parents=True)
        environ = clean_env(extra, script.parent)
        environ.update(
            X_COMPAT_RESULTS=str(attempt),
            X_COMPAT_SKIP=json.dumps(sorted(run.results)),
            X_COMPAT_TIMEOUT=str(subtest_limit),
        )
        code = launch(cmd, environ, attempt, attempt / "output.log")
        events = read_events(attempt)
        seen: dict[str, list[dict[str, str]]] = {}
        for event in events:
            seen.setdefault(event["id"], []).append(event)
        fresh = 0
        unfinished = []
        for subtest, evs in seen.items():
            fails = [e for e in evs if e["event"] == "FAIL"]
            passes = {e["rank"] for e in evs if e["event"] == "PASS"}
            if fails:
                run.results[subtest] = Outcome("FAIL", f"rank {fails[0]['rank']}: {fails[0]['detail']}")
                fresh += 1
            elif len(passes) == ranks:
                run.results[subtest] = Outcome("PASS", evs[-1]["detail"])
                fresh += 1
            else:
                unfinished.append(subtest)
        if code == 0 and not unfinished:
            break
        if code != 0 and not any(e["event"] == "FAIL" for e in events):
            # Nothing failed by itself: the process ended (or hung) around what was running.
            why = "hung past the launch limit" if code == 124 else f"process ended with {code}"
            for subtest in unfinished:
                run.results[subtest] = Outcome("FAIL", f"{why}: {tail(attempt / 'output.log')}")
                fresh += 1
            if not unfinished:
                run.results["(script start or end)"] = Outcome("FAIL", f"{why}: {tail(attempt / 'output.log')}")
                break
        elif code == 0:
            for subtest in unfinished:
                run.results[subtest] = Outcome("FAIL", "not finished on every rank")
            break
        if not fresh:
            break
    run.seconds = time.monotonic() - started_at
    return run


def table(results: dict[tuple[str, str, str], Run | None], scripts: list[str], modes: list[str]) -> str:
    """Markdown: one row per sub-test, one column per mode with Accelerate's and x's result."""

    def cell(run: Run | None, subtest: str) -> str:
        if run is None:
            return "n/a"
        outcome = run.results.get(subtest)
        return "-" if outcome is None else ("pass" if outcome.status == "PASS" else "FAIL")

    lines = ["| script | sub-test | " + " | ".join(f"{m}: Accelerate / x" for m in modes) + " |"]
    lines.append("|---|---|" + "---|" * len(modes))
    notes = []
    for script in scripts:
        order: list[str] = []
        for impl in IMPLS:
            for mode in modes:
                run = results.get((impl, mode, script))
                order += [s for s in (run.results if run else {}) if s not in order]
        for subtest in order:
            cells = []
            for mode in modes:
                a, x = results.get(("accelerate", mode, script)), results.get(("x", mode, script))
                cells.append(f"{cell(a, subtest)} / {cell(x, subtest)}")
                for impl, run in (("Accelerate", a), ("x", x)):
                    outcome = run.results.get(subtest) if run else None
                    if outcome and outcome.status == "FAIL":
                        notes.append(f"- {script} `{subtest}` ({mode}, {impl}): {outcome.detail}")
            lines.append(f"| {script} | `{subtest}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\nFailures, with the error each raised:\n\n" + "\n".join(notes) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", choices=(*IMPLS, "both"), default="both")
    parser.add_argument("--scripts", nargs="+", default=list(generate.SCRIPTS))
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument(
        "--subtest-timeout",
        type=float,
        default=60.0,
        help="seconds before a sub-test counts as hung (the slowest passes in 5 s here)",
    )
    parser.add_argument("--out", type=Path, default=None, help="keep generated scripts and logs here")
    parser.add_argument("--table", type=Path, default=None, help="write the markdown table here")
    parser.add_argument(
        "--known-gaps",
        type=Path,
        default=Path(__file__).with_name("known_gaps.txt"),
        help="sub-tests x is known to fail where Accelerate passes: reported, not failing the run",
    )
    args = parser.parse_args()
    # Absolute: each launch runs in its own folder, and names the generated script from there.
    out = (args.out or Path(tempfile.mkdtemp(prefix="x-compat-"))).resolve()
    become_subreaper()
    impls = IMPLS if args.impl == "both" else (args.impl,)
    results: dict[tuple[str, str, str], Run | None] = {}
    for impl in impls:
        generated = out / f"generated-{impl}"
        generate.generate(impl, generated)
        for script in args.scripts:
            for mode in args.modes:
                run = run_script(impl, mode, generated / script, out / "runs", args.subtest_timeout)
                results[(impl, mode, script)] = run
                if run is not None:
                    counts = {s: sum(o.status == s for o in run.results.values()) for s in ("PASS", "FAIL")}
                    print(
                        f"{impl:10} {mode:10} {script:32} {counts['PASS']:3} pass {counts['FAIL']:3} fail"
                        f"  ({run.launches} launches, {run.seconds:.0f} s)",
                        flush=True,
                    )
    text = table(results, args.scripts, args.modes)
    if args.table:
        args.table.write_text(text)
    (out / "table.md").write_text(text)
    (out / "results.json").write_text(
        json.dumps(
            {"|".join(k): v.results if v else None for k, v in results.items()}, default=lambda o: o.__dict__, indent=1
        )
    )
    if len(impls) < 2:
        print(f"compat: results in {out}")
        return 0
    regressions, matched = [], 0
    for (impl, mode, script), run in results.items():
        if impl != "accelerate" or run is None:
            continue
        mine = results.get(("x", mode, script))
        for subtest, outcome in run.results.items():
            if outcome.status != "PASS":
                continue
            theirs = mine.results.get(subtest) if mine else None
            if theirs is not None and theirs.status == "PASS":
                matched += 1
                continue
            if theirs is None:  # x never got to it: say what stopped the script instead
                start = mine.results.get("(script start or end)") if mine else None
                theirs = Outcome("FAIL", f"not reached ({start.detail})" if start else "not reached")
            regressions.append((script, mode, subtest, theirs.detail))
    gaps = known_gaps(args.known_gaps)
    known = [r for r in regressions if is_known(gaps, *r[:3])]
    new = [r for r in regressions if not is_known(gaps, *r[:3])]
    for script, mode, subtest, detail in known:
        print(f"compat: known gap ({gaps[_gap_key(gaps, script, mode, subtest)]}): {script} {mode} {subtest}: {detail}")
    for script, mode, subtest, detail in new:
        print(f"compat: x fails where Accelerate passes: {script} {mode} {subtest}: {detail}")
    closed = sorted({k for k in gaps if not any(_matches(k, *r[:3]) for r in regressions)})
    for key in closed:
        print(f"compat: {' | '.join(key)} now passes (or no longer runs): take it out of {args.known_gaps.name}")
    # A harness that ran nothing must not pass: every mode has sub-tests Accelerate passes here.
    silent = [
        m
        for m in args.modes
        if not any(
            o.status == "PASS"
            for (impl, mode, _), run in results.items()
            if impl == "accelerate" and mode == m and run is not None
            for o in run.results.values()
        )
    ]
    for mode in silent:
        print(f"compat: Accelerate passed no sub-test in mode {mode}: the scripts did not run (see {out / 'runs'})")
    print(f"compat: table in {out / 'table.md'}")
    print(
        f"compat: {matched} of {matched + len(regressions)} sub-tests Accelerate passes here pass on x; {len(known)} known gaps, {len(new)} new failures"
    )
    return 1 if new or silent else 0


GapKey = tuple[str, str, str]


def known_gaps(path: Path) -> dict[GapKey, str]:
    """``script | mode | sub-test | why`` lines (mode ``*``: every mode); ``#`` starts a comment."""
    gaps: dict[GapKey, str] = {}
    if not path.exists():
        return gaps
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = [p.strip() for p in line.split(" | ")]
        if len(parts) != 4:
            raise SystemExit(f"{path}:{number}: expected 'script | mode | sub-test | why', got {line!r}")
        gaps[(parts[0], parts[1], parts[2])] = parts[3]
    return gaps


def _matches(key: GapKey, script: str, mode: str, subtest: str) -> bool:
    return key[0] == script and key[1] in ("*", mode) and key[2] == subtest


def _gap_key(gaps: dict[GapKey, str], script: str, mode: str, subtest: str) -> GapKey:
    return next(k for k in gaps if _matches(k, script, mode, subtest))


def is_known(gaps: dict[GapKey, str], script: str, mode: str, subtest: str) -> bool:
    return any(_matches(k, script, mode, subtest) for k in gaps)


if __name__ == "__main__":
    raise SystemExit(main())
