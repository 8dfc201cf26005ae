"""``debug_launcher``: run a function in several CPU processes joined in a gloo group, to debug
distributed code on any machine.

Built on ``notebook_launcher``'s workers: each process is forked by torch's elastic agent and gets
torch's variables, with ``X_USE_CPU`` set so that an ``Accelerator`` or ``PartialState`` built
inside runs on the CPU and joins the group over gloo. Unlike ``notebook_launcher``, one process is
started even for ``num_processes=1``, so the function never runs in the caller's process. The
rendezvous port is a free one chosen here, not a fixed 29500, so two launches on one machine (two
test runs) do not meet.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable
from typing import Any

from x_common import env
from x_runtime.core.environment import patch_environment
from x_runtime.core.settings import current_settings
from x_runtime.launchers.notebook import start_workers

__all__ = ["debug_launcher"]


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def debug_launcher(function: Callable[..., Any], args: tuple[Any, ...] = (), num_processes: int = 2) -> dict[int, Any]:
    """Run ``function(*args)`` in ``num_processes`` new processes on the CPU, for debugging (not training).

    Args:
        function: what each process runs; build the ``Accelerator`` (or ``PartialState``) inside it.
        args: its positional arguments.
        num_processes: processes to start (at least one); two or more join one gloo process group.

    Returns:
        Each rank's return value, by rank.

    Raises:
        ValueError: ``num_processes`` below 1, or a parent already in a process group or that
            initialised CUDA (the workers are forked).
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError: a process failed; it
            names the rank and its error.
    """
    if num_processes < 1:
        raise ValueError(f"debug_launcher: num_processes must be at least 1, got {num_processes}")
    host = "127.0.0.1"
    overrides = {env.USE_CPU.name: "1"}
    if sys.platform.startswith("linux") and current_settings().raw("GLOO_SOCKET_IFNAME") is None:
        overrides["GLOO_SOCKET_IFNAME"] = "lo"  # gloo's hostname-based choice of interface fails on some hosts
    with patch_environment(**overrides):
        return start_workers(function, args, num_processes, "no", use_port=str(_free_port(host)), master_addr=host)
