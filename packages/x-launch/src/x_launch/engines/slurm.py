"""Launching inside a SLURM allocation: what SLURM's variables say, and what x-launch does with it.

Three situations, told apart by SLURM's own variables (named in ``x_common.env``):

``node`` -- a job step with one task per node (``srun -N 2 --ntasks-per-node=1 x-launch ...``):
    this x-launch starts torchrun on its node. nnodes = ``SLURM_NNODES``, node rank =
    ``SLURM_NODEID``, processes per node = num_processes / nnodes (default: the GPUs SLURM gave
    the node, else 1), master = first host of the step, static rendezvous.
``task`` -- a job step with several tasks on a node (``srun -n 4 x-launch ...``): every task IS
    one rank. x-launch runs the script with the interpreter and sets torch's variables (RANK =
    ``SLURM_PROCID``, WORLD_SIZE = ``SLURM_NTASKS``, LOCAL_RANK = ``SLURM_LOCALID``, ...).
``local`` / ``srun`` -- the batch script (job id, no step id): on one node, torchrun runs here
    as usual; on several nodes (or in an ``salloc`` shell, which may not run on an allocated
    node), x-launch runs ``srun --ntasks-per-node=1 x-launch <same arguments>``, and every inner
    x-launch, now inside a step, is in the ``node`` situation (no recursion: a step has a step id).

The master port is ``x_common.slurm.port_for_job(job id)`` unless ``MASTER_PORT`` is set; the
master address is the first host of the step (``MASTER_ADDR`` wins). A flag that contradicts
the allocation is an error naming both values and the fix; SLURM's values replace the config
file's machine count, machine rank, address and port (the file may describe another cluster).
Every derived value carries the source ``slurm`` (or the variable's name).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from x_common import env
from x_common.slurm import expand_nodelist, expand_tasks_per_node, port_for_job
from x_launch.config.file import ConfigError
from x_launch.config.launch_config import TABLE, LaunchConfig, Setting

__all__ = [
    "LOCAL",
    "NODE",
    "SOURCE",
    "SRUN",
    "TASK",
    "SlurmJob",
    "derive",
    "detect",
    "forwarded_args",
    "note",
    "rank_environment",
    "srun_argv",
]

SOURCE = "slurm"
NODE, TASK, LOCAL, SRUN = "node", "task", "local", "srun"

_NOTES = {
    NODE: "slurm: job step with one task per node: torchrun on this node, static rendezvous",
    TASK: "slurm: job step with several tasks per node: this task is one rank, run directly",
    LOCAL: "slurm: batch script on a one-node allocation: torchrun here",
    SRUN: "slurm: allocation without a step: one x-launch per node through srun (each a job step)",
}


@dataclass(frozen=True)
class SlurmJob:
    """What SLURM's variables say about the allocation and, inside a step, about the step."""

    job_id: int
    hosts: tuple[str, ...]  # of the step inside a step, else of the job
    nnodes: int
    node_id: int
    in_step: bool
    on_allocated_node: bool  # False in an salloc shell: it may run on the login node
    ntasks: int | None
    proc_id: int | None
    local_id: int | None
    tasks_on_node: int | None
    gpus_on_node: int | None

    @property
    def mode(self) -> str:
        if self.in_step:
            # SLURM puts at least one task on every node of a step: as many tasks as nodes is one each.
            return NODE if self.ntasks in (None, self.nnodes) else TASK
        return LOCAL if self.nnodes == 1 and self.on_allocated_node else SRUN


def _read(var: env.EnvVar, environ: Mapping[str, str]) -> Any:
    try:
        return var.read(environ)
    except ValueError as exc:
        raise ConfigError(f"{exc} (inside a SLURM job: {env.SLURM_JOB_ID.name} is set)") from None


