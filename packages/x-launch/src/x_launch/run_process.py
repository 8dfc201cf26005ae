"""Run the engine as a child, pass SIGINT/SIGTERM on to it, and say which rank failed and why.

torchrun's agent already stops every worker when one fails and when it is told to stop; the
launcher makes sure the signal reaches it, that the agent dies with the launcher even if the
launcher is killed outright (Linux: parent-death signal), and that a failure ends with one
plain summary: which rank, its exit code or signal, and the last lines of its log. The agent's
own lines (its logging and its ChildFailedError traceback) are kept out of the terminal: in
``--log_dir``'s torchrun.log, and shown as they come with ``--debug``.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from x_launch.launch_plan import LaunchPlan
from x_launch.preemption import PreemptionRelay, parse_signals, requeue_job
from x_launch.rank_output import RankOutput

__all__ = ["RankFailure", "agent_failure", "describe_failure", "parse_root_cause", "run_plan"]

TAIL_LINES = 15
_ROOT_CAUSE = re.compile(
    r"Root Cause.*?rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*(?P<local>\d+)\).*?exitcode\s*:\s*(?P<code>-?\d+)",
    re.S,
)
_HOST = re.compile(r"Root Cause.*?host\s*:\s*(?P<host>\S+)", re.S)
# One failure of the summary: time, host, rank (local rank), exit code, on consecutive lines.
_ENTRY = re.compile(
    r"time\s*:\s*(?P<time>\S+)\s*\n\s*host\s*:\s*(?P<host>\S+)\s*\n"
    r"\s*rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*(?P<local>\d+)\)\s*\n\s*exitcode\s*:\s*(?P<code>-?\d+)"
)


@dataclass(frozen=True)
class RankFailure:
    """The first rank that failed, as torchrun's agent reported it."""

    rank: int
    local_rank: int
    exit_code: int  # negative: killed by that signal
    host: str | None = None

    def cause(self) -> str:
        if self.exit_code < 0:
            try:
                name = signal.Signals(-self.exit_code).name
            except ValueError:
                name = f"signal {-self.exit_code}"
            return f"was killed by {name}"
        return f"exited with code {self.exit_code}"


def parse_root_cause(agent_stderr: str) -> RankFailure | None:
    """The rank that failed first, from the failure summary torchrun's agent prints, if there is one.

    torchrun stamps failures to the second and, on a tie, names the lowest rank as the root cause.
    When one rank is killed, its peers then fail on the broken connection within the same second,
    and torchrun may name a peer; or it names a rank it stopped itself (SIGTERM) in the second the
    failing one exited. Among the failures of the root cause's second, a signal other than SIGTERM
    is taken as the cause, then an error exit, then SIGTERM.
    """
    match = _ROOT_CAUSE.search(agent_stderr)
    if match is None:
        return None
    host = _HOST.search(agent_stderr)
    root = RankFailure(
        rank=int(match["rank"]),
        local_rank=int(match["local"]),
        exit_code=int(match["code"]),
        host=host["host"] if host else None,
    )
    root_time = next((e["time"] for e in _ENTRY.finditer(agent_stderr) if int(e["rank"]) == root.rank), None)
    same_second = [
        RankFailure(int(e["rank"]), int(e["local"]), int(e["code"]), e["host"])
        for e in _ENTRY.finditer(agent_stderr)
        if e["time"] == root_time and int(e["rank"]) != root.rank
    ]
    # max() keeps the first of equals: torchrun's own choice wins unless another is a likelier cause.
    return max([root, *same_second], key=_likely_cause)


def _likely_cause(failure: RankFailure) -> int:
    # SIGTERM is how torchrun itself stops the other ranks once one failed: the least likely cause.
    if failure.exit_code == -signal.SIGTERM:
        return 0
    return 2 if failure.exit_code < 0 else 1


def _rank_logs(log_dir: Path, local_rank: int) -> list[Path]:
    """The failed rank's log files under torchrun's ``<run>/attempt_<n>/<local_rank>/`` layout, newest attempt."""
    found = sorted(log_dir.glob(f"*/attempt_*/{local_rank}/std*.log"), key=lambda p: p.stat().st_mtime)
    if not found:
        return []
    newest = found[-1].parent
    return [path for path in (newest / "stderr.log", newest / "stdout.log") if path.is_file()]


def _tail(path: Path, lines: int) -> list[str]:
    with open(path, errors="replace") as handle:
        return list(collections.deque(handle, maxlen=lines))


