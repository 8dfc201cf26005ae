"""From resolved settings to the engine that runs the job, its exact command and the environment it gets.

One process: the interpreter runs the script directly. Several processes or machines:
torchrun's elastic agent (rendezvous, restarts, failure propagation). Inside a SLURM allocation,
``x_launch.engines.slurm`` fills in machines, ranks, address and port from SLURM's variables
first (and the script may run directly, one srun task per rank, or under ``srun``). On a TPU host,
torch_xla's launcher. What the runtime needs travels as ``x_common.env`` variables. Building a plan
imports no torch, so ``--dry-run`` answers at once.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from x_common import env
from x_launch.config import parallelism
from x_launch.config.contract_env import contract_environment
from x_launch.config.file import ConfigError
from x_launch.config.launch_config import LaunchConfig, Setting
from x_launch.engines import preflight, slurm
from x_launch.engines.base import Engine, LaunchPlan, LaunchRequest
from x_launch.engines.python import PythonEngine
from x_launch.engines.srun import SrunEngine
from x_launch.engines.torchrun import TorchrunEngine
from x_launch.engines.xla import XlaEngine

__all__ = ["build_plan", "choose_engine"]


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
    job = slurm.detect(environ)
    preflight.check_requeue(settings.requeue, environ)
    notes: list[str] = []
    if job is not None:
        settings = slurm.derive(settings, job, environ)
        notes.append(slurm.note(job))
    else:
        settings = _one_process_per_gpu(settings, environ, gpus)
    procs, machines, rank = settings.num_processes, settings.num_machines, settings.machine_rank
    every_task_a_rank = job is not None and job.mode == slurm.TASK  # srun may spread tasks unevenly
    if procs % machines and not every_task_a_rank:
        raise ConfigError(
            f"num_processes {procs} is not a multiple of num_machines {machines}: every machine runs the same number"
        )
    if rank >= machines:
        raise ConfigError(f"machine_rank {rank} must be below num_machines {machines} (ranks start at 0)")
    parallelism.check(settings, cpu_only=_cpu_only(settings, job, gpus))
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
    engine = choose_engine(settings, job)
    warnings = _check_counts(settings, environ, gpus) if job is None else []
    request = LaunchRequest(
        settings=settings,
        target=target,
        env_vars=env_vars,
        environ=environ,
        job=job,
        module=module,
        log_dir=log_dir,
        tee=tee,
        no_python=no_python,
        python=python,
        notes=notes,
        warnings=warnings,
    )
    return engine.plan(request)


def choose_engine(settings: LaunchConfig, job: slurm.SlurmJob | None) -> Engine:
    """The engine for ``settings``: torch_xla for a TPU, srun or one rank per srun task in SLURM, else by counts."""
    if XlaEngine.wanted(settings):
        return XlaEngine()
    if job is not None and job.mode == slurm.SRUN:
        return SrunEngine()
    if job is not None and job.mode == slurm.TASK:
        return PythonEngine()
    if settings.num_processes == 1 and settings.num_machines == 1:
        return PythonEngine()
    return TorchrunEngine()


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


def _check_counts(settings: LaunchConfig, environ: Mapping[str, str], gpus: list[tuple[int, int]]) -> list[str]:
    """Refuse process counts this machine cannot run (SLURM's own counts are checked against the job);
    the warnings of those it runs badly."""
    if XlaEngine.wanted(settings):
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
    if XlaEngine.wanted(settings):
        return False
    return not gpus


def _cpu_only(settings: LaunchConfig, job: slurm.SlurmJob | None, gpus: list[tuple[int, int]]) -> str | None:
    """Why the ranks will have no GPU, or ``None``: ``use_cpu``, or no NVIDIA GPU on this machine.

    Inside SLURM the launcher may run on a login node without GPUs, so only ``use_cpu`` counts there.
    """
    if settings.use_cpu:
        return f"use_cpu from {settings.source('use_cpu')}"
    if job is None and not XlaEngine.wanted(settings) and not gpus:
        return "no NVIDIA GPU on this machine"
    return None


def _one_process_per_gpu(
    settings: LaunchConfig, environ: Mapping[str, str], gpus: list[tuple[int, int]]
) -> LaunchConfig:
    """``num_processes`` nothing set on one machine: one per visible GPU, as ``accelerate launch`` does.

    So ``accelerate launch --multi_gpu train.py`` on an 8-GPU node starts 8 processes here too.
    Visible: ``gpu_ids`` if given, else ``CUDA_VISIBLE_DEVICES``, else every GPU NVML sees.
    Without GPUs (or with ``--cpu``, or for a TPU) it stays 1.
    """
    tpu = XlaEngine.wanted(settings)
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
