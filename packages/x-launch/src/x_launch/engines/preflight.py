"""Checks made before any process starts: counts the machine can run, a port, an address, a job to requeue.

Each failure is a ``ConfigError``: one line saying what is wrong and how to fix it, so a bad
launch ends before torchrun prints its own traceback of the same fault (a port in use, a fork
that fails at process 150, a host name that never resolves).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import threading
from collections.abc import Mapping
from pathlib import Path

from x_common import env
from x_launch.config.file import ConfigError, LaunchRefused

__all__ = [
    "CPU_PROCESSES_PER_CORE",
    "RequeueRefused",
    "check_bf16",
    "check_cpu_processes",
    "check_gpu_processes",
    "check_port",
    "check_requeue",
    "oversubscribed",
    "resolve_host",
]

# Past a few processes per core CPU training only slows down, and at some hundreds the machine
# runs out of processes or threads (150 on 2 cores died with BlockingIOError): refuse well before.
CPU_PROCESSES_PER_CORE = 8
RESOLVE_TIMEOUT_S = 10.0


def _logical_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_cpu_processes(per_machine: int, allowed: int | None) -> None:
    """Refuse more CPU processes on this machine than ``allowed`` (default 8 per logical core)."""
    cores = _logical_cores()
    limit = allowed if allowed is not None else CPU_PROCESSES_PER_CORE * cores
    if per_machine > limit:
        how = "--max_cpu_processes" if allowed is not None else f"{CPU_PROCESSES_PER_CORE} per core"
        raise ConfigError(
            f"{per_machine} CPU processes on this machine is more than it can run well ({cores} logical cores, "
            f"limit {limit} by {how}): use fewer, or raise the limit with --max_cpu_processes N"
        )


def oversubscribed(per_machine: int) -> str | None:
    """The line that says, once per job, that CPU processes outnumber this machine's cores (else None)."""
    cores = _logical_cores()
    if per_machine <= cores:
        return None
    return (
        f"x-launch: {per_machine} CPU processes on {cores} logical core{'s' if cores > 1 else ''} take turns on "
        "them: the job runs slower than with fewer, and its step times say little (no straggler report at the end)"
    )


def check_gpu_processes(per_machine: int, visible: int) -> None:
    """Refuse more GPU processes on this machine than visible GPUs."""
    if visible and per_machine > visible:
        raise ConfigError(
            f"{per_machine} GPU processes on this machine, but {visible} GPUs are visible: use at most {visible} "
            "per machine (one per GPU), or --cpu"
        )


def _listening_pid(port: int) -> int | None:
    """The process listening on TCP ``port``, from /proc (Linux; None where unreadable)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    return int(proc.name)
        except OSError:
            continue
    return None


def check_port(host: str, port: int) -> None:
    """Refuse a rendezvous port that another process on this machine already holds."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's store binds it
        try:
            sock.bind(("", port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return  # e.g. a privileged port: torchrun reports it
            pid = _listening_pid(port)
            holder = f" (pid {pid})" if pid is not None else ""
            raise LaunchRefused(
                f"port {port} on {host} is in use{holder}; pass --main_process_port 0 for a free one"
            ) from None


def resolve_host(host: str) -> None:
    """Refuse ``--main_process_ip`` that does not resolve, within a bounded time."""
    outcome: list[BaseException | None] = []

    def look_up() -> None:
        try:
            socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
            outcome.append(None)
        except (OSError, UnicodeError) as exc:
            outcome.append(exc)

    worker = threading.Thread(target=look_up, daemon=True)
    worker.start()
    worker.join(RESOLVE_TIMEOUT_S)
    if not outcome:
        raise ConfigError(
            f"--main_process_ip {host} did not resolve within {RESOLVE_TIMEOUT_S:g} s: give machine 0's IP address"
        )
    if outcome[0] is not None:
        reason = getattr(outcome[0], "strerror", None) or str(outcome[0])
        raise ConfigError(
            f"--main_process_ip {host} does not resolve ({reason}): give machine 0's IP address or a name "
            "every machine can resolve"
        )


def route_address(host: str, port: int) -> str | None:
    """This machine's address on the way to ``host``: what the other machines can reach it by.

    A UDP socket "connected" to ``host`` sends nothing, but the kernel picks the interface and
    source address it would use. torch's c10d rendezvous otherwise advertises the address
    ``getfqdn()`` resolves to, which on machines with several networks (or in a network
    namespace) may be one the others cannot reach, and the workers never meet.
    """
    try:
        family, _kind, _proto, _name, address = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(address)
            return str(probe.getsockname()[0])
    except (OSError, UnicodeError, IndexError):
        return None


def hosts_rendezvous_store(host: str, port: int) -> bool:
    """Whether this machine must start the c10d rendezvous store at ``host:port`` itself.

    torch's c10d rendezvous compares the endpoint with the addresses ``gethostname()`` resolves
    to; a machine reached by another interface's address (a cluster's fast network, a network
    namespace) is then not taken for the store's host, and no machine starts the store. True when
    ``host`` is an address of this machine (a socket binds to it), not a loopback one (there
    torch's own guess is right, and it lets several launchers of one machine share the store),
    and nothing listens on the port yet.
    """
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    for family, kind, proto, _name, address in infos:
        if ipaddress.ip_address(address[0]).is_loopback:
            return False
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's store binds it
            try:
                probe.bind((address[0], port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return False  # another launcher of this machine holds the store already
                continue  # not an address of this machine
        return True
    return False


def check_bf16(capabilities: list[tuple[int, int]]) -> None:
    """Refuse bf16 when every GPU here predates it (compute capability below 8.0, e.g. V100, T4).

    ``capabilities`` are read through NVML, without torch; a machine without NVIDIA GPUs trains
    bf16 on its CPU.
    """
    if capabilities and all(major < 8 for major, _ in capabilities):
        found = ", ".join(sorted({f"{major}.{minor}" for major, minor in capabilities}))
        raise ConfigError(
            f"mixed_precision bf16 needs GPUs of compute capability 8.0 or newer (Ampere+); these have {found}: "
            "use fp16, or --cpu"
        )


class RequeueRefused(ConfigError):
    """``--requeue`` where there is no SLURM job to requeue."""

    exit_code = 1


def check_requeue(requeue: bool, environ: Mapping[str, str]) -> None:
    """Refuse ``--requeue`` outside a SLURM job.

    Raises:
        RequeueRefused: no ``SLURM_JOB_ID``.
    """
    if requeue and not env.SLURM_JOB_ID.is_set(environ):
        raise RequeueRefused(
            f"--requeue needs a SLURM batch job ({env.SLURM_JOB_ID.name} is not set): "
            "run x-launch inside the sbatch script, or drop --requeue"
        )
