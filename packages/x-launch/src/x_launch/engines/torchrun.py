"""torchrun's elastic agent: rendezvous, restarts and failure propagation for several processes or machines.

The agent runs as ``python -m x_launch.run.torchrun_agent``: ``torch.distributed.run`` itself,
which also hands its failures to x-launch as torch holds them.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Mapping

from x_common import env
from x_launch.config.file import ConfigError
from x_launch.config.launch_config import LaunchConfig
from x_launch.engines import preflight
from x_launch.engines.base import Engine, LaunchPlan, LaunchRequest
from x_launch.engines.slurm import SlurmJob

__all__ = ["TorchrunEngine"]


class TorchrunEngine(Engine):
    """torchrun's agent on each machine, starting that machine's share of the processes."""

    name = "torchrun"
    has_agent = True

    def plan(self, request: LaunchRequest) -> LaunchPlan:
        settings, job, env_vars = request.settings, request.job, dict(request.env_vars)
        procs, machines, rank = settings.num_processes, settings.num_machines, settings.machine_rank
        ip, port = settings.main_process_ip, settings.main_process_port
        if machines > 1 and not ip:
            raise ConfigError("a multi-machine launch needs --main_process_ip, the address of machine 0")
        if port == 0 and machines > 1:
            raise ConfigError("--main_process_port 0 works on one machine only; give every machine the same port")
        host = ip or "127.0.0.1"
        backend = "c10d" if settings.elastic else settings.rdzv_backend  # resolve() refuses static for elastic
        nnodes = f"{settings.min_machines}:{machines}" if settings.elastic else str(machines)
        argv = [request.python, "-m", "x_launch.run.torchrun_agent", "--nnodes", nnodes]
        argv += ["--nproc-per-node", str(procs // machines)]
        # One machine and no port asked for: torchrun's agent binds port 0 itself and keeps it, so two
        # launches started at the same instant cannot pick the same port (a port probed and released
        # here could be taken by the other before torchrun binds it).
        standalone = machines == 1 and (port == 0 or settings.is_default("main_process_port"))
        if ip and not standalone and job is None:
            preflight.resolve_host(ip)  # torchrun would retry an unknown host for minutes
        if standalone:
            argv += ["--standalone"]
        elif backend == "c10d":
            argv += _c10d_arguments(settings, host, port, job, request.environ, env_vars)
        else:
            if rank == 0:
                preflight.check_port(host, port)
            argv += ["--node-rank", str(rank), "--master-addr", host, "--master-port", str(port)]
        argv += ["--max-restarts", str(settings.max_restarts)]
        static = backend != "c10d" and not standalone
        rdzv_conf = _with_timeout(settings, "timeout" if static else "join_timeout")
        if backend == "c10d" and not standalone and "is_host=" not in rdzv_conf:
            rdzv_conf += ",is_host=1" if preflight.hosts_rendezvous_store(host, port) else ""
        for flag, value in (("--rdzv-conf", rdzv_conf), ("--role", settings.role)):
            if value is not None:
                argv += [flag, value]
        if settings.monitor_interval is not None:
            argv += ["--monitor-interval", repr(settings.monitor_interval)]
        scratch = None
        tee = request.tee
        if request.log_dir:
            # torchrun writes rank files only for the streams it redirects (3: stdout and stderr).
            streams = ["--tee", "3" if tee is True else str(tee)] if tee else ["--redirects", "3"]
            argv += ["--log-dir", request.log_dir, *streams]
        else:
            # Each rank's stderr goes to a file, so a failure report can quote the failing rank's last
            # lines; x-launch copies the files to the terminal as they grow, with torchrun's [defaultN]:
            # prefix (x_launch.run.rank_output says why not torchrun's --tee). stdout is left alone.
            # torchrun creates the folder; x-launch removes it afterwards.
            scratch = os.path.join(tempfile.gettempdir(), f"x-launch-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            argv += ["--log-dir", scratch, "--redirects", "2"]
        argv += [*(["--no-python"] if request.no_python else ["-m"] if request.module else []), *request.target]
        return LaunchPlan(argv, env_vars, self, settings, request.notes, request.warnings, scratch_logs=scratch)


def _c10d_arguments(
    settings: LaunchConfig,
    host: str,
    port: int,
    job: SlurmJob | None,
    environ: Mapping[str, str],
    env_vars: dict[str, str],
) -> list[str]:
    """torchrun's flags for a c10d rendezvous across machines; an elastic job's store setting goes to ``env_vars``.

    torch decides who hosts the store by host name (so x-launch's ``is_host``, in the caller) and
    advertises what ``getfqdn()`` resolves to (so ``--local-addr``): machines reached by another
    interface's address would never meet.
    """
    # One id per job: SLURM's job id names the rendezvous (a requeued job meets afresh under the
    # same id, after the old round's machines are gone); elsewhere the port does.
    run_id = f"x-slurm-{job.job_id}" if job is not None and job.job_id else f"x-{port}"
    argv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{host}:{port}", "--rdzv-id", run_id]
    local = None if env.TORCHRUN_LOCAL_ADDR.is_set(environ) else preflight.route_address(host, port)
    argv += ["--local-addr", local] if local else []
    if settings.elastic:
        # Each round's workers get a store of their own: the agent store torch shares across rounds
        # keeps the keys of the round before, and restart counts differ between machines that failed
        # and machines that only saw the world change.
        env_vars[env.TORCH_NO_SHARED_RDZV_STORE.name] = env.TORCH_NO_SHARED_RDZV_STORE.format(True)
    return argv


def _with_timeout(settings: LaunchConfig, key: str) -> str:
    """``--rdzv_conf`` with the rendezvous timeout under the name the backend reads, unless it names one."""
    given = settings.rdzv_conf or ""
    keys = {part.split("=", 1)[0].strip() for part in given.split(",") if part.strip()}
    if key in keys:
        if not settings.is_default("rdzv_timeout"):
            raise ConfigError(f"--rdzv_timeout and --rdzv_conf {key}=... both set the rendezvous timeout: give one")
        return given
    return ",".join(part for part in (given, f"{key}={settings.rdzv_timeout}") if part)