def describe_failure(
    failure: RankFailure, log_dir: Path | None, agent_code: int, *, scratch: bool = False
) -> list[str]:
    """The summary lines x-launch prints when a rank failed (``scratch``: logs removed afterwards)."""
    where = f"local rank {failure.local_rank}" + (f" on {failure.host}" if failure.host else "")
    lines = [
        f"x-launch: rank {failure.rank} ({where}) {failure.cause()}; "
        f"the other ranks were stopped and the job exited {agent_code}"
    ]
    logs = _rank_logs(log_dir, failure.local_rank) if log_dir is not None else []
    shown = next((path for path in logs if path.stat().st_size > 0), None)
    if shown is not None:
        where = "" if scratch else f" ({shown})"
        lines.append(f"x-launch: last lines of rank {failure.rank}'s {shown.stem}{where}:")
        lines += [f"  | {line.rstrip()}" for line in _tail(shown, TAIL_LINES)]
    return lines


def _log_dir(argv: list[str]) -> Path | None:
    return Path(argv[argv.index("--log-dir") + 1]) if "--log-dir" in argv else None


def _die_with_parent(relay: PreemptionRelay) -> None:
    # If x-launch is killed outright (SIGKILL), the agent gets SIGTERM (SIGINT when TERM means
    # preemption, since the agent then ignores it) and stops its workers.
    relay.ignore_in_child()
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, relay.death_signal())  # PR_SET_PDEATHSIG


# torchrun prefixes each line it copies from a worker with the worker's name, e.g. "[default0]:".
_WORKER_LINE = re.compile(rb"^\[[A-Za-z_][A-Za-z0-9_.\-]*?\d+\]:")
# The last line of a Python traceback: "SomeError: message" (torchrun's own failures end so).
_EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?(?P<type>\w*(?:Error|Exception|Timeout)\w*)(?:: ?(?P<message>.*))?$")
# What the agent raises when the machines do not all arrive within the rendezvous timeout.
_NOT_MET = ("Rendezvous", "DistStoreError", "waiting for clients")


# The agent's line for each worker that fails, restarts or not.
_WORKER_FAILED = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+)")


def _pump(
    stream: Iterable[bytes],
    keep: collections.deque[str],
    show_agent: bool,
    agent_log: Path | None,
    restarts: int = 0,
) -> None:
    """Workers' lines to the terminal; the agent's own (its logging, its tracebacks) kept aside.

    The agent's lines are read for the failure summary and written to ``agent_log``; they reach
    the terminal only with ``show_agent`` (``--debug``). With ``restarts``, each failure of a
    worker is said as it happens, since the group may restart and the job still succeed.
    """
    out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
    log = open(agent_log, "ab") if agent_log is not None else None  # noqa: SIM115 - closed below
    try:
        for raw in stream:
            worker = _WORKER_LINE.match(raw) is not None
            if worker or show_agent:
                if out is not None:
                    out.write(raw)
                    out.flush()
                else:
                    sys.stderr.write(raw.decode(errors="replace"))
            if not worker:
                text = raw.decode(errors="replace")
                keep.append(text)
                failed = _WORKER_FAILED.search(text) if restarts and not show_agent else None
                if failed is not None:
                    print(
                        f"x-launch: local rank {failed['local']} exited with code {failed['code']}; torchrun "
                        f"restarts every rank while restarts are left (--max_restarts {restarts})",
                        file=sys.stderr,
                        flush=True,
                    )
                if log is not None:
                    log.write(raw)
                    log.flush()
    finally:
        if log is not None:
            log.close()


def _to_stderr(data: bytes) -> None:
    if hasattr(sys.stderr, "buffer"):
        sys.stderr.buffer.write(data)
        sys.stderr.buffer.flush()
    else:  # replaced by a text stream (a notebook, a test's capture)
        sys.stderr.write(data.decode(errors="replace"))
        sys.stderr.flush()


def agent_failure(agent_output: str) -> str | None:
    """The last exception torchrun's agent printed ("RendezvousTimeoutError: ..."), if any."""
    found = None
    for line in agent_output.splitlines():
        match = _EXCEPTION_LINE.match(line.strip())
        if match is not None and match["type"] != "ChildFailedError":
            found = f"{match['type']}: {match['message'] or ''}".rstrip(": ")
    return found


def _summary(plan: LaunchPlan, agent_output: str, code: int, agent_log: Path | None) -> list[str]:
    failure = parse_root_cause(agent_output)
    if failure is not None:
        lines = describe_failure(failure, _log_dir(plan.argv), code, scratch=plan.scratch_logs is not None)
    else:
        cause = agent_failure(agent_output) or f"exit code {code}"
        lines = [f"x-launch: torchrun stopped before the ranks finished: {cause}"]
        if any(sign in cause for sign in _NOT_MET):
            lines.append(
                f"x-launch: the machines did not all meet within --rdzv_timeout ({plan.settings.rdzv_timeout} s): "
                "start x-launch on every machine with the same --main_process_ip and --main_process_port"
            )
    if agent_log is not None:
        lines.append(f"x-launch: torchrun's own report: {agent_log}")
    elif not plan.settings.debug:
        lines.append("x-launch: torchrun's own report is shown with --debug, or kept with --log_dir DIR")
    return lines


