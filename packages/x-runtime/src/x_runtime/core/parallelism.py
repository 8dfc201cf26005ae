"""``ParallelismConfig``: how many ranks each dimension of parallelism spans, and its device mesh.

Accelerate's description of composed parallelism (after torchtitan's ``ParallelDims``): data
parallel replicas (``dp_replicate``), data parallel shards (``dp_shard``, FSDP), tensor parallel
(``tp``), context parallel (``cp``) and sequence parallel (``sp``). The product of the sizes is the
number of ranks. ``dp_shard`` alone is FSDP, ``dp_replicate`` with ``dp_shard`` is HSDP.

A size left ``None`` is read from Accelerate's ``PARALLELISM_CONFIG_*`` variables (see
``x_common.env``), else 1, so a script started by ``accelerate launch --parallelism_config_*``
gets the sizes it was launched with.

``build_device_mesh`` lays the enabled dimensions out in one fixed order (``dp_replicate``,
``dp_shard``, ``cp``, ``sp``, ``tp``: the innermost dimension holds the ranks that talk most, so
they land on one machine) and adds the flattened dimensions strategies shard and reduce over:
``dp`` (all data parallel ranks), ``dp_shard_cp`` (what FSDP shards over) and ``dp_cp`` (what the
loss is averaged over).

Examples:
    >>> config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=4)
    >>> config.total_size, config.dp_dim_names
    (8, ['dp_replicate', 'dp_shard'])
    >>> config._get_mesh()
    (('dp_replicate', 'dp_shard'), (2, 4))
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from x_common import env
from x_common.kinds import Int
from x_runtime.core.parallel_handlers import (
    DeepSpeedSequenceParallelConfig,
    TorchContextParallelConfig,
    TorchTensorParallelConfig,
)
from x_runtime.core.settings import current_settings

__all__ = ["ParallelismConfig"]

# Outermost to innermost: the mesh's dimension order, whatever order the sizes were given in.
MESH_ORDER = ("dp_replicate", "dp_shard", "cp", "sp", "tp")
_SIZE_VARS = {
    "dp_replicate": env.PARALLELISM_DP_REPLICATE_SIZE,
    "dp_shard": env.PARALLELISM_DP_SHARD_SIZE,
    "tp": env.PARALLELISM_TP_SIZE,
    "cp": env.PARALLELISM_CP_SIZE,
    "sp": env.PARALLELISM_SP_SIZE,
}
_BACKENDS = {"cp": ("torch",), "sp": ("deepspeed",)}
_SIZE = Int(minimum=1)


@dataclass
class ParallelismConfig:
    """The size of each parallel dimension; their product is the number of processes.

    Args:
        dp_replicate_size: ranks holding a full replica each (DDP; with ``dp_shard_size`` > 1, HSDP).
        dp_shard_size: ranks one replica is sharded over (FSDP).
        tp_size: tensor parallel ranks.
        cp_size: context parallel ranks (FSDP2, torch >= 2.6); excludes ``sp_size`` > 1.
        cp_backend: context parallel implementation: ``"torch"``.
        sp_size: sequence parallel ranks (DeepSpeed Ulysses).
        sp_backend: sequence parallel implementation: ``"deepspeed"``.
        tp_handler: settings for ``tp`` (default ``TorchTensorParallelConfig()`` when ``tp_size`` > 1).
        cp_handler: settings for ``cp`` (default ``TorchContextParallelConfig()`` when ``cp_size`` > 1).
        sp_handler: settings for ``sp`` (default ``DeepSpeedSequenceParallelConfig()`` when ``sp_size`` > 1).

    Raises:
        ValueError: a size below 1, an unknown backend, ``cp`` with ``sp``, tensor or context
            parallelism over pure replicas (``dp_replicate_size`` > 1 with ``dp_shard_size`` 1),
            or a ``cp_handler`` of the wrong class; one line each.

    Examples:
        >>> ParallelismConfig(dp_shard_size=8).fsdp_dim_names
        ['dp_shard_cp']
        >>> ParallelismConfig(tp_size=0)
        Traceback (most recent call last):
        ValueError: ParallelismConfig: tp_size=0 is not valid: expected an integer >= 1
    """

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_backend: str | None = None
    sp_size: int | None = None
    sp_backend: str | None = None
    tp_handler: TorchTensorParallelConfig | None = None
    cp_handler: TorchContextParallelConfig | None = None
    sp_handler: DeepSpeedSequenceParallelConfig | None = None
    # Built on first use by get_device_mesh; a torch DeviceMesh, not a setting.
    device_mesh: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        settings = current_settings()  # one snapshot for every field read here
        for dim, var in _SIZE_VARS.items():
            name = f"{dim}_size"
            value = getattr(self, name)
            setattr(self, name, settings.get(var) if value is None else _checked_size(name, value))
        if self.cp_backend is None:
            self.cp_backend = settings.get(env.PARALLELISM_CP_BACKEND)
        if self.sp_backend is None:
            self.sp_backend = settings.get(env.PARALLELISM_SP_BACKEND)
        for dim, known in _BACKENDS.items():
            backend = getattr(self, f"{dim}_backend")
            if backend not in known:
                raise ValueError(f"ParallelismConfig: {dim}_backend={backend!r} is not valid: expected one of {known}")
        self._check_composition()
        self._default_handlers()

    def _check_composition(self) -> None:
        if self.cp_enabled and self.sp_enabled:
            raise ValueError(
                f"ParallelismConfig: context parallelism (cp_size={self.cp_size}) and sequence parallelism "
                f"(sp_size={self.sp_size}) exclude each other; set one of them to 1"
            )
        # TP and CP compose with FSDP (2D) or HSDP (3D), never with plain replicas.
        if (self.tp_enabled or self.cp_enabled) and self.dp_replicate_enabled and not self.dp_shard_enabled:
            raise ValueError(
                "ParallelismConfig: tensor/context parallelism needs dp_shard_size > 1 when dp_replicate_size > 1 "
                f"(got dp_replicate_size={self.dp_replicate_size}, dp_shard_size=1); "
                "use dp_shard_size for FSDP + TP/CP, or both for HSDP + TP/CP"
            )

    def _default_handlers(self) -> None:
        if self.tp_enabled and self.tp_handler is None:
            self.tp_handler = TorchTensorParallelConfig()
        if self.cp_enabled:
            if self.cp_handler is None:
                self.cp_handler = TorchContextParallelConfig()
            elif not isinstance(self.cp_handler, TorchContextParallelConfig):
                raise ValueError(
                    f"ParallelismConfig: cp_backend='torch' takes a TorchContextParallelConfig as cp_handler, "
                    f"got {type(self.cp_handler).__name__}"
                )
        if self.sp_enabled and self.sp_handler is None:
            self.sp_handler = DeepSpeedSequenceParallelConfig()

    # --- sizes ----------------------------------------------------------------------------
    def size(self, dim: str) -> int:
        """Ranks ``dim`` spans (``"dp_replicate"``, ``"dp_shard"``, ``"tp"``, ``"cp"``, ``"sp"``)."""
        return int(getattr(self, f"{dim}_size"))

    @property
    def total_size(self) -> int:
        """Ranks the configuration spans: the product of every size."""
        return self.data_parallel_size * self.non_data_parallel_size

    @property
    def data_parallel_size(self) -> int:
        """Ranks that each read a different batch: ``dp_replicate_size * dp_shard_size``."""
        return self.size("dp_replicate") * self.size("dp_shard")

    @property
    def non_data_parallel_size(self) -> int:
        """Ranks that read the same batch: ``tp_size * cp_size * sp_size``."""
        return self.size("tp") * self.size("cp") * self.size("sp")

    @property
    def dp_replicate_enabled(self) -> bool:
        return self.size("dp_replicate") > 1

    @property
    def dp_shard_enabled(self) -> bool:
        return self.size("dp_shard") > 1

    @property
    def tp_enabled(self) -> bool:
        return self.size("tp") > 1

    @property
    def cp_enabled(self) -> bool:
        return self.size("cp") > 1

    @property
    def sp_enabled(self) -> bool:
        return self.size("sp") > 1

    # --- dimension names (lists, as Accelerate gives them and DeviceMesh indexes by) -------------
    def _enabled(self, *dims: str) -> list[str]:
        return [dim for dim in dims if self.size(dim) > 1]

    @property
    def dp_dim_names(self) -> list[str]:
        """Enabled data parallel dimensions: each reads its own batches."""
        return self._enabled("dp_replicate", "dp_shard")

    @property
    def non_dp_dim_names(self) -> list[str]:
        """Enabled dimensions whose ranks read the same batch."""
        return self._enabled("tp", "cp", "sp")

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """Enabled dimensions FSDP shards the model over (flattened into ``dp_shard_cp``)."""
        return self._enabled("dp_shard", "cp")

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """Enabled dimensions the loss is averaged over (flattened into ``dp_cp``)."""
        return self._enabled("dp_replicate", "dp_shard", "cp")

    @property
    def fsdp_dim_names(self) -> list[str]:
        """The mesh dimensions FSDP is applied over: replicas (when enabled), then ``dp_shard_cp``."""
        return [*self._enabled("dp_replicate"), "dp_shard_cp"]

    @property
    def active_mesh_dims(self) -> list[str]:
        return self.dp_dim_names + self.non_dp_dim_names

    # --- the device mesh ------------------------------------------------------------------------
    def _get_mesh(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """``(dimension names, shape)`` of the mesh, in ``MESH_ORDER``; two empty tuples when nothing is enabled.

        Accelerate's name, which libraries built on it call.
        """
        dims = self._enabled(*MESH_ORDER)
        return tuple(dims), tuple(self.size(dim) for dim in dims)

    def build_device_mesh(self, device_type: str) -> Any:
        """A new ``torch.distributed.DeviceMesh`` over the enabled dimensions, or ``None`` when there are none.

        Also flattens ``dp``, ``dp_shard_cp`` and ``dp_cp`` where their dimensions exist. Under
        DeepSpeed sequence parallelism it returns ``None``: DeepSpeed makes its own groups.
        Needs a joined process group whose size is ``total_size``.
        """
        if self.sp_backend == "deepspeed" and self.sp_enabled:
            return None
        names, shape = self._get_mesh()
        if not names:
            return None
        # Looked up at call time (not imported at module load): torch.distributed may be absent.
        from torch.distributed import device_mesh as torch_device_mesh

        # Any: sliced below by lists of names, as Accelerate slices it (torch's annotation says tuple).
        mesh: Any = torch_device_mesh.init_device_mesh(device_type, shape, mesh_dim_names=names)
        for dims, flat in (
            (self.dp_dim_names, "dp"),
            (self.dp_shard_cp_dim_names, "dp_shard_cp"),
            (self.dp_cp_dim_names, "dp_cp"),
        ):
            if dims:
                mesh[dims]._flatten(flat)
        return mesh

    def get_device_mesh(self, device_type: str | None = None) -> Any:
        """The mesh, built for ``device_type`` on first call and kept.

        Raises:
            ValueError: no mesh yet and no ``device_type``, or a mesh built for another device type.
        """
        if self.device_mesh is None:
            if device_type is None:
                raise ValueError("ParallelismConfig.get_device_mesh: pass device_type (e.g. 'cuda') to build the mesh")
            self.device_mesh = self.build_device_mesh(device_type)
        elif device_type is not None and self.device_mesh.device_type != device_type:
            raise ValueError(
                f"ParallelismConfig.get_device_mesh: the mesh was built for {self.device_mesh.device_type!r}, "
                f"not {device_type!r}"
            )
        return self.device_mesh

    def to_json(self) -> dict[str, Any]:
        """The settings as plain values (handlers as dicts), without the mesh."""
        values: dict[str, Any] = {}
        for item in dataclasses.fields(self):
            if item.init:
                value = getattr(self, item.name)
                handler = dataclasses.is_dataclass(value) and not isinstance(value, type)
                values[item.name] = dataclasses.asdict(value) if handler else value
        return values


def _checked_size(name: str, value: Any) -> int:
    try:
        return int(_SIZE.check(name, value))
    except ValueError:
        raise ValueError(f"ParallelismConfig: {name}={value!r} is not valid: expected {_SIZE.describe()}") from None
