"""Run the engine as a child, pass SIGINT/SIGTERM on to it, and say which rank failed and why.

torchrun's agent already stops every worker when one fails and when it is told to stop; the
launcher makes sure the signal reaches it, that the agent dies with the launcher even if the
launcher is killed outright (Linux: parent-death signal), and that a failure ends with one
plain summary: which rank, its exit code or signal, and the last lines of its log. Which rank is
read from torch's own ``ChildFailedError`` (``x_launch.run.failures``: the agent runs through
``x_launch.run.torchrun_agent``, which writes it to a report file). The agent's own lines (its logging and
its traceback) are kept out of the terminal: in ``--log_dir``'s torchrun.log, and shown as they
come with ``--debug``. While the job runs, ``x_launch.stall.watch`` watches the ranks' progress records
(``--stall-timeout``): after a stall it has printed where each rank is and stopped the job, and
x-launch exits with its code (124); at the end it prints the ranks' step times.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterable
from pathlib import Path
from types import FrameType

from x_common import env
from x_launch.engines.base import LaunchPlan
from x_launch.run.early_signals import EarlySignals
from x_launch.run.failures import AgentError, RankFailure, describe_failure, read_report
from x_launch.run.preemption import PreemptionRelay, parse_signals, requeue_job
from x_launch.run.rank_output import RankOutput
from x_launch.stall.watch import EXIT_CODE as STALL_EXIT_CODE
from x_launch.stall.watch import StallWatch

__all__ = ["run_plan"]


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
# What the agent raises when the machines do not all arrive within the rendezvous timeout.
_NOT_MET = ("Rendezvous", "DistStoreError", "waiting for clients")


# The agent's line for each worker that fails, restarts or not.
_WORKER_FAILED = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+)")


def _pump(stream: Iterable[bytes], show_agent: bool, agent_log: Path | None, restarts: int = 0) -> None:
    """Workers' lines to the terminal; the agent's own (its logging, its tracebacks) kept aside.

    The agent's lines are written to ``agent_log``; they reach the terminal only with
    ``show_agent`` (``--debug``). With ``restarts``, each failure of a worker is said as it
    happens, since the group may restart and the job still succeed.
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
                failed = _WORKER_FAILED.search(raw.decode(errors="replace")) if restarts and not show_agent else None
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


def _summary(
    plan: LaunchPlan, outcome: RankFailure | AgentError | None, code: int, agent_log: Path | None
) -> list[str]:
    if isinstance(outcome, RankFailure):
        lines = describe_failure(outcome, _log_dir(plan.argv), code, scratch=plan.scratch_logs is not None)
    else:
        cause = str(outcome) if outcome is not None else f"exit code {code}"
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


def _report_path() -> str:
    """A path for the agent's failure report (``x_launch.run.torchrun_agent`` writes it only on a failure)."""
    return os.path.join(tempfile.gettempdir(), f"x-launch-{os.getpid()}-{uuid.uuid4().hex[:8]}.failure.json")


def _remove_stale_scratch(folder: Path) -> None:
    """Remove the scratch folders and failure reports of earlier x-launch runs killed outright (SIGKILL).

    Each is named ``x-launch-<pid>-<hex>...``; it is stale when no process ``pid`` is alive.
    """
    for path in folder.glob("x-launch-*-*"):
        pid = path.name.split("-")[2]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            elif path.name.endswith(".failure.json"):
                path.unlink(missing_ok=True)
        except OSError:
            continue  # alive, under another user


