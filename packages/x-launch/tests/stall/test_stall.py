"""x-launch's stall watchdog without x_runtime: its settings, a real stuck process, the summary's parts.

The runtime's half (the Accelerator keeping the record) and jobs of several ranks are tested in
``integration-tests/test_stall.py``; here a plain script keeps the record with x_common's writer,
as the runtime does, so x-launch's side runs alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from x_common import env
from x_common.progress_record import Phase, Snapshot
from x_launch.stall.report import out_of_step, stragglers
from x_launch.stall.stacks import Frame, is_library, parse_dump, waits_in_collective, where
from x_launch.stall.watch import EXIT_CODE

LAUNCHER = str(Path(sys.executable).with_name("x-launch"))

# What the runtime does under x-launch (x_runtime.process.progress), then a rank stuck in a sleep.
STUCK = textwrap.dedent(
    """
    import faulthandler, os, signal, time
    from x_common import env
    from x_common.progress_record import Phase, RecordWriter, record_path, stacks_path

    folder = env.PROGRESS_DIR.read()
    print("progress folder:", folder, flush=True)
    if folder is not None:
        number = int(signal.SIGRTMIN) + 6
        record = RecordWriter(record_path(folder, 0), rank=0, dump_signal=number)
        stacks = open(stacks_path(folder, 0), "w")
        faulthandler.register(number, file=stacks, all_threads=True)
        record.enter(Phase.BACKWARD); record.leave(); record.step_done()
        if os.environ.get("STUCK_IN") == "barrier":
            record.enter(Phase.BARRIER)
    time.sleep(float(os.environ.get("STUCK_FOR", "600")))  # stuck here
    """
)


def _run(tmp_path: Path, *flags: str, environ: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "stuck.py").write_text(STUCK)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(env.PREFIX)}
    return subprocess.run(
        [LAUNCHER, *flags, "stuck.py"],
        cwd=tmp_path,
        env={**clean, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg"), **(environ or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (("--stall-timeout", "-3"), "Error: --stall_timeout: '-3' is not valid: expected an integer >= 0"),
        (("--stall-timeout", "soon"), "Error: --stall_timeout: 'soon' is not valid: expected an integer >= 0"),
        (("--stall-action", "kill"), "Error: --stall_action: 'kill' is not valid: expected one of stop, report"),
    ],
)
def test_bad_stall_settings_are_one_line_and_exit_2(tmp_path: Path, flags: tuple[str, ...], error: str) -> None:
    out = _run(tmp_path, *flags)
    assert out.returncode == 2
    assert out.stderr.splitlines() == [error]


def test_the_settings_come_from_the_config_file_and_the_launch_variable(tmp_path: Path) -> None:
    config = tmp_path / "job.yaml"
    config.write_text("stall_timeout: 60\nstall_action: report\n")
    shown = _run(tmp_path, "--config_file", str(config), "--dry-run").stdout
    assert f"  stall_timeout: 60  [config file {config}]" in shown
    assert f"  stall_action: report  [config file {config}]" in shown
    shown = _run(tmp_path, "--config_file", str(config), "--dry-run", environ={"X_LAUNCH_STALL_TIMEOUT": "0"}).stdout
    assert "  stall_timeout: 0  [X_LAUNCH_STALL_TIMEOUT]" in shown
    assert "  stall_timeout: 900  [default]" in _run(tmp_path, "--dry-run").stdout


def test_a_stuck_process_is_shown_with_its_line_its_stacks_kept_and_the_job_stopped(tmp_path: Path) -> None:
    # one process: no --log_dir (torchrun's), a folder it names
    out = _run(tmp_path, "--stall-timeout", "1", environ={"STUCK_IN": "barrier"})
    assert out.returncode == EXIT_CODE, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("x-launch: ")]
    line = STUCK.splitlines().index('time.sleep(float(os.environ.get("STUCK_FOR", "600")))  # stuck here') + 1
    assert lines[0] == "x-launch: stalled: no rank made progress for 1 s (--stall-timeout 1)"
    assert lines[1].startswith("x-launch: rank 0 ") and f"stuck.py:{line}" in lines[1], lines
    folder = Path(lines[2].removeprefix("x-launch: every rank's Python stack (all threads): "))
    assert folder.parent == Path(tempfile.gettempdir()) and folder.name.startswith("x-stall-")
    kept = (folder / "rank-0.txt").read_text()
    shutil.rmtree(folder)
    assert f'File "{tmp_path / "stuck.py"}", line {line} in <module>' in kept
    assert lines[3] == "x-launch: stopping the job (exit code 124); --stall-action report keeps it running"
    progress = out.stdout.split("progress folder: ", 1)[1].split()[0]
    assert progress.endswith("-progress") and not Path(progress).exists()  # removed with the launch


def test_a_process_busy_in_its_own_code_is_reported_and_left_running(tmp_path: Path) -> None:
    """No rank in a collective: nobody waits for anybody, so the job may be slow, not hung."""
    out = _run(tmp_path, "--stall-timeout", "1", environ={"STUCK_FOR": "4"})
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("x-launch: ")]
    line = STUCK.splitlines().index('time.sleep(float(os.environ.get("STUCK_FOR", "600")))  # stuck here') + 1
    assert lines[0] == "x-launch: stalled: no rank made progress for 1 s (--stall-timeout 1)"
    assert lines[1].startswith(
        f"x-launch: rank 0 is not in a collective: at stuck.py:{line} in <module>: "
        'time.sleep(float(os.environ.get("STUCK_FOR", "600"))) (after 1 step;'
    ), lines
    assert lines[3].startswith("x-launch: not stopping the job: no rank waits in a collective"), lines
    assert out.stderr.count("x-launch: stalled:") == 1
    shutil.rmtree(lines[2].removeprefix("x-launch: every rank's Python stack (all threads): "))


def test_report_only_lets_the_job_finish_and_zero_turns_the_watchdog_off(tmp_path: Path) -> None:
    out = _run(tmp_path, "--stall-timeout", "1", "--stall-action", "report", environ={"STUCK_FOR": "3"})
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("x-launch: stalled: no rank made progress for 1 s") == 1
    assert "stopping the job" not in out.stderr
    shown = out.stderr.split("x-launch: every rank's Python stack (all threads): ", 1)[1].split("\n", 1)[0]
    shutil.rmtree(shown)  # a folder under the temporary directory: one process has no --log_dir
    off = _run(tmp_path, "--stall-timeout", "0", environ={"STUCK_FOR": "0"})
    assert off.returncode == 0 and "progress folder: None" in off.stdout


DUMP = """\
Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 327 in wait