def detect(environ: Mapping[str, str]) -> SlurmJob | None:
    """The SLURM job this process runs in, or ``None`` outside SLURM (no ``SLURM_JOB_ID``).

    Raises:
        ConfigError: SLURM's variables are malformed or incomplete.
    """
    job_id = _read(env.SLURM_JOB_ID, environ)
    if job_id is None:
        return None
    in_step = env.SLURM_STEP_ID.is_set(environ)
    nodelist_var = env.SLURM_STEP_NODELIST if in_step and env.SLURM_STEP_NODELIST.is_set(environ) else None
    nodelist_var = nodelist_var or env.SLURM_JOB_NODELIST
    nodelist = _read(nodelist_var, environ)
    if not nodelist:
        raise ConfigError(
            f"{env.SLURM_JOB_ID.name}={job_id} is set but {nodelist_var.name} is not: run x-launch inside the "
            f"allocation (srun or the batch script), or unset {env.SLURM_JOB_ID.name} to launch outside SLURM"
        )
    try:
        hosts = tuple(expand_nodelist(nodelist))
    except ValueError as exc:
        raise ConfigError(f"{nodelist_var.name}: {exc}") from None
    nnodes = _read(env.SLURM_NNODES, environ) or len(hosts)
    node_id = _read(env.SLURM_NODEID, environ) or 0
    if node_id >= nnodes:
        raise ConfigError(
            f"{env.SLURM_NODEID.name}={node_id} is not below {env.SLURM_NNODES.name}={nnodes}: SLURM's variables "
            "disagree; is this process inside the allocation?"
        )
    tasks_on_node = None
    tasks = _read(env.SLURM_TASKS_PER_NODE, environ)
    if tasks:
        try:
            per_node = expand_tasks_per_node(tasks)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        tasks_on_node = per_node[node_id] if node_id < len(per_node) else None
    return SlurmJob(
        job_id=job_id,
        hosts=hosts,
        nnodes=nnodes,
        node_id=node_id,
        in_step=in_step,
        on_allocated_node=env.SLURM_PROCID.is_set(environ),  # the batch script has it, salloc's shell not
        ntasks=_read(env.SLURM_NTASKS, environ),
        proc_id=_read(env.SLURM_PROCID, environ),
        local_id=_read(env.SLURM_LOCALID, environ),
        tasks_on_node=tasks_on_node,
        gpus_on_node=_read(env.SLURM_GPUS_ON_NODE, environ),
    )


def _asked(setting: Setting) -> bool:
    """Whether someone asked for this value (any source but the default)."""
    return setting.source != "default"


def _explicit(setting: Setting) -> bool:
    """Asked on the command line or by an ``X_LAUNCH_*`` variable, not by a config file."""
    return _asked(setting) and not setting.source.startswith("config file")


def _from(setting: Setting) -> str:
    return f"(from {setting.source})"


def _check_gpus(job: SlurmJob, per_node: int, use_cpu: bool, what: str, fix: str) -> None:
    gpus = job.gpus_on_node
    if not use_cpu and gpus and per_node > gpus:
        raise ConfigError(
            f"{what} {per_node} process(es) on this node, but SLURM allocated {gpus} GPU(s) here "
            f"({env.SLURM_GPUS_ON_NODE.name}={gpus}): ask SLURM for --gpus-per-node={per_node}, {fix}, or pass --cpu"
        )


def derive(settings: LaunchConfig, job: SlurmJob, environ: Mapping[str, str]) -> LaunchConfig:
    """The settings with what SLURM decides filled in (source ``slurm``).

    Raises:
        ConfigError: a requested value contradicts the allocation; one line with the fix.
    """
    mode = job.mode
    out: dict[str, Setting] = {}  # what SLURM decides, by config key
    procs, machines, rank = settings["num_processes"], settings["num_machines"], settings["machine_rank"]
    use_cpu = settings.use_cpu
    nnodes = 1 if mode == LOCAL else job.nnodes

    if settings.elastic and mode != LOCAL:
        # An elastic job's allocation may hold any count in its range; the rendezvous counts MAX.
        if not settings.min_machines <= nnodes <= machines.value:  # type: ignore[operator]
            raise ConfigError(
                f"num_machines {settings.min_machines}:{machines.value} {_from(machines)} does not hold the "
                f"{nnodes} node(s) SLURM gave ({env.SLURM_NNODES.name}={nnodes}): widen the range"
            )
        nnodes = machines.value
    elif _explicit(machines) and machines.value != nnodes:
        raise ConfigError(
            f"num_machines {machines.value} {_from(machines)} disagrees with SLURM: the "
            f"{'step' if job.in_step else 'job'} has {nnodes} node(s) ({env.SLURM_NNODES.name}={nnodes}); "
            f"drop it, or ask SLURM for --nodes={machines.value}"
        )
    out["num_machines"] = Setting(nnodes, SOURCE)
    if mode == SRUN:
        if _explicit(rank):
            raise ConfigError(
                f"machine_rank {rank.value} {_from(rank)} cannot hold for every node of a {nnodes}-node allocation: "
                f"drop it, SLURM numbers the nodes ({env.SLURM_NODEID.name})"
            )
        out["machine_rank"] = Setting(0, SOURCE)
    else:
        node_rank = 0 if mode == LOCAL else job.node_id
        if _explicit(rank) and rank.value != node_rank:
            raise ConfigError(
                f"machine_rank {rank.value} {_from(rank)} disagrees with SLURM: this is node {node_rank} "
                f"({env.SLURM_NODEID.name}={node_rank}); drop it, SLURM numbers the nodes"
            )
        out["machine_rank"] = Setting(node_rank, SOURCE)

    if mode == TASK:
        ntasks = int(job.ntasks or 1)
        if _asked(procs) and procs.value != ntasks:
            raise ConfigError(
                f"num_processes {procs.value} {_from(procs)} disagrees with srun: it started {ntasks} tasks "
                f"({env.SLURM_NTASKS.name}={ntasks}) and each task is one process; use srun -n {procs.value}, "
                f"or srun --ntasks-per-node=1 to let x-launch start the processes on each node"
            )
        out["num_processes"] = Setting(ntasks, SOURCE)
        _check_gpus(job, job.tasks_on_node or 1, use_cpu, "srun started", "start fewer tasks per node")
    else:
        if _asked(procs):
            if procs.value % nnodes:
                raise ConfigError(
                    f"num_processes {procs.value} {_from(procs)} cannot be spread evenly over {nnodes} nodes "
                    f"({env.SLURM_NNODES.name}={nnodes}): use a multiple of {nnodes}"
                )
            per_node = procs.value // nnodes
        else:
            per_node = job.gpus_on_node if job.gpus_on_node and not use_cpu else 1
            out["num_processes"] = Setting(per_node * nnodes, SOURCE)
        _check_gpus(job, per_node, use_cpu, f"num_processes {procs.value} {_from(procs)} means", "use fewer")

    ip, port = settings["main_process_ip"], settings["main_process_port"]
    if not _explicit(ip):
        addr = _read(env.MASTER_ADDR, environ)
        out["main_process_ip"] = Setting(addr, env.MASTER_ADDR.name) if addr else Setting(job.hosts[0], SOURCE)
    if not _explicit(port):
        master_port = _read(env.MASTER_PORT, environ)
        out["main_process_port"] = (
            Setting(master_port, env.MASTER_PORT.name)
            if master_port is not None
            else Setting(port_for_job(job.job_id), SOURCE)
        )
    return settings.updated(out)