def run_plan(plan: LaunchPlan, early: EarlySignals | None = None) -> int:
    """Start the plan's command and wait; the exit code (128 + N when a signal N stopped it).

    ``early``: the preemption-style signals caught since x-launch started; a preemption signal
    among them is acted on as soon as the command runs, any other ends x-launch here, as it would
    have when it came.
    """
    relay = PreemptionRelay(parse_signals(plan.settings.preemption_signals))
    unwanted = early.unwanted(relay.signals) if early is not None else None
    if unwanted is not None:
        EarlySignals.die_of(unwanted)
    watch = plan.engine.has_agent
    if watch:
        _remove_stale_scratch(Path(tempfile.gettempdir()))
    relays = plan.engine.relays_preemption
    report = _report_path() if watch else None
    reported = env.to_environ({env.FAILURE_REPORT: report}) if report is not None else {}
    log_dir = _log_dir(plan.argv) if plan.scratch_logs is None else None
    stall = _stall_watch(plan, log_dir)
    for line in plan.warnings:
        print(line, file=sys.stderr, flush=True)
    child = subprocess.Popen(
        plan.argv,
        env={**os.environ, **plan.env, **(relay.environment() if relays else {}), **reported, **stall.environment()},
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
    for number in early.caught if early is not None else ():
        preempt(number, None)  # came while x-launch was starting: the ranks see it at their first check
    agent_log = log_dir / "torchrun.log" if log_dir is not None else None
    pump = None
    if watch and child.stderr is not None:
        if agent_log is not None:
            agent_log.parent.mkdir(parents=True, exist_ok=True)
        pump = threading.Thread(
            target=_pump,
            args=(child.stderr, plan.settings.debug, agent_log, plan.settings.max_restarts),
            daemon=True,
        )
        pump.start()
    followed = None
    if watch and plan.scratch_logs is not None:
        followed = RankOutput(Path(plan.scratch_logs), _to_stderr, plan.settings.role or "default").start()
    stopped_for_it = False

    def stop_stalled() -> None:
        if child.poll() is None:
            child.send_signal(relay.death_signal())  # the agent stops every rank, as on Ctrl-C

    if stall.timeout:
        stall.start(stop_stalled)
    try:
        code = child.wait()
        for line in stall.finish():  # the step times; nothing after a stall, which said them
            print(line, file=sys.stderr, flush=True)
        stopped_for_it = relay.acknowledged()
        if followed is not None:
            followed.stop()
        if pump is not None:
            pump.join(timeout=5)
        if code != 0 and report is not None and not stopped_by and not stall.stalled:
            for line in _summary(plan, read_report(report), code, agent_log):
                print(line, file=sys.stderr, flush=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if followed is not None:
            followed.stop()  # before the files go
        if plan.scratch_logs is not None:
            shutil.rmtree(plan.scratch_logs, ignore_errors=True)
        if report is not None:
            Path(report).unlink(missing_ok=True)
        relay.close()
        stall.close()
    if stall.stalled and not stopped_by:
        return STALL_EXIT_CODE
    if (relay.requested or stopped_for_it) and not stopped_by:
        return _after_preemption(plan, 128 - code if code < 0 else code, stopped_for_it)
    if stopped_by:
        return 128 + stopped_by[0]  # as a shell reports a job its signal ended: 130, 143
    return 128 - code if code < 0 else code


def _stall_watch(plan: LaunchPlan, log_dir: Path | None) -> StallWatch:
    """The stall watchdog of one local run (timeout 0: off); SLURM's and TPU's runs leave it to what they start."""
    local = plan.engine.watches_stalls
    # Ranks taking turns on too few cores (plan.warnings says so) all look slow: no straggler is real there.
    report = plan.settings.straggler_report and not plan.warnings
    timeout = plan.settings.stall_timeout if local else 0
    return StallWatch(timeout, plan.settings.stall_action, log_dir, step_report=report)


def _after_preemption(plan: LaunchPlan, code: int, stopped_for_it: bool) -> int:
    """The exit code after a preemption: the ranks' own; with --requeue, requeue the job first.

    Only when the ranks stopped for it: a signal that came after the training loop's last check of
    ``preemption_requested`` (or to a script that never checks) finds the job done.
    """
    if plan.engine.relays_preemption and not stopped_for_it:
        print(
            "x-launch: a preemption signal came, but no rank stopped for it (the loop had ended, or the script "
            "does not read accelerator.preemption_requested); nothing requeued",
            file=sys.stderr,
            flush=True,
        )
        return code
    if not plan.settings.requeue or not plan.engine.relays_preemption:
        if code == 0:
            print("x-launch: preempted; the ranks saved and exited", file=sys.stderr, flush=True)
        return code
    requeue_code, line = requeue_job(os.environ)
    print(line, file=sys.stderr, flush=True)
    return code or requeue_code