def _remove_stale_scratch(scratch: str) -> None:
    """Remove the scratch folders of earlier x-launch runs that were killed outright (SIGKILL).

    A folder is named ``x-launch-<pid>-<hex>``; it is stale when no process ``pid`` is alive.
    """
    folder = Path(scratch).parent
    for path in folder.glob("x-launch-*-*"):
        pid = path.name.split("-")[2]
        if not pid.isdigit() or int(pid) == os.getpid() or not path.is_dir():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:
            continue  # alive, under another user


def run_plan(plan: LaunchPlan) -> int:
    """Start the plan's command and wait; the exit code (128 + N when a signal N stopped it)."""
    watch = plan.engine == "torchrun"
    if plan.scratch_logs is not None:
        _remove_stale_scratch(plan.scratch_logs)
    relay = PreemptionRelay(parse_signals(plan.settings.preemption_signals))
    # srun (one x-launch per node) passes the signal on to the x-launch of every node.
    relays = plan.engine != "srun"
    child = subprocess.Popen(
        plan.argv,
        env={**os.environ, **plan.env, **(relay.environment() if relays else {})},
        stderr=subprocess.PIPE if watch else None,
        preexec_fn=lambda: _die_with_parent(relay),  # safe: this process has started no threads yet
    )
    stopped_by: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        stopped_by.append(signum)
        if child.poll() is None:
            child.send_signal(signum)

    def preempt(signum: int, frame: FrameType | None) -> None:
        if relays:
            relay.on_signal(signum, frame)
        elif child.poll() is None:
            relay.requested = True
            child.send_signal(signum)

    handlers = {signal.SIGINT: forward, signal.SIGTERM: forward, **dict.fromkeys(relay.signals, preempt)}
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    kept: collections.deque[str] = collections.deque(maxlen=400)
    log_dir = _log_dir(plan.argv) if plan.scratch_logs is None else None
    agent_log = log_dir / "torchrun.log" if log_dir is not None else None
    pump = None
    if watch and child.stderr is not None:
        if agent_log is not None:
            agent_log.parent.mkdir(parents=True, exist_ok=True)
        pump = threading.Thread(
            target=_pump,
            args=(child.stderr, kept, plan.settings.debug, agent_log, plan.settings.max_restarts),
            daemon=True,
        )
        pump.start()
    followed = None
    if watch and plan.scratch_logs is not None:
        followed = RankOutput(Path(plan.scratch_logs), _to_stderr, plan.settings.role or "default").start()
    stopped_for_it = False
    try:
        code = child.wait()
        stopped_for_it = relay.acknowledged()
        if followed is not None:
            followed.stop()
        if pump is not None:
            pump.join(timeout=5)
        if code != 0 and watch and not stopped_by:
            for line in _summary(plan, "".join(kept), code, agent_log):
                print(line, file=sys.stderr, flush=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if followed is not None:
            followed.stop()  # before the files go
        if plan.scratch_logs is not None:
            shutil.rmtree(plan.scratch_logs, ignore_errors=True)
        relay.close()
    if (relay.requested or stopped_for_it) and not stopped_by:
        return _after_preemption(plan, 128 - code if code < 0 else code, stopped_for_it)
    if stopped_by:
        return 128 + stopped_by[0]  # as a shell reports a job its signal ended: 130, 143
    return 128 - code if code < 0 else code


def _after_preemption(plan: LaunchPlan, code: int, stopped_for_it: bool) -> int:
    """The exit code after a preemption: the ranks' own; with --requeue, requeue the job first.

    Only when the ranks stopped for it: a signal that came after the training loop's last check of
    ``preemption_requested`` (or to a script that never checks) finds the job done.
    """
    if plan.engine != "srun" and not stopped_for_it:
        print(
            "x-launch: a preemption signal came, but no rank stopped for it (the loop had ended, or the script "
            "does not read accelerator.preemption_requested); nothing requeued",
            file=sys.stderr,
            flush=True,
        )
        return code
    if not plan.settings.requeue or plan.engine == "srun":
        if code == 0:
            print("x-launch: preempted; the ranks saved and exited", file=sys.stderr, flush=True)
        return code
    requeue_code, line = requeue_job(os.environ)
    print(line, file=sys.stderr, flush=True)
    return code or requeue_code
