"""The stall watchdog: when no rank has made progress for ``--stall-timeout`` seconds, say where each is.

A hung job looks like a healthy one from outside: the processes live, torch's collective timeout
(``X_PROCESS_GROUP_TIMEOUT``, 1800 s) ends it half an hour later with an error that names the
collective but not why a rank never came. x-launch creates a folder and names it to every rank in
``X_PROGRESS_DIR``; each rank's ``Accelerator`` keeps its progress record there (step, the
collective it is in and since when: ``x_common.progress_record``) and registers a stack dump.
A thread here reads the records about once a second. When no rank beat (entered or left backward
or a collective, or finished a step) for the timeout, it sends every rank, and every process a
rank forked, the dump signal, reads their Python stacks (all threads), prints one summary
(``x_launch.stall.report``), writes the stacks to ``--log_dir`` (or a folder it names) and then stops the
job: x-launch exits with ``EXIT_CODE``, when some rank waits in a collective (ranks waiting for
one another: a hang); when every rank is in its own code the report is made and the job goes on.
With ``--stall-action report`` the job keeps running and the next stall is reported again.

The watch arms at the first backward or optimizer step of any rank: setup before it (downloads,
tokenizing under ``main_process_first``, compiling) may take as long as it needs. After that, the
timeout must exceed the longest stretch in which no rank calls backward, a collective or a step:
a checkpoint save, an evaluation pass that gathers nothing. The default, 900 s, is half the
collective timeout, so the report comes well before torch's own timeout would end the job
without one, and it is longer than a large model's checkpoint save takes on most file systems.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from x_common import env
from x_common.progress_record import Phase, Snapshot, read_record, stacks_path
from x_launch.config.stall_settings import ACTION_ROW, EXIT_CODE, TIMEOUT_ROW
from x_launch.stall.report import RankDump, describe_stall, stragglers
from x_launch.stall.stacks import parse_dump

__all__ = ["ACTION_ROW", "EXIT_CODE", "TIMEOUT_ROW", "StallWatch"]

_DUMP_WAIT_S = 5.0  # how long the ranks get to write their stacks


def _proc_status(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/status") as handle:
            return dict(line.rstrip("\n").split(":\t", 1) for line in handle if ":\t" in line)
    except OSError:
        return {}


def _catches(pid: int, number: int) -> bool:
    """Whether ``pid`` lives and has a handler for signal ``number`` (else the signal could kill it)."""
    if pid <= 0 or number <= 0:
        return False
    status = _proc_status(pid)
    if not status:  # no /proc (not Linux): the rank registered the handler, trust the record
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return not sys.platform.startswith("linux")
    return bool(int(status.get("SigCgt", "0"), 16) >> (number - 1) & 1) and status.get("State", "")[:1] != "Z"


class StallWatch:
    """One launch's progress folder and the thread that watches it."""

    def __init__(
        self, timeout: int, action: str, log_dir: Path | None, *, poll_s: float = 1.0, step_report: bool = True
    ) -> None:
        self.timeout_ns = int(timeout * 1e9)
        self.timeout = timeout
        self.action = action
        self.step_report = step_report  # the end-of-job step times and stragglers
        self.log_dir = log_dir
        self.poll_s = min(poll_s, max(timeout / 5, 0.05))
        self.folder = os.path.join(tempfile.gettempdir(), f"x-launch-{os.getpid()}-{uuid.uuid4().hex[:8]}-progress")
        self.stalled = False  # a stall was found and the job stopped for it
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def environment(self) -> dict[str, str]:
        """What every rank gets: the folder, created now (nothing when the watchdog is off)."""
        if not self.timeout:
            return {}
        os.makedirs(self.folder, exist_ok=True)
        return env.to_environ({env.PROGRESS_DIR: self.folder})

    def start(self, stop: Callable[[], None]) -> StallWatch:
        """Watch in a daemon thread; ``stop()`` ends the job after a stall (action ``stop``)."""
        self._thread = threading.Thread(target=self._watch, args=(stop,), name="x-launch-stall", daemon=True)
        self._thread.start()
        return self

    def finish(self) -> list[str]:
        """Stop watching; the end-of-job step time lines (prefixed), [] when there is nothing to say."""
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=_DUMP_WAIT_S + 5)
        if self.stalled or not self.timeout or not self.step_report:
            return []
        return [f"x-launch: {line}" for line in stragglers(self.snapshots())]

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def snapshots(self) -> list[Snapshot]:
        found = (read_record(path) for path in sorted(glob.glob(os.path.join(self.folder, "rank-*.progress"))))
        return [snapshot for snapshot in found if snapshot is not None]

    def _watch(self, stop: Callable[[], None]) -> None:
        reported = None  # the last beat a report was made for: one report per stall
        while not self._done.wait(self.poll_s):
            # A record whose process is gone without exiting is an earlier attempt's (torchrun restarts).
            snapshots = [s for s in self.snapshots() if s.phase is Phase.EXITED or _alive(s.pid)]
            if not any(s.armed for s in snapshots) or all(s.phase is Phase.EXITED for s in snapshots):
                continue
            last = max(s.beat_ns for s in snapshots)
            if time.monotonic_ns() - last < self.timeout_ns or last == reported:
                continue
            reported = last
            hung = _waits_for_others(snapshots)
            lines = self.report(snapshots, stopping=self.action == "stop" and hung)
            for line in lines:
                print(line, file=sys.stderr, flush=True)
            if self.action == "stop" and hung and not self._done.is_set():
                self.stalled = True
                stop()
                return

    def report(self, snapshots: list[Snapshot], *, stopping: bool) -> list[str]:
        """Dump every rank's stacks, keep them in a folder, and the summary lines (prefixed)."""
        dumps = self._dump([s for s in snapshots if s.phase is not Phase.EXITED])
        folder = self._keep(snapshots, dumps)
        body = describe_stall(snapshots, {rank: dump for rank, (dump, _) in dumps.items()})
        body += stragglers(snapshots)
        head = f"stalled: no rank made progress for {self.timeout} s (--stall-timeout {self.timeout})"
        tail = [f"every rank's Python stack (all threads): {folder}"]
        if stopping:
            tail.append(f"stopping the job (exit code {EXIT_CODE}); --stall-action report keeps it running")
        elif self.action == "stop":
            tail.append(
                "not stopping the job: no rank waits in a collective, so no rank is waiting for another "
                "(a long evaluation or save outside x's calls?); the next stall is reported again"
            )
        lines = [f"x-launch: {line}" for line in (head, *body, *tail)]
        (folder / "summary.txt").write_text("".join(line + "\n" for line in lines))
        return lines

    def _dump(self, snapshots: list[Snapshot]) -> dict[int, tuple[RankDump, dict[str, str]]]:
        """Signal each rank and its registered children; (their parsed stacks, the raw text by file name)."""
        targets: dict[str, tuple[int, int, int]] = {}  # file -> (rank, pid, size before)
        for s in snapshots:
            files = [(stacks_path(self.folder, s.rank), s.pid)]
            for path in glob.glob(stacks_path(self.folder, s.rank, child=0).replace("child-0", "child-*")):
                child = path.rsplit("child-", 1)[1].split(".")[0]
                if child.isdigit() and _proc_status(int(child)).get("PPid", "").strip() == str(s.pid):
                    files.append((path, int(child)))
            for path, pid in files:
                if _catches(pid, s.dump_signal):
                    targets[path] = (s.rank, pid, _size(path))
                    os.kill(pid, s.dump_signal)
        texts = _read_new(targets)
        dumps: dict[int, tuple[RankDump, dict[str, str]]] = {}
        for s in snapshots:
            own = stacks_path(self.folder, s.rank)
            children = tuple(
                (pid, tuple(parse_dump(texts[path])))
                for path, (rank, pid, _) in targets.items()
                if rank == s.rank and path != own and path in texts
            )
            raw = {os.path.basename(path): texts[path] for path, (rank, _, _) in targets.items() if rank == s.rank}
            dumps[s.rank] = (RankDump(tuple(parse_dump(texts.get(own, ""))), children), raw)
        return dumps

    def _keep(self, snapshots: list[Snapshot], dumps: dict[int, tuple[RankDump, dict[str, str]]]) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        if self.log_dir is not None:
            folder = (self.log_dir / f"stall-{stamp}").absolute()  # the summary names it from anywhere
            folder.mkdir(parents=True, exist_ok=True)
        else:
            folder = Path(tempfile.mkdtemp(prefix=f"x-stall-{stamp}-"))
        for s in snapshots:
            raw = dumps.get(s.rank, (None, {}))[1]
            for name, text in raw.items():
                header = f"# rank {s.rank}, pid {s.pid}, step {s.step}, phase {s.phase.name.lower()}\n"
                (folder / name.replace(".stacks", ".txt")).write_text(header + text)
        return folder


def _waits_for_others(snapshots: list[Snapshot]) -> bool:
    """Whether some rank is inside a collective: the sign of ranks waiting for one another.

    Stopping is kept for that case. When every rank is in its own code (a generation pass, a save,
    a single process), the job may be slow rather than hung, and killing it would lose real work:
    the report is made, and the job goes on.
    """
    return any(s.phase not in (Phase.NONE, Phase.EXITED) for s in snapshots)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's: alive
    return True


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read_new(targets: dict[str, tuple[int, int, int]]) -> dict[str, str]:
    """What each signalled process appended, once every file grew and then held still (or time ran out)."""
    deadline = time.monotonic() + _DUMP_WAIT_S
    sizes = {path: -1 for path in targets}
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = {path: _size(path) for path in targets}
        grown = all(now[path] > before for path, (_, _, before) in targets.items())
        if grown and now == sizes:
            break
        sizes = now
    texts = {}
    for path, (_, _, before) in targets.items():
        try:
            with open(path, errors="replace") as handle:
                handle.seek(before)
                texts[path] = handle.read()
        except OSError:
            continue
    return texts