def note(job: SlurmJob) -> str:
    """One line for ``--dry-run``: which situation x-launch recognised."""
    return _NOTES[job.mode]


def rank_environment(job: SlurmJob, settings: LaunchConfig) -> dict[str, str]:
    """torch's variables for one srun task that is one rank (the ``task`` situation)."""
    values: dict[env.EnvVar, Any] = {
        env.RANK: job.proc_id or 0,
        env.WORLD_SIZE: settings.num_processes,
        env.LOCAL_RANK: job.local_id or 0,
        env.LOCAL_WORLD_SIZE: job.tasks_on_node or 1,
        env.GROUP_RANK: job.node_id,
        env.MASTER_ADDR: settings.main_process_ip,
        env.MASTER_PORT: settings.main_process_port,
    }
    return env.to_environ(values)


def _x_launch(python: str) -> list[str]:
    script = shutil.which("x-launch", path=str(Path(python).parent))
    return [script] if script else [python, "-c", "from x_launch.cli import main; main()"]


def forwarded_args(settings: LaunchConfig) -> list[str]:
    """The command-line flags (and config file) that produced ``settings``, for the x-launch on each node.

    ``X_LAUNCH_*`` and other variables reach the nodes through srun's environment.
    """
    args: list[str] = []
    config_files = {s.source[len("config file ") :] for s in settings.values() if s.source.startswith("config file ")}
    for path in sorted(config_files):
        args += ["--config_file", path]
    forwarded: set[str] = set()  # two keys may share a flag (gradient_accumulation_steps): pass it once
    for row in TABLE:
        value = getattr(settings, row.name)
        if settings.source(row.key) != f"--{row.flag}" or value is None or row.flag in forwarded:
            continue
        forwarded.add(row.flag)
        if row.switch:
            args += [row.cli[0]] if value else []
        else:
            args += [f"--{row.flag}", str(value)]
    return args


def srun_argv(
    job: SlurmJob,
    settings: LaunchConfig,
    target: list[str],
    *,
    module: bool,
    log_dir: str | None,
    tee: bool | str,
    python: str,
) -> list[str]:
    """``srun`` starting one x-launch per node with the same arguments (the ``srun`` situation).

    ``tee``: ``True`` (both streams) or torchrun's streams (``"0:1,1:2"``), passed on as given.
    """
    nodes = str(job.nnodes)
    argv = ["srun", "--nodes", nodes, "--ntasks", nodes, "--ntasks-per-node", "1", "--whole", "--kill-on-bad-exit=1"]
    argv += [*_x_launch(python), *forwarded_args(settings)]
    if log_dir:
        argv += ["--log_dir", log_dir, *(["--tee"] if tee is True else [f"--tee={tee}"] if tee else [])]
    return [*argv, *(["-m"] if module else []), *target]
