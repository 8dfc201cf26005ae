"""``Accelerator.preemption_requested``: the local flag (marker file, signal) and the ranks' agreement."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from x_common import env
from x_runtime.process.operations.preemption import PreemptionWatch, signal_numbers


def test_one_process_sees_the_marker_at_once_and_keeps_seeing_it(tmp_path: Path) -> None:
    marker = tmp_path / "preempted"
    watch = PreemptionWatch(world_size=1, marker=str(marker), signals=())
    assert [watch.requested() for _ in range(3)] == [False, False, False]
    marker.write_text("")
    assert not Path(f"{marker}.seen").exists()
    assert watch.requested() is True
    assert Path(f"{marker}.seen").exists()  # tells x-launch the rank stopped for it
    marker.unlink()
    assert watch.requested() is True  # a request is never taken back


def test_signal_names_as_x_launch_writes_them() -> None:
    assert signal_numbers("USR1,TERM") == (signal.SIGUSR1, signal.SIGTERM)
    assert signal_numbers("sigusr2") == (signal.SIGUSR2,)
    assert signal_numbers(None) == (signal.SIGUSR1,)  # x-launch's default


_SIGNALLED = """
    import os, signal, sys
    from x_runtime import Accelerator
    accelerator = Accelerator(cpu=True)
    print(accelerator.preemption_requested, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    print(accelerator.preemption_requested, flush=True)
"""


def _signalled(tmp_path: Path, **variables: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(env.PREFIX)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SIGNALLED)],
        env={**environ, **variables},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_configured_signal_only_sets_the_flag_under_x_launch(tmp_path: Path) -> None:
    out = _signalled(
        tmp_path,
        **{env.PREEMPTION_FILE.name: str(tmp_path / "never"), env.PREEMPTION_SIGNALS.name: "USR1,TERM"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]


def test_without_x_launch_a_signal_keeps_its_meaning(tmp_path: Path) -> None:
    out = _signalled(tmp_path, **{env.PREEMPTION_SIGNALS.name: "USR1,TERM"})  # no marker: not x-launch's worker
    assert out.returncode == -signal.SIGTERM
    assert out.stdout.split() == ["False"]


def test_every_rank_sees_the_request_at_the_same_step_and_an_access_is_cheap(workers, tmp_path: Path) -> None:
    ranks = workers("preemption_worker.py", 2, str(tmp_path / "marker"))
    # Rank 1 was asked at its step 5. The ranks post an all-reduce every `interval` accesses (agreed
    # after 8, from the slowest rank's step time: about 0.25 s apart), so the agreed answer comes
    # within two intervals, at the same step on both.
    interval = ranks[0]["interval"]
    assert ranks[1]["interval"] == interval and interval > 1
    assert ranks[0]["seen_at"] == ranks[1]["seen_at"]
    assert 5 < ranks[0]["seen_at"] <= 5 + 2 * interval
    assert [r["still"] for r in ranks] == [True, True]
    assert Path(f"{tmp_path / 'marker'}.rank0.seen").exists()  # rank 0 was never signalled, yet stopped too
    for r in ranks:
        print(f"rank access {r['access_us']:.1f} us, step {r['step_us']:.1f} us")
        assert r["access_us"] < 0.25 * r["step_us"], r  # one posted 1-element all-reduce, waited a step later
