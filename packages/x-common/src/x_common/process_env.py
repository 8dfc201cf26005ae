"""Where this process sits in a distributed job, read from whichever launcher started it.

``x-launch`` and ``torchrun`` set torch's variables (``RANK``, ``WORLD_SIZE``, ...); a
training script started by ``srun python train.py`` sees only SLURM's. Both are read here,
torch's first, so the runtime behaves the same with or without ``x-launch``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from x_common import env
from x_common.slurm import expand_tasks_per_node, first_host, port_for_job

__all__ = ["ProcessEnv", "process_env"]


@dataclass(frozen=True)
class ProcessEnv:
    """Rank and rendezvous of one process; ``source`` is "torchrun", "slurm" or "single"."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int | None
    source: str

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def process_env(environ: Mapping[str, str] | None = None) -> ProcessEnv:
    """Read this process's place in the job.

    Examples:
        >>> process_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
        ...              "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}).rank
        1
        >>> process_env({}).source
        'single'

    Raises:
        ValueError: a variable is malformed or the values contradict each other.
    """
    if env.RANK.is_set(environ) or env.WORLD_SIZE.is_set(environ):
        return _from_torch(environ)
    if env.SLURM_PROCID.is_set(environ) and env.SLURM_NTASKS.is_set(environ):
        return _from_slurm(environ)
    return ProcessEnv(0, 0, 1, 1, 0, "127.0.0.1", env.MASTER_PORT.read(environ), "single")


def _require(var: env.EnvVar, environ: Mapping[str, str] | None, source: str) -> object:
    value = var.read(environ)
    if value is None:
        raise ValueError(f"{var.name} is not set, but {source} variables are; set it or unset the others")
    return value


def _from_torch(environ: Mapping[str, str] | None) -> ProcessEnv:
    rank = int(_require(env.RANK, environ, "torch.distributed"))  # type: ignore[call-overload]
    world = int(_require(env.WORLD_SIZE, environ, "torch.distributed"))  # type: ignore[call-overload]
    local_rank = env.LOCAL_RANK.read(environ)
    local_world = env.LOCAL_WORLD_SIZE.read(environ)
    result = ProcessEnv(
        rank=rank,
        local_rank=rank if local_rank is None else local_rank,
        world_size=world,
        local_world_size=world if local_world is None else local_world,
        node_rank=env.GROUP_RANK.read(environ) or 0,
        master_addr=env.MASTER_ADDR.read(environ) or "127.0.0.1",
        master_port=env.MASTER_PORT.read(environ),
        source="torchrun",
    )
    _validate(result, env.RANK.name, env.WORLD_SIZE.name)
    return result


def _from_slurm(environ: Mapping[str, str] | None) -> ProcessEnv:
    rank = env.SLURM_PROCID.read(environ)
    world = env.SLURM_NTASKS.read(environ)
    nodelist = env.SLURM_JOB_NODELIST.read(environ)
    tasks = env.SLURM_TASKS_PER_NODE.read(environ)
    node_rank = env.SLURM_NODEID.read(environ) or 0
    local_world = world
    if tasks:
        per_node = expand_tasks_per_node(tasks)
        if node_rank >= len(per_node):
            raise ValueError(
                f"{env.SLURM_NODEID.name}={node_rank} has no entry in {env.SLURM_TASKS_PER_NODE.name}={tasks!r}"
            )
        local_world = per_node[node_rank]
    port = env.MASTER_PORT.read(environ)
    job_id = env.SLURM_JOB_ID.read(environ)
    if port is None and job_id is not None:
        port = port_for_job(job_id)
    result = ProcessEnv(
        rank=rank,
        local_rank=env.SLURM_LOCALID.read(environ) or 0,
        world_size=world,
        local_world_size=local_world,
        node_rank=node_rank,
        master_addr=env.MASTER_ADDR.read(environ) or (first_host(nodelist) if nodelist else "127.0.0.1"),
        master_port=port,
        source="slurm",
    )
    _validate(result, env.SLURM_PROCID.name, env.SLURM_NTASKS.name)
    return result


def _validate(result: ProcessEnv, rank_name: str, world_name: str) -> None:
    if result.rank >= result.world_size:
        raise ValueError(f"{rank_name}={result.rank} is not below {world_name}={result.world_size}")
    if result.local_rank >= result.local_world_size:
        raise ValueError(f"local rank {result.local_rank} is not below local world size {result.local_world_size}")
