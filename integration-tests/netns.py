"""Several "machines" on one: network namespaces as hosts, for multi-node launches as root.

    with netns_hosts(4, prefix="xmh", subnet="198.51.100") as hosts:
        procs = [h.popen(["x-launch", "--machine_rank", str(i), ...]) for i, h in enumerate(hosts)]

Host ``i`` (1-based) is the namespace ``<prefix>-h<i>`` with one interface ``eth0`` at
``<subnet>.<i>/24``; the hosts share a bridge in a private switch namespace
(``../shared/netns/netns-hosts.sh``, beside the repository, makes them). Nothing is added to the
root namespace, so a test's traffic never leaves its hosts. Each user picks its own prefix (at
most 6 characters: interface names are limited to 15) and its own subnet, so runs in parallel
cannot collide. ``Host.popen`` starts a process in its own session inside the host; teardown
kills every process inside the hosts' namespaces (torchrun starts its workers in sessions of
their own, so a process group alone would miss them), then removes the namespaces.

Tests mark themselves ``requires_netns`` (registered in the root conftest): skipped with the
reason when this machine cannot make namespaces (not root, no ``ip`` and no apt to install it).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

try:
    import pytest
except ImportError:  # the benchmarks use the hosts without pytest installed
    pytest = None

__all__ = ["SCRIPT", "Host", "hosts_down", "hosts_up", "netns_hosts", "netns_problem", "requires_netns"]

SCRIPT = Path(__file__).resolve().parents[1].parent / "shared" / "netns" / "netns-hosts.sh"
DEFAULT_SUBNET = "192.0.2"
_PREFIX = re.compile(r"^[a-z][a-z0-9]{0,5}$")
_SUBNET = re.compile(r"^\d{1,3}\.\d{1,3}\.\d{1,3}$")
SCRIPT_TIMEOUT = 120  # the script may install iproute2 through apt first


@dataclass(frozen=True)
class Host:
    """One namespace host: its name (``<prefix>-h<i>``) and its address on ``eth0``."""

    name: str
    ip: str

    def popen(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, **kwargs) -> subprocess.Popen:
        """Start ``argv`` inside this host, in a session of its own (so ``os.killpg(p.pid, ...)`` stops it).

        gloo binds to the address ``hostname`` resolves to (127.0.0.1 from /etc/hosts) unless
        GLOO_SOCKET_IFNAME names an interface; the other hosts could not reach that.
        """
        environ = {**(os.environ if env is None else env), "GLOO_SOCKET_IFNAME": "eth0"}
        kwargs.setdefault("start_new_session", True)
        return subprocess.Popen(["ip", "netns", "exec", self.name, *argv], env=environ, **kwargs)

    def pids(self) -> list[int]:
        """Every process inside this host's namespace (whatever session it is in)."""
        out = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True, timeout=30)
        return [int(pid) for pid in out.stdout.split()]

    def kill(self) -> None:
        """SIGKILL every process inside this host."""
        for pid in self.pids():
            with suppress(ProcessLookupError):  # exited meanwhile
                os.kill(pid, signal.SIGKILL)


def _script(command: str, *args: str, prefix: str, subnet: str) -> str:
    environ = {**os.environ, "NETNS_PREFIX": prefix, "NETNS_SUBNET": subnet}
    out = subprocess.run(
        ["bash", str(SCRIPT), command, *args], env=environ, capture_output=True, text=True, timeout=SCRIPT_TIMEOUT
    )
    if out.returncode != 0:
        raise RuntimeError(f"{SCRIPT.name} {command} {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout


def _check(prefix: str, subnet: str) -> None:
    if not _PREFIX.match(prefix):
        raise ValueError(f"prefix {prefix!r}: 1-6 lower-case letters and digits, starting with a letter")
    if not _SUBNET.match(subnet):
        raise ValueError(f"subnet {subnet!r}: three numbers, as 198.51.100")


def _existing(prefix: str) -> list[Host]:
    if shutil.which("ip") is None:
        return []  # none can exist yet: the script installs iproute2 on its first run
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    names = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    return [Host(name, "") for name in names if re.fullmatch(rf"{re.escape(prefix)}-h\d+", name)]


def hosts_up(n: int, *, prefix: str, subnet: str | None = None) -> list[Host]:
    """Make hosts ``<prefix>-h1..<prefix>-h<n>`` at ``<subnet>.1..<subnet>.<n>`` (earlier ones of that prefix go)."""
    subnet = subnet or DEFAULT_SUBNET
    _check(prefix, subnet)
    if not 1 <= n <= 250:
        raise ValueError(f"n={n}: between 1 and 250 hosts")
    hosts_down(prefix)
    try:
        _script("up", str(n), prefix=prefix, subnet=subnet)
    except BaseException:
        hosts_down(prefix)
        raise
    return [Host(f"{prefix}-h{i}", f"{subnet}.{i}") for i in range(1, n + 1)]


def hosts_down(prefix: str) -> None:
    """Kill every process inside the hosts of ``prefix``, then remove the hosts and their switch."""
    _check(prefix, DEFAULT_SUBNET)
    for host in _existing(prefix):
        host.kill()
    deadline = time.monotonic() + 10
    # A namespace whose processes are still exiting would outlive its name.
    while any(host.pids() for host in _existing(prefix)) and time.monotonic() < deadline:
        time.sleep(0.05)
    _script("down", prefix=prefix, subnet=DEFAULT_SUBNET)


@contextmanager
def netns_hosts(n: int, *, prefix: str, subnet: str | None = None) -> Iterator[list[Host]]:
    """``hosts_up(n, ...)`` for the ``with`` block; every process inside and the hosts removed after it."""
    hosts = hosts_up(n, prefix=prefix, subnet=subnet)
    try:
        yield hosts
    finally:
        hosts_down(prefix)


@functools.cache
def netns_problem() -> str | None:
    """Why this machine cannot make namespace hosts, or ``None`` when it can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    if not SCRIPT.is_file():
        return f"no {SCRIPT} (the shared/ folder beside the repository)"
    if shutil.which("ip") is None:
        # The script installs iproute2 through apt itself.
        return None if shutil.which("apt-get") else "no ip (iproute2) and no apt-get to install it"
    probe = f"xprobe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    if made.returncode != 0:
        return f"ip netns add fails here: {made.stderr.strip()}"
    return None


requires_netns = pytest.mark.requires_netns if pytest is not None else None
