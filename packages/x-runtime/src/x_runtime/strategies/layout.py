"""The run's layout: how its ranks split into replicas, shards and tensor-parallel groups, on one mesh.

``strategies.select.decide`` settles the sizes (a ``ParallelismConfig`` from the code, or from the
launcher's ``PARALLELISM_CONFIG_*`` variables, or the one the strategy implies); once the process
group is joined, ``Layout.build`` checks them against the world and builds the one
``DeviceMesh`` of the run (``ParallelismConfig.get_device_mesh``, in Accelerate's dimension order:
``dp_replicate``, ``dp_shard``, ``cp``, ``tp``, with ``dp``, ``dp_shard_cp`` and ``dp_cp``
flattened). Everything that depends on the layout reads it from here: FSDP shards over
``fsdp_mesh``, tensor parallelism splits layers over ``tp_mesh``, the data loader shards by
``dp_rank`` of ``dp_size``, and collectives count each sample once (``speaks_for_batch``). No other
module builds a mesh.

Examples:
    >>> layout = Layout.single()
    >>> layout.dp_size, layout.dp_rank, layout.mesh is None
    (1, 0, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from x_runtime.core.one_line_errors import OneLineError
from x_runtime.core.parallelism import ParallelismConfig

__all__ = ["BadLayoutError", "Layout"]


class BadLayoutError(OneLineError, ValueError):
    """A layout x cannot train, or a plan it cannot apply: every rank raises the same line."""

    job_wide = True


@dataclass(frozen=True)
class Layout:
    """The ranks' roles and the mesh they form; ``config`` is ``None`` for a run that names no layout.

    ``mesh`` is the root ``DeviceMesh`` (``None`` when the run has no ``ParallelismConfig``: DDP
    and one process use the world group as they always have).
    """

    config: ParallelismConfig | None
    mesh: Any
    rank: int
    world_size: int
    # What ``fully_shard`` takes: ``dp_shard_cp``, with ``dp_replicate`` before it for HSDP; under FSDP in a
    # world of one, a mesh of that one rank (FSDP2 still holds DTensors there); ``None`` without shards.
    fsdp_mesh: Any = None

    @classmethod
    def single(cls) -> Layout:
        return cls(None, None, 0, 1)

    @classmethod
    def build(
        cls, config: ParallelismConfig | None, *, rank: int, world_size: int, device_type: str, fsdp: bool = False
    ) -> Layout:
        """The layout of a joined process group; the mesh is built here, once, for the run.

        ``fsdp``: the strategy shards (its sub-mesh is ``fsdp_mesh``).

        Raises:
            ValueError: sizes whose product is not the number of processes (one line, both numbers), or
                context parallelism on CPU.
        """
        if config is None:
            return cls(None, None, rank, world_size)
        if config.total_size != world_size:
            sizes = " x ".join(f"{dim}_size={config.size(dim)}" for dim in ("dp_replicate", "dp_shard", "tp", "cp"))
            raise BadLayoutError(
                f"parallelism_config: {sizes} spans {config.total_size} processes but this run has {world_size}; "
                f"make the product of the sizes {world_size}"
            )
        if config.cp_enabled and device_type == "cpu":
            raise BadLayoutError(
                f"parallelism_config: context parallelism (cp_size={config.cp_size}) runs on GPUs only (torch's ring "
                "attention over SDPA kernels); on CPU use dp_shard_size or tp_size"
            )
        mesh = config.get_device_mesh(device_type) if world_size > 1 else None
        return cls(config, mesh, rank, world_size, _fsdp_mesh(config, mesh, device_type) if fsdp else None)

    # --- sizes and this rank's place ------------------------------------------------------------
    def local_rank(self, dim: str) -> int:
        """This rank's coordinate along ``dim`` of the mesh; 0 when the dimension is 1 (or there is no mesh)."""
        config = self.config
        if self.mesh is None or config is None or config.size(dim) == 1:
            return 0
        return int(self.mesh.get_local_rank(dim))

    def _sized(self, dim: str) -> int:
        return 1 if self.config is None else self.config.size(dim)

    @property
    def dp_size(self) -> int:
        """Ranks that read different batches (replicas x shards); the world when no layout was named."""
        return self.world_size if self.config is None else self.config.data_parallel_size

    @property
    def dp_rank(self) -> int:
        """This rank's place among them: which batches it reads."""
        if self.config is None:
            return self.rank
        return self.local_rank("dp_replicate") * self._sized("dp_shard") + self.local_rank("dp_shard")

    @property
    def tp_size(self) -> int:
        return self._sized("tp")

    @property
    def tp_rank(self) -> int:
        return self.local_rank("tp")

    @property
    def copies(self) -> int:
        """Ranks that read each data parallel rank's batches: a tensor (and context) parallel group."""
        return self.world_size // self.dp_size

    @property
    def duplicates_batches(self) -> bool:
        """Whether several ranks hold the same batch (tensor and context parallel groups read one batch together)."""
        return self.copies > 1

    @property
    def speaks_for_batch(self) -> bool:
        """Whether this rank's copy of its batch is the one ``gather_for_metrics`` counts (tp and cp rank 0)."""
        return self.tp_rank == 0 and self.local_rank("cp") == 0

    # --- the meshes strategies work on ------------------------------------------------------------
    @property
    def cp_mesh(self) -> Any:
        """The context-parallel sub-mesh, or ``None`` without context parallelism."""
        return self.mesh["cp"] if self.mesh is not None and self._sized("cp") > 1 else None

    @property
    def tp_mesh(self) -> Any:
        """The tensor-parallel sub-mesh, or ``None`` without tensor parallelism."""
        return self.mesh["tp"] if self.mesh is not None and self.tp_size > 1 else None

    @property
    def shards(self) -> bool:
        """Whether FSDP shards the model (over ``dp_shard``/``cp``, or a world of one)."""
        return self.fsdp_mesh is not None

    def describe(self) -> str:
        """``dp_replicate=2 x dp_shard=2 x tp=2``, the enabled dimensions (``one process`` when none)."""
        if self.config is None or not self.config.active_mesh_dims:
            return f"{self.world_size} process{'es' if self.world_size > 1 else ''}"
        return " x ".join(f"{dim}={self.config.size(dim)}" for dim in self.config.active_mesh_dims)


def _fsdp_mesh(config: ParallelismConfig, mesh: Any, device_type: str) -> Any:
    names = config.dp_shard_cp_dim_names
    if mesh is not None and names:
        fsdp = config.fsdp_dim_names
        return mesh[tuple(fsdp)] if len(fsdp) > 1 else mesh[fsdp[0]]
    if mesh is None and config.total_size == 1 and dist.is_available() and dist.is_initialized():
        # Without a group FSDP's own check says how to launch; a mesh here would try to make one.
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(device_type, (1,), mesh_dim_names=("dp_shard_cp",))
    return None
