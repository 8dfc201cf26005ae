"""From resolved settings to the exact engine command and the environment it gets.

One process: the interpreter runs the script directly. Several processes or machines:
torchrun's elastic agent (rendezvous, restarts, failure propagation), as
``python -m x_launch.torchrun``: ``torch.distributed.run`` itself, which also hands its failures
to x-launch as torch holds them. Inside a SLURM allocation, ``x_launch.slurm_plan`` fills in machines, ranks,
address and port from SLURM's variables first (and may run the script directly, one srun task
per rank, or hand over to ``srun``). What the runtime needs travels as ``x_common.env``
variables. Building a plan imports no torch, so ``--dry-run`` answers at once.
"""

from __future__ import annotations

import enum
import os
import shlex
import socket
import sys
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from x_common import env
from x_launch import preemption, preflight, slurm_plan
from x_launch.config_file import ConfigError
from x_launch.contract_env import contract_environment
from x_launch.launch_config import LaunchConfig, Setting

__all__ = ["Engine", "LaunchPlan", "build_plan"]


class Engine(str, enum.Enum):
    """What runs the job: its value is what ``--dry-run`` prints (and equals that string)."""

    PYTHON = "python"  # one process: the interpreter runs the script
    TORCHRUN = "torchrun"  # torchrun's elastic agent (through ``x_launch.torchrun``)
    SRUN = "srun"  # SLURM: one x-launch per node, each starting its own engine
    TORCH_XLA = "torch_xla"  # torch_xla's launcher, one process per TPU device

    def __str__(self) -> str:
        return self.value


