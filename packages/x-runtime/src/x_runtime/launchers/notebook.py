"""``notebook_launcher``: run a function in N processes on torch's elastic agent, as Accelerate does.

One process runs the function here, in this process. Several are started by
``torch.distributed.launcher.elastic_launch`` (forked, so a function defined in a notebook
needs no pickling): each worker gets torch's variables (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``...), so an ``Accelerator`` or ``PartialState`` built inside joins the group as
under torchrun. The agent restarts the workers up to ``max_restarts`` times and stops them all
when one fails; the failure comes back as torch's ``ChildFailedError``, naming the rank and its
error. Forking a parent that already initialised CUDA, or that is in a process group, would hand
the children state they cannot use, so that is refused before anything starts.

One process honours ``max_restarts`` too (Accelerate ignores it there): the function runs again
after an exception, and the last attempt's own error comes back. A function written to succeed
only once restarted (Accelerate's ``test_fault_tolerant``) otherwise passed or failed on timing:
it returns at once when its ``multiprocessing.Queue`` looks empty, and a ``put`` reaches the
queue's pipe only once the queue's feeder thread has run, so the single attempt failed whenever
that thread ran before the check (often under CPU load) and passed, having done nothing, when not.

torch's agent installs its own SIGTERM/SIGINT/SIGHUP/SIGQUIT handlers in this process before it
forks, and never takes them back. Forked workers would inherit a Python-level SIGTERM handler,
which runs only when the main thread returns to the interpreter: a worker blocked in C++ (a gloo
rendezvous with a rank that already failed) then ignores the agent's SIGTERM, and each restart
stalls for torch's 30 s grace period before SIGKILL. Workers therefore get the default SIGTERM
(die at once) and the caller's own handlers for the rest; the caller's handlers come back here
when the launch ends. A worker whose function returns tells the others (``process/peer_exit``):
a rank still joining the group then fails in one line instead of waiting 30 minutes for it.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import torch
import torch.distributed as dist

from x_common import env
from x_runtime.core.environment import patch_environment
from x_runtime.core.imports import is_cuda_available
from x_runtime.core.settings import current_settings
from x_runtime.process.topology.peer_exit import mark_returned

__all__ = ["notebook_launcher"]

_log = logging.getLogger(__name__)
_PRECISIONS = ("no", "fp16", "bf16", "fp8")
# The signals torch's agent takes over (its TORCHELASTIC_SIGNALS_TO_HANDLE default).
_AGENT_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT") if hasattr(signal, name)
)


def _handlers_now() -> dict[signal.Signals, Any]:
    handlers = {sig: signal.getsignal(sig) for sig in _AGENT_SIGNALS}
    return {sig: handler for sig, handler in handlers.items() if handler is not None}


def _restore(handlers: dict[signal.Signals, Any]) -> None:
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def _as_worker(function: Callable[..., Any], caller_handlers: dict[signal.Signals, Any]) -> Callable[..., Any]:
    """``function`` as a forked worker runs it: the caller's signal handlers, SIGTERM's default."""

    @functools.wraps(function)
    def worker(*args: Any) -> Any:
        _restore(caller_handlers)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.environ[env.NOTEBOOK_WORKER.name] = "1"
        result = function(*args)
        settings = current_settings()  # this worker's own, with the variables start_workers gave it
        mark_returned(settings.environ, int(settings.raw("RANK", "0")))
        return result

    return worker


def _run_here(function: Callable[..., Any], args: tuple[Any, ...], max_restarts: int) -> Any:
    """``function(*args)`` in this process, run again after an exception up to ``max_restarts`` times."""
    for restart in range(1, max_restarts + 1):
        try:
            return function(*args)
        except Exception as error:
            _log.warning(
                "notebook_launcher: %s raised %s: %s; restart %d of %d",
                getattr(function, "__name__", "the function"),
                type(error).__name__,
                error,
                restart,
                max_restarts,
            )
    # Outside the loop, so that the last attempt's error comes back unwrapped, as with no restarts.
    return function(*args)


def notebook_launcher(
    function: Callable[..., Any],
    args: tuple[Any, ...] = (),
    num_processes: int | None = None,
    mixed_precision: str = "no",
    use_port: str = "29500",
    master_addr: str = "127.0.0.1",
    node_rank: int = 0,
    num_nodes: int = 1,
    rdzv_backend: str = "static",
    rdzv_endpoint: str = "",
    rdzv_conf: dict[str, Any] | None = None,
    rdzv_id: str = "none",
    max_restarts: int = 0,
    monitor_interval: float = 0.1,
    log_line_prefix_template: str | None = None,
) -> Any:
    """Run ``function(*args)`` in ``num_processes`` processes on this node (of ``num_nodes``).

    Args:
        function: what each process runs; build the ``Accelerator`` inside it.
        args: its positional arguments.
        num_processes: processes on this node; 1 runs ``function`` in this process (again after
            an exception, up to ``max_restarts`` times).
        mixed_precision: "no", "fp16", "bf16" or "fp8", seen by every ``Accelerator`` inside.
        use_port: the port of the static backend's rendezvous.
        master_addr: the address of the static backend's rendezvous.
        node_rank: this node's index among ``num_nodes``.
        num_nodes: nodes in the job.
        rdzv_backend: "static" (default) or "c10d".
        rdzv_endpoint: passed to torch's elastic launcher.
        rdzv_conf: passed to torch's elastic launcher.
        rdzv_id: passed to torch's elastic launcher.
        max_restarts: restarts of all workers (of ``function``, with one process) after a failure
            before giving up.
        monitor_interval: seconds between the agent's checks of its workers.
        log_line_prefix_template: prefix of each worker's output lines (e.g. "[rank${rank}]").

    Returns:
        What ``function`` returned: its value with one process, a dict of rank to value otherwise.

    Raises:
        ValueError: ``num_processes`` missing, a bad ``mixed_precision`` or ``node_rank``, or
            a parent that initialised CUDA or joined a process group before forking.
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError: a worker failed
            (after ``max_restarts`` restarts). With one process, what ``function`` raised on its
            last attempt.
    """
    mode = str(mixed_precision).lower()
    if mode not in _PRECISIONS:
        raise ValueError(f"unknown mixed_precision {mixed_precision!r}: choose one of {', '.join(_PRECISIONS)}")
    if num_processes is None:
        raise ValueError("pass num_processes=..., the number of processes to start")
    if node_rank >= num_nodes:
        raise ValueError(f"node_rank ({node_rank}) must be less than num_nodes ({num_nodes})")
    if num_processes <= 1 and num_nodes <= 1:
        with patch_environment(**{env.MIXED_PRECISION.name: mode}):
            return _run_here(function, args, max_restarts)
    return start_workers(
        function,
        args,
        num_processes,
        mode,
        use_port=use_port,
        master_addr=master_addr,
        node_rank=node_rank,
        num_nodes=num_nodes,
        rdzv_backend=rdzv_backend,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_conf=rdzv_conf,
        rdzv_id=rdzv_id,
        max_restarts=max_restarts,
        monitor_interval=monitor_interval,
        log_line_prefix_template=log_line_prefix_template,
    )


def start_workers(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    num_processes: int,
    mixed_precision: str,
    *,
    use_port: str = "29500",
    master_addr: str = "127.0.0.1",
    node_rank: int = 0,
    num_nodes: int = 1,
    rdzv_backend: str = "static",
    rdzv_endpoint: str = "",
    rdzv_conf: dict[str, Any] | None = None,
    rdzv_id: str = "none",
    max_restarts: int = 0,
    monitor_interval: float = 0.1,
    log_line_prefix_template: str | None = None,
) -> dict[int, Any]:
    """``function(*args)`` in ``num_processes`` forked workers on torch's elastic agent (even one).

    The arguments are ``notebook_launcher``'s; ``mixed_precision`` is already checked.

    Returns:
        Each local rank's return value.
    """
    if torch.cuda.is_initialized():
        raise ValueError(
            "CUDA was initialised in this process before notebook_launcher: forked workers could not use it. "
            "Restart the notebook and touch the GPU only inside the launched function."
        )
    if dist.is_initialized():
        raise ValueError(
            "this process is already in a process group (an Accelerator or PartialState was built here): "
            "build them only inside the launched function"
        )
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    conf = dict(rdzv_conf or {})
    if rdzv_backend == "static":
        conf["rank"] = node_rank
        rdzv_endpoint = rdzv_endpoint or f"{master_addr}:{use_port}"
    options: dict[str, Any] = {
        "min_nodes": num_nodes,
        "max_nodes": num_nodes,
        "nproc_per_node": num_processes,
        "run_id": rdzv_id,
        "rdzv_endpoint": rdzv_endpoint,
        "rdzv_backend": rdzv_backend,
        "rdzv_configs": conf,
        "max_restarts": max_restarts,
        "monitor_interval": monitor_interval,
        "start_method": "fork",
        "log_line_prefix_template": log_line_prefix_template,
    }
    known = {f.name for f in fields(LaunchConfig)}
    config = LaunchConfig(**{k: v for k, v in options.items() if k in known})
    where = {env.MASTER_ADDR.name: master_addr, env.MASTER_PORT.name: use_port}
    where[env.MIXED_PRECISION.name] = mixed_precision
    on_gpu = is_cuda_available() and not current_settings().get(env.USE_CPU)
    print(f"Launching training on {num_processes} {'GPU' if on_gpu else 'CPU'}s.")
    in_main_thread = threading.current_thread() is threading.main_thread()
    caller_handlers = _handlers_now() if in_main_thread else {}
    try:
        with patch_environment(**where):
            return elastic_launch(config=config, entrypoint=_as_worker(function, caller_handlers))(*args)
    finally:
        if in_main_thread:
            _restore(caller_handlers)
