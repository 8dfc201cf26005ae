"""The per-dimension handlers a ``ParallelismConfig`` carries, and the versions each one needs.

Accelerate names three handlers, one per kind of model parallelism: ``TorchTensorParallelConfig``
(tensor parallel), ``TorchContextParallelConfig`` (context parallel on FSDP2) and
``DeepSpeedSequenceParallelConfig`` (DeepSpeed's Ulysses sequence parallel). They hold settings
only; they check at construction that the installed libraries can honour them, so a wrong setting
fails where it is written rather than at the first forward. A field left ``None`` is read from
Accelerate's ``PARALLELISM_CONFIG_*`` variables (``x_common.env``), as Accelerate's launcher
writes them.

Examples:
    >>> TorchContextParallelConfig(cp_comm_strategy="alltoall").cp_comm_strategy
    'alltoall'
    >>> DeepSpeedSequenceParallelConfig().sp_seq_length_is_variable
    True
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from x_common import env
from x_runtime.core.settings import current_settings
from x_runtime.core.versions import is_torch_version

__all__ = [
    "BETA_CP_AVAILABLE_PYTORCH_VERSION",
    "BETA_SP_AVAILABLE_DEEPSPEED_VERSION",
    "BETA_TP_AVAILABLE_PYTORCH_VERSION",
    "BETA_TP_AVAILABLE_TRANSFORMERS_VERSION",
    "DeepSpeedSequenceParallelConfig",
    "TorchContextParallelConfig",
    "TorchTensorParallelConfig",
]

# The oldest releases whose APIs each kind of parallelism is built on (Accelerate's thresholds,
# under Accelerate's names, so scripts that gate on them keep working).
BETA_TP_AVAILABLE_PYTORCH_VERSION = "2.3.0"  # torch.distributed.tensor.parallel's plans
BETA_TP_AVAILABLE_TRANSFORMERS_VERSION = "4.52.0"  # models carrying a tensor-parallel plan
BETA_CP_AVAILABLE_PYTORCH_VERSION = "2.6.0"  # torch.distributed.tensor.experimental.context_parallel
BETA_SP_AVAILABLE_DEEPSPEED_VERSION = "0.18.2"  # DeepSpeed's ALST / Ulysses

CP_COMM_STRATEGIES = ("allgather", "alltoall")
# Attention kernels that shard heads the way Ulysses expects; a Hub kernel of flash attention
# ("kernels-community/flash-attn2") qualifies too, eager and flex attention do not.
SP_ATTN_BUILTIN = ("flash_attention_2", "flash_attention_3", "sdpa")
SP_ATTN_REFUSED = ("eager", "flex_attention")


@dataclass
class TorchTensorParallelConfig:
    """Tensor parallelism through torch's ``parallelize_module`` and a plan of module names.

    Args:
        enable_async_tp: overlap TP communication with compute; accepted and ignored (with a
            warning), as in Accelerate.
        plan: x's addition: ``{module name: style}`` (torch's ``ColwiseParallel()``,
            ``RowwiseParallel()``, ``SequenceParallel()`` or transformers' words ``"colwise"``,
            ``"rowwise"``, ...; ``*`` matches one level of names). ``None``: the model's own plan
            (transformers' ``tp_plan``), applied by ``prepare``.

    Raises:
        ValueError: torch older than 2.3.
    """

    enable_async_tp: bool = False
    plan: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not is_torch_version(">=", BETA_TP_AVAILABLE_PYTORCH_VERSION):
            raise ValueError(f"tensor parallelism needs torch >= {BETA_TP_AVAILABLE_PYTORCH_VERSION}")
        if self.enable_async_tp:
            warnings.warn("enable_async_tp is not supported; tensor parallelism stays synchronous", stacklevel=3)


@dataclass
class TorchContextParallelConfig:
    """Context parallelism on FSDP2: how ranks exchange the shards of a long sequence.

    Args:
        cp_comm_strategy: ``"allgather"`` (each rank gathers all keys and values) or
            ``"alltoall"`` (ring exchange); ``None`` reads ``PARALLELISM_CONFIG_CP_COMM_STRATEGY``,
            else ``"allgather"``.

    Raises:
        ValueError: torch older than 2.6, or an unknown strategy.
    """

    cp_comm_strategy: str | None = None

    def __post_init__(self) -> None:
        if not is_torch_version(">=", BETA_CP_AVAILABLE_PYTORCH_VERSION):
            raise ValueError(f"context parallelism needs torch >= {BETA_CP_AVAILABLE_PYTORCH_VERSION}")
        if self.cp_comm_strategy is None:
            self.cp_comm_strategy = current_settings().get(env.PARALLELISM_CP_COMM_STRATEGY) or CP_COMM_STRATEGIES[0]
        if self.cp_comm_strategy not in CP_COMM_STRATEGIES:
            raise ValueError(
                f"Invalid cp_comm_strategy: {self.cp_comm_strategy}; expected one of {', '.join(CP_COMM_STRATEGIES)}"
            )


def _seq_length_from_env() -> int | None:
    raw = current_settings().get(env.PARALLELISM_SP_SEQ_LENGTH)
    if raw is None or raw.strip() in ("", "None"):  # Accelerate's launcher writes "None" for unset
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{env.PARALLELISM_SP_SEQ_LENGTH.name}={raw!r} is not valid: expected an integer") from None


@dataclass
class DeepSpeedSequenceParallelConfig:
    """DeepSpeed's sequence parallelism (ALST / Ulysses): how sequences are split across ranks.

    Args:
        sp_seq_length: the sequence length when every batch has the same one.
        sp_seq_length_is_variable: batches may differ in length (then ``sp_seq_length`` may stay
            unset); ``None`` reads ``PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE``, else ``True``.
        sp_attn_implementation: ``"flash_attention_2"``, ``"flash_attention_3"``, ``"sdpa"`` or a
            Hub flash-attention kernel; ``None`` reads ``PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION``.

    Raises:
        ValueError: a fixed length without ``sp_seq_length``, or an attention kernel Ulysses
            cannot split.
    """

    sp_seq_length: int | None = None
    sp_seq_length_is_variable: bool | None = None
    sp_attn_implementation: str | None = None

    def __post_init__(self) -> None:
        settings = current_settings()  # one snapshot for every field read here
        if self.sp_seq_length_is_variable is None:
            self.sp_seq_length_is_variable = bool(settings.get(env.PARALLELISM_SP_SEQ_LENGTH_IS_VARIABLE))
        if not self.sp_seq_length_is_variable and self.sp_seq_length is None:
            if not settings.is_set(env.PARALLELISM_SP_SEQ_LENGTH):
                raise ValueError(
                    "sp_seq_length_is_variable=False needs sp_seq_length (or "
                    f"{env.PARALLELISM_SP_SEQ_LENGTH.name} in the environment)"
                )
            self.sp_seq_length = _seq_length_from_env()
        if self.sp_attn_implementation is None:
            self.sp_attn_implementation = settings.get(env.PARALLELISM_SP_ATTN_IMPLEMENTATION)
        _check_attention(self.sp_attn_implementation)


def _check_attention(name: str | None) -> None:
    if name is None or name in SP_ATTN_BUILTIN:
        return
    if name in SP_ATTN_REFUSED:
        raise ValueError(f"Invalid sp_attn_implementation: {name}; sequence parallelism cannot split {name} attention")
    if "/" not in name or "flash-attn" not in name:  # a Hub kernel: "<org>/flash-attn..."
        raise ValueError(
            f"Invalid sp_attn_implementation: {name}; expected one of {', '.join(SP_ATTN_BUILTIN)} "
            "or a Hub flash-attention kernel such as kernels-community/flash-attn2"
        )
