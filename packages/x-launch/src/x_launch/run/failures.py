"""Which rank failed and why, read from torch's own failure objects, and the summary x-launch prints.

torchrun's agent raises ``ChildFailedError`` when workers fail; its ``failures`` map each global
rank to a ``ProcessFailure`` (local rank, exit code, the second it failed). x-launch runs the
agent through ``x_launch.run.torchrun_agent``, which picks the root cause from those objects
(``root_cause``) and writes it, or the agent's own exception (a rendezvous that timed out), to the
report file named by ``X_FAILURE_REPORT``; ``x_launch.run.process`` reads it back (``read_report``) once the
agent has exited. Nothing is parsed out of torchrun's printed summary.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import socket
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

__all__ = ["AgentError", "RankFailure", "describe_failure", "read_report", "root_cause", "write_report"]

TAIL_LINES = 15
# How x_runtime ends a script on a mistake in its input (torch's process group prefixes the rank).
ONE_LINE_ERROR = re.compile(r"^(\[rank\d+\]: )?error: ")


@dataclass(frozen=True)
class RankFailure:
    """The rank whose failure stopped the job, as torchrun's agent holds it."""

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


@dataclass(frozen=True)
class AgentError:
    """What the agent itself raised, when no worker failure stopped it (``RendezvousTimeoutError: ...``)."""

    type: str
    message: str

    def __str__(self) -> str:
        return f"{self.type}: {self.message}" if self.message else self.type


def root_cause(failed: ChildFailedError, host: str | None = None) -> RankFailure:
    """The rank that most likely made the job fail, from ``failed.failures``.

    torchrun stamps failures to the second and takes the earliest as the root cause
    (``get_first_failure``; on a tie, the first rank). When one rank is killed, its peers then
    fail on the broken connection within the same second, and torchrun may name a peer; or it
    names a rank it stopped itself (SIGTERM) in the second the failing one exited. Among the
    failures of the root cause's second, a signal other than SIGTERM is taken as the cause, then
    an error exit, then SIGTERM.
    """
    first_rank, first = failed.get_first_failure()
    host = host or socket.getfqdn()  # the agent's host, as torchrun's own summary names it
    candidates = [(first_rank, first)] + [
        (rank, failure)
        for rank, failure in failed.failures.items()
        if rank != first_rank and failure.timestamp == first.timestamp
    ]
    chosen = [RankFailure(rank, failure.local_rank, failure.exitcode, host) for rank, failure in candidates]
    # max() keeps the first of equals: torchrun's own choice wins unless another is a likelier cause.
    return max(chosen, key=_likely_cause)


def _likely_cause(failure: RankFailure) -> int:
    # SIGTERM is how torchrun itself stops the other ranks once one failed: the least likely cause.
    if failure.exit_code == -signal.SIGTERM:
        return 0
    return 2 if failure.exit_code < 0 else 1


def write_report(path: str | os.PathLike[str], outcome: RankFailure | AgentError) -> None:
    """Write ``outcome`` for the x-launch that started the agent (a rename: never half-written)."""
    kind = "failure" if isinstance(outcome, RankFailure) else "agent_error"
    fd, tmp = tempfile.mkstemp(prefix=".report.", dir=os.path.dirname(os.path.abspath(path)))
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump({kind: asdict(outcome)}, out)
    os.replace(tmp, path)


def read_report(path: str | os.PathLike[str]) -> RankFailure | AgentError | None:
    """What the agent reported, or None when it wrote nothing (it was killed, or the job succeeded)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data: dict[str, Any] = json.load(handle)
    except (OSError, ValueError):
        return None
    if "failure" in data:
        return RankFailure(**data["failure"])
    if "agent_error" in data:
        return AgentError(**data["agent_error"])
    return None


def _rank_logs(log_dir: Path, local_rank: int) -> list[Path]:
    """The failed rank's log files under torchrun's ``<run>/attempt_<n>/<local_rank>/`` layout, newest attempt."""
    found = sorted(log_dir.glob(f"*/attempt_*/{local_rank}/std*.log"), key=lambda p: p.stat().st_mtime)
    if not found:
        return []
    newest = found[-1].parent
    return [path for path in (newest / "stderr.log", newest / "stdout.log") if path.is_file()]


def _holds_traceback(path: Path, window: int = 1 << 16) -> bool:
    """Whether the end of the rank's log (its last 64 KiB) holds a Python traceback."""
    with open(path, "rb") as handle:
        handle.seek(max(0, path.stat().st_size - window))
        return b"Traceback (most recent call last):" in handle.read()


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
        tail = [line.rstrip() for line in _tail(shown, TAIL_LINES)]
        said = [line for line in tail if line.strip()]
        if scratch and said and ONE_LINE_ERROR.match(said[-1]):
            # The rank ended with x's one-line error, already streamed to this terminal: not said twice.
            return lines
        if scratch and _holds_traceback(shown):
            # Streamed to this terminal as it ran: one traceback per failure, not a second copy of its end.
            lines.append(f"x-launch: rank {failure.rank}'s traceback is above")
            return lines
        where = "" if scratch else f" ({shown})"
        lines.append(f"x-launch: last lines of rank {failure.rank}'s {shown.stem}{where}:")
        lines += [f"  | {line}" for line in tail]
    return lines