Current thread 0x00007f0000000002 (most recent call first):
  File "/site-packages/torch/distributed/distributed_c10d.py", line 2800 in all_reduce
  File "/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/work/train.py", line 57 in main
  File "/work/train.py", line 80 in <module>
"""


def test_a_dump_is_read_into_threads_and_the_users_line_and_collective_are_found() -> None:
    stacks = parse_dump("an earlier, cut dump\n" + DUMP)
    assert [stack.thread for stack in stacks] == [0x7F0000000001, 0x7F0000000002]
    main = stacks[1]
    assert where(main) == Frame("/work/train.py", 57, "main")
    assert waits_in_collective(main) == "all_reduce"
    assert waits_in_collective(stacks[0]) is None
    assert is_library("/x/lib/python3.11/site-packages/x_runtime/accelerator/step.py")
    assert is_library("<frozen importlib._bootstrap>")
    assert not is_library("/work/train.py")


def _snapshot(rank: int, calls: list[tuple[int, Phase]], own_ms: float = 1.0, step_ms: float = 10.0) -> Snapshot:
    steps = 10
    return Snapshot(
        rank=rank,
        pid=1,
        thread=1,
        dump_signal=0,
        beat_ns=0,
        step=steps,
        phase=Phase.NONE,
        armed=True,
        step_us=tuple(int(step_ms * 1000) for _ in range(steps)),
        own_us=tuple(int(own_ms * 1000) for _ in range(steps)),
        calls=len(calls),
        last_calls=tuple(calls),
    )


B, R = Phase.BACKWARD, Phase.REDUCE


def test_the_first_call_where_ranks_differ_is_named_and_a_skip_recognised() -> None:
    usual = [(0, B), (1, R), (1, B), (2, R)]
    skipped = [(0, B), (1, B), (2, R)]
    lines = out_of_step([_snapshot(0, usual), _snapshot(1, skipped), _snapshot(2, usual)])
    assert lines == [
        "the ranks went out of step at call 2: ranks 0, 2 made accelerator.reduce after 1 step, "
        "rank 1 made backward after 1 step: rank 1 skipped accelerator.reduce"
    ]
    behind = out_of_step([_snapshot(0, usual), _snapshot(1, usual[:3]), _snapshot(2, usual)])
    assert behind == ["rank 1 did not make call 4 (accelerator.reduce after 2 steps), which ranks 0, 2 made"]
    assert out_of_step([_snapshot(0, usual), _snapshot(1, usual)]) == []


def test_a_rank_slower_outside_collectives_than_the_median_by_the_margin_is_a_straggler() -> None:
    even = [_snapshot(rank, [], own_ms=4.0) for rank in range(4)]
    assert stragglers(even) == [
        "step time over the last 9 steps: median 10.0-10.0 ms, p95 up to 10.0 ms across 4 ranks; "
        "no straggler (none 20% slower than the median outside collectives)"
    ]
    slow = [*even[:3], _snapshot(3, [], own_ms=5.2)]  # 30 % above the median
    assert stragglers(slow)[-1] == (
        "straggler: rank 3 spends 5.2 ms per step outside backward and collectives, the median rank 4.0 ms (margin 20%)"
    )
    assert stragglers(slow)[4] == "  rank 3: 10.0 / 10.0 ms (5.2 / 5.2 ms)  <- straggler"
    near = [*even[:3], _snapshot(3, [], own_ms=4.6)]  # 15 %: within the margin
    assert "no straggler" in stragglers(near)[0]
    tiny = [_snapshot(rank, [], own_ms=0.2) for rank in range(3)] + [_snapshot(3, [], own_ms=0.6)]
    assert "no straggler" in stragglers(tiny)[0]  # three times the median, but 0.4 ms: under FLOOR_MS
    assert stragglers(even[:1]) == []