@dataclass
class LaunchPlan:
    argv: list[str]
    env: dict[str, str]
    engine: Engine
    settings: LaunchConfig = field(default_factory=LaunchConfig)
    notes: list[str] = field(default_factory=list)  # how the plan came about, e.g. the SLURM situation
    warnings: list[str] = field(default_factory=list)  # said once, when the job starts
    scratch_logs: str | None = None  # per-rank stderr logs x-launch keeps for a failure report, then removes

    def describe(self) -> str:
        """What --dry-run prints: every value with its source, the command, the environment."""
        lines = ["resolved config:", *self.settings.shown(), *self.notes]
        lines += [f"engine: {self.engine}", f"command: {shlex.join(self.argv)}", "environment:"]
        lines += [f"  {name}={value}" for name, value in sorted(self.env.items())]
        return "\n".join(lines)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def build_plan(
    settings: LaunchConfig,
    target: list[str],
    *,
    module: bool = False,
    log_dir: str | None = None,
    tee: bool | str = False,
    no_python: bool = False,
    python: str = sys.executable,
    environ: Mapping[str, str] | None = None,
    gpu_capabilities: list[tuple[int, int]] | None = None,
) -> LaunchPlan:
    """The command for ``target`` (script and its arguments, or module and its arguments).

    ``environ`` (default ``os.environ``) is where a SLURM allocation is recognised.
    ``tee``: ``True`` or torchrun's streams (``"3"``, ``"0:1,1:2"``); ``no_python``: the
    target is an executable, run without the interpreter (torchrun ``--no-python``).

    Raises:
        ConfigError: settings that cannot describe a job, named with the fix.
    """
    environ = os.environ if environ is None else environ
    # NVML is asked once: the GPU count, the CPU fallback and the bf16 check all read this list.
    gpus = _gpu_capabilities() if gpu_capabilities is None else gpu_capabilities
    job = slurm_plan.detect(environ)
    preemption.check_requeue(settings.requeue, environ)
    notes: list[str] = []
    if job is not None:
        settings = slurm_plan.derive(settings, job, environ)
        notes.append(slurm_plan.note(job))
    else:
        settings = _one_process_per_gpu(settings, environ, gpus)
    procs, machines, rank = settings.num_processes, settings.num_machines, settings.machine_rank
    every_task_a_rank = job is not None and job.mode == slurm_plan.TASK  # srun may spread tasks unevenly
    if procs % machines and not every_task_a_rank:
        raise ConfigError(
            f"num_processes {procs} is not a multiple of num_machines {machines}: every machine runs the same number"
        )
    if rank >= machines:
        raise ConfigError(f"machine_rank {rank} must be below num_machines {machines} (ranks start at 0)")
    # fp16 with --cpu runs, as under accelerate launch: the runtime computes in fp32 and says so.
    if settings.mixed_precision == "bf16" and not settings.use_cpu and not settings.tpu:
        preflight.check_bf16(gpus)
    if module and no_python:
        raise ConfigError("--module and --no_python contradict each other: pick one")
    if tee == "0":
        tee = False
    if tee and not log_dir:
        raise ConfigError("--tee copies the per-rank log files to the terminal; give --log_dir too")
    if log_dir and os.path.exists(log_dir) and not os.path.isdir(log_dir):
        raise ConfigError(f"--log_dir {log_dir} is a file; give a folder (it is created if missing)")
    env_vars = contract_environment(settings)
    env_vars.update(_process_environment(settings, environ, gpus))
    runner = [] if no_python else [python, *(["-m"] if module else [])]
    if settings.tpu or settings.distributed_type == "XLA":
        return _tpu_plan(
            settings, target, module=module, log_dir=log_dir, python=python, env_vars=env_vars, notes=notes
        )
    if job is not None and job.mode == slurm_plan.SRUN:
        argv = slurm_plan.srun_argv(job, settings, target, module=module, log_dir=log_dir, tee=tee, python=python)
        return LaunchPlan(argv, {}, Engine.SRUN, settings, notes)  # the x-launch on each node sets the environment
    if job is not None and every_task_a_rank:
        for asked, what in ((log_dir, "--log_dir"), (settings.max_restarts, "--max_restarts")):
            if asked:
                raise ConfigError(
                    f"{what} needs torchrun, which x-launch does not start when every srun task is one process: "
                    "use srun --ntasks-per-node=1 (x-launch then starts the processes on each node)"
                )
        if not settings.main_process_port:
            raise ConfigError("--main_process_port 0 cannot work when every srun task is one rank: give a port")
        env_vars.update(slurm_plan.rank_environment(job, settings))
        argv = [*runner, *target]
        return LaunchPlan(argv, env_vars, Engine.PYTHON, settings, notes)
    warnings = _check_counts(settings, environ, gpus) if job is None else []
    if procs == 1 and machines == 1:
        argv = [*runner, *target]
        return LaunchPlan(argv, env_vars, Engine.PYTHON, settings, notes)
    ip, port = settings.main_process_ip, settings.main_process_port
    if machines > 1 and not ip:
        raise ConfigError("a multi-machine launch needs --main_process_ip, the address of machine 0")
    if port == 0 and machines > 1:
        raise ConfigError("--main_process_port 0 works on one machine only; give every machine the same port")
    host = ip or "127.0.0.1"
    backend = "c10d" if settings.elastic else settings.rdzv_backend  # resolve() refuses static for elastic
    nnodes = f"{settings.min_machines}:{machines}" if settings.elastic else str(machines)
    argv = [python, "-m", "x_launch.torchrun", "--nnodes", nnodes, "--nproc-per-node", str(procs // machines)]
    # One machine and no port asked for: torchrun's agent binds port 0 itself and keeps it, so two
    # launches started at the same instant cannot pick the same port (a port probed and released
    # here could be taken by the other before torchrun binds it).
    standalone = machines == 1 and (port == 0 or settings.is_default("main_process_port"))
    if ip and not standalone and job is None:
        preflight.resolve_host(ip)  # torchrun would retry an unknown host for minutes
    if standalone:
        argv += ["--standalone"]
    elif backend == "c10d":
        argv += _c10d_arguments(settings, host, port, job, environ, env_vars)
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
    if log_dir:
        # torchrun writes rank files only for the streams it redirects (3: stdout and stderr).
        argv += ["--log-dir", log_dir, *(["--tee", "3" if tee is True else str(tee)] if tee else ["--redirects", "3"])]
    else:
        # Each rank's stderr goes to a file, so a failure report can quote the failing rank's last
        # lines; x-launch copies the files to the terminal as they grow, with torchrun's [defaultN]:
        # prefix (x_launch.rank_output says why not torchrun's --tee). stdout is left alone.
        # torchrun creates the folder; x-launch removes it afterwards.
        scratch = os.path.join(tempfile.gettempdir(), f"x-launch-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        argv += ["--log-dir", scratch, "--redirects", "2"]

    argv += [*(["--no-python"] if no_python else ["-m"] if module else []), *target]
    return LaunchPlan(argv, env_vars, Engine.TORCHRUN, settings, notes, warnings, scratch_logs=scratch)


def _tpu_plan(
    settings: LaunchConfig,
    target: list[str],
    *,
    module: bool,
    log_dir: str | None,
    python: str,
    env_vars: dict[str, str],
    notes: list[str],
) -> LaunchPlan:
    """torch_xla's launcher on this TPU host: one process per TPU device, each calling a function."""
    if settings.num_machines > 1:
        raise ConfigError(
            f"--tpu with --num_machines {settings.num_machines}: on a TPU pod, run x-launch --tpu on every host "
            "(e.g. gcloud compute tpus tpu-vm ssh NAME --worker=all --command 'x-launch --tpu train.py'), "
            "each with --num_machines 1"
        )
    if settings.use_cpu:
        raise ConfigError("--tpu and --cpu contradict each other: pick one")
    if module:
        raise ConfigError("--tpu calls a function of a script file: give the script's path, not -m MODULE")
    if log_dir:
        raise ConfigError("--log_dir needs torchrun's per-rank logs; torch_xla's launcher has none: drop it with --tpu")
    argv = [python, "-m", "x_launch.xla_run", "--main_training_function", settings.main_training_function]
    if settings.num_processes == 1 and not settings.is_default("num_processes"):
        argv += ["--nprocs", "1"]
    else:
        notes.append("tpu: torch_xla starts one process per TPU device of this host")
    env_vars = {**env_vars, env.DISTRIBUTED_TYPE.name: "XLA"}
    if settings.downcast_bf16 and settings.mixed_precision == "bf16":
        env_vars[env.XLA_DOWNCAST_BF16.name] = "1"  # as accelerate launch --tpu --downcast_bf16
    if not env.PJRT_DEVICE.is_set():
        env_vars[env.PJRT_DEVICE.name] = "TPU"
    if not env.MASTER_PORT.is_set():
        # torch_xla's rendezvous binds MASTER_PORT, 12355 unless told: a second job on the host would clash.
        env_vars[env.MASTER_PORT.name] = str(settings.main_process_port or _free_port())
    return LaunchPlan([*argv, *target], env_vars, Engine.TORCH_XLA, settings, notes)


def _physical_cores() -> int:
    """Physical CPU cores of this machine, as psutil counts them (logical ones when unknown)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cores, physical = set(), ""
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() == "physical id":
                    physical = value.strip()
                elif key.strip() == "core id":
                    cores.add((physical, value.strip()))
        if cores:
            return len(cores)
    except OSError:
        pass
    return os.cpu_count() or 1


def _c10d_arguments(
    settings: LaunchConfig,
    host: str,
    port: int,
    job: slurm_plan.SlurmJob | None,
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


def _check_counts(settings: LaunchConfig, environ: Mapping[str, str], gpus: list[tuple[int, int]]) -> list[str]:
    """Refuse process counts this machine cannot run (SLURM's own counts are checked against the job);
    the warnings of those it runs badly."""
    if settings.tpu or settings.distributed_type == "XLA":
        return []
    per_machine = settings.num_processes // max(settings.num_machines, 1)
    if _on_cpu(settings, gpus):
        preflight.check_cpu_processes(per_machine, settings.max_cpu_processes)
        crowded = preflight.oversubscribed(per_machine)
        return [crowded] if crowded is not None else []
    preflight.check_gpu_processes(per_machine, _visible_gpus(settings, environ, gpus))
    return []


def _visible_gpus(settings: LaunchConfig, environ: Mapping[str, str], gpus: list[tuple[int, int]]) -> int:
    """GPUs the processes may use: ``gpu_ids`` if given, else ``CUDA_VISIBLE_DEVICES``, else all NVML sees."""
    count = len(gpus)
    if count and str(settings.gpu_ids) != "all":
        return len([g for g in str(settings.gpu_ids).split(",") if g.strip()])
    if count and env.CUDA_VISIBLE_DEVICES.is_set(environ):
        return len([g for g in str(env.CUDA_VISIBLE_DEVICES.read(environ)).split(",") if g.strip()])
    return count


def _gpu_capabilities() -> list[tuple[int, int]]:
    """The NVIDIA GPUs here, read through NVML without torch (empty without any)."""
    from x_common.devices import nvml_compute_capabilities

    return nvml_compute_capabilities()


def _on_cpu(settings: LaunchConfig, gpus: list[tuple[int, int]]) -> bool:
    """Whether the processes train on CPU: ``--cpu``, or no NVIDIA GPU here."""
    if settings.use_cpu:
        return True
    if settings.tpu or settings.distributed_type == "XLA":
        return False
    return not gpus


def _one_process_per_gpu(
    settings: LaunchConfig, environ: Mapping[str, str], gpus: list[tuple[int, int]]
) -> LaunchConfig:
    """``num_processes`` nothing set on one machine: one per visible GPU, as ``accelerate launch`` does.

    So ``accelerate launch --multi_gpu train.py`` on an 8-GPU node starts 8 processes here too.
    Visible: ``gpu_ids`` if given, else ``CUDA_VISIBLE_DEVICES``, else every GPU NVML sees.
    Without GPUs (or with ``--cpu``) it stays 1.
    """
    tpu = settings.tpu or settings.distributed_type == "XLA"
    if not settings.is_default("num_processes") or settings.num_machines != 1 or tpu or _on_cpu(settings, gpus):
        return settings
    count = _visible_gpus(settings, environ, gpus)
    if count <= 1:
        return settings
    return settings.updated({"num_processes": Setting(count, f"one per visible GPU ({count})")})


def _process_environment(
    settings: LaunchConfig, environ: Mapping[str, str], gpus: list[tuple[int, int]]
) -> dict[str, str]:
    """What every process gets besides the contract: its GPUs and its CPU threads.

    ``gpu_ids`` other than ``all`` becomes ``CUDA_VISIBLE_DEVICES``. ``OMP_NUM_THREADS`` is
    ``--num_cpu_threads_per_process``, else (unless the user set it) physical cores divided by
    the processes on this machine, as Accelerate does, so that a CPU rank does not run on
    torchrun's one thread.
    """
    values: dict[str, str] = {}
    if settings.gpu_ids != "all":
        values[env.CUDA_VISIBLE_DEVICES.name] = settings.gpu_ids
    threads = settings.num_cpu_threads_per_process
    if threads is None and not env.OMP_NUM_THREADS.is_set(environ) and _on_cpu(settings, gpus):
        local = max(settings.num_processes // max(settings.num_machines, 1), 1)
        threads = max(_physical_cores() // local, 1)
    if threads is not None:
        values[env.OMP_NUM_THREADS.name] = str(threads)
    return values
