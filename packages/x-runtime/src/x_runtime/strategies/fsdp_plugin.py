"""``FullyShardedDataParallelPlugin``: Accelerate's FSDP options, filled from the launcher's.

Fields left as ``None`` take the value ``x-launch`` passed (the ``fsdp_config`` section of the
launch config, through ``x_common.env``), then the default. FSDP1-only options in Accelerate's
files are translated for ``fully_shard``: ``sharding_strategy`` FULL_SHARD / SHARD_GRAD_OP map
to ``reshard_after_forward`` True / False; the others are refused with the alternative.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from x_common import env
from x_common.fsdp_reshard import reshard_after_forward_for
from x_runtime.core.settings import Settings, current_settings

__all__ = ["FullyShardedDataParallelPlugin"]

_WRAP_POLICIES = ("transformer_based_wrap", "size_based_wrap", "no_wrap")
_STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT")
_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}
_DTYPES.update({"fp16": torch.float16, "float16": torch.float16})


@dataclass
class FullyShardedDataParallelPlugin:
    """How ``prepare`` shards a model with ``fully_shard`` (FSDP2).

    Args:
        fsdp_version: 2 (1 is accepted for Accelerate's files and run as 2, see the module doc).
        reshard_after_forward: free each unit's gathered parameters after its forward (saves
            memory, gathers again in backward); False keeps them (ZeRO-2 like).
        auto_wrap_policy: "transformer_based_wrap" (each module of the classes below is one
            unit), "size_based_wrap" (units of at least ``min_num_params`` parameters),
            "no_wrap" (the whole model is one unit), or a callable ``module -> bool``.
        transformer_cls_names_to_wrap: class names for "transformer_based_wrap"; default the
            model's ``_no_split_modules`` (transformers models declare their layer class there).
        min_num_params: threshold for "size_based_wrap".
        cpu_offload: keep sharded parameters, gradients and optimizer state in CPU memory
            (needs an accelerator: on CPU everything is in CPU memory already).
        mixed_precision_policy: ``torch.distributed.fsdp.MixedPrecisionPolicy`` or a dict of its
            fields with dtypes or names ("bf16"); default from the accelerator's
            ``mixed_precision``: parameters in that dtype, gradients reduced in float32.
        state_dict_type: "FULL_STATE_DICT" (checkpoints hold whole tensors gathered on rank 0,
            readable by any run) or "SHARDED_STATE_DICT" (each rank writes its shards through
            ``torch.distributed.checkpoint``; loads into any number of processes).
        activation_checkpointing: recompute each wrapped unit's forward in backward.
        cpu_ram_efficient_loading: only rank 0 needs real weights; other ranks may build the
            model on the meta device (``init_empty_weights``) and receive rank 0's weights.
        sync_module_states: broadcast rank 0's weights and buffers while sharding.
        ignored_modules: modules (or a callable ``module -> bool``) left out of sharding.
    """

    fsdp_version: int | None = None
    reshard_after_forward: bool | str | None = None
    auto_wrap_policy: str | Callable[[torch.nn.Module], bool] | None = None
    transformer_cls_names_to_wrap: list[str] | str | None = None
    min_num_params: int | None = None
    cpu_offload: bool | None = None
    mixed_precision_policy: Any = None
    state_dict_type: str | None = None
    activation_checkpointing: bool | None = None
    cpu_ram_efficient_loading: bool | None = None
    sync_module_states: bool | None = None
    ignored_modules: Iterable[torch.nn.Module] | Callable[[torch.nn.Module], bool] | None = None
    # FSDP1 options Accelerate's configs carry; translated or accepted as documented above.
    sharding_strategy: str | None = None
    backward_prefetch: str | None = None
    forward_prefetch: bool | None = None
    use_orig_params: bool | None = None
    limit_all_gathers: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        settings = current_settings()  # one snapshot for every field read here
        if self.fsdp_version is None:
            self.fsdp_version = settings.get(env.FSDP_VERSION)
        if int(self.fsdp_version) not in (1, 2):
            raise ValueError(f"fsdp_version={self.fsdp_version!r}: expected 1 or 2")
        self._resolve_resharding()
        if self.auto_wrap_policy is None:
            self.auto_wrap_policy = settings.get(env.FSDP_AUTO_WRAP_POLICY)
        if isinstance(self.auto_wrap_policy, str):
            policy = self.auto_wrap_policy.lower()
            if policy not in _WRAP_POLICIES:
                raise ValueError(
                    f"auto_wrap_policy={self.auto_wrap_policy!r} is not one of {', '.join(_WRAP_POLICIES)} (or a callable)"
                )
            self.auto_wrap_policy = policy
        if self.transformer_cls_names_to_wrap is None:
            names = settings.get(env.FSDP_TRANSFORMER_CLS_TO_WRAP)
            self.transformer_cls_names_to_wrap = list(names) if names else None
        elif isinstance(self.transformer_cls_names_to_wrap, str):
            self.transformer_cls_names_to_wrap = [
                n.strip() for n in self.transformer_cls_names_to_wrap.split(",") if n.strip()
            ]
        if self.transformer_cls_names_to_wrap and self.auto_wrap_policy is None:
            self.auto_wrap_policy = "transformer_based_wrap"
        if self.min_num_params is None:
            self.min_num_params = settings.get(env.FSDP_MIN_NUM_PARAMS)
        if self.cpu_offload is None:
            self.cpu_offload = settings.get(env.FSDP_OFFLOAD_PARAMS)
        if self.state_dict_type is None:
            self.state_dict_type = settings.get(env.FSDP_STATE_DICT_TYPE)
        self.state_dict_type = _enum_name(self.state_dict_type, _STATE_DICT_NUMBERS)
        if self.backward_prefetch is not None:
            self.backward_prefetch = _enum_name(self.backward_prefetch, _PREFETCH_NUMBERS)
        if self.state_dict_type == "LOCAL_STATE_DICT":
            raise ValueError(
                "state_dict_type=LOCAL_STATE_DICT exists only in FSDP1; use SHARDED_STATE_DICT (any process count "
                "can load it) or FULL_STATE_DICT"
            )
        if self.state_dict_type not in _STATE_DICT_TYPES:
            raise ValueError(f"state_dict_type={self.state_dict_type!r} is not one of {', '.join(_STATE_DICT_TYPES)}")
        for name, var in (
            ("activation_checkpointing", env.FSDP_ACTIVATION_CHECKPOINTING),
            ("cpu_ram_efficient_loading", env.FSDP_CPU_RAM_EFFICIENT_LOADING),
            ("sync_module_states", env.FSDP_SYNC_MODULE_STATES),
        ):
            if getattr(self, name) is None:
                setattr(self, name, settings.get(var))
        if self.cpu_ram_efficient_loading and not self.sync_module_states:
            raise ValueError(
                "cpu_ram_efficient_loading=True needs sync_module_states=True: the other ranks get rank 0's weights "
                "that way"
            )

    def set_auto_wrap_policy(self, model: torch.nn.Module) -> None:
        """Settle the layer classes for ``model`` now, as Accelerate's call of this name does.

        ``prepare`` does the same by itself; calling this first only moves its checks earlier.

        Raises:
            ValueError: as ``prepare`` would: no class names, or names the model does not have.
        """
        if self.auto_wrap_policy == "transformer_based_wrap":
            self.transformer_cls_names_to_wrap = self.layer_class_names(model)

    def layer_class_names(self, model: torch.nn.Module) -> list[str]:
        """The layer classes sharded as units of ``model``: the names given, else its ``_no_split_modules``.

        Raises:
            ValueError: no class names, or names no submodule of ``model`` has (listing its classes).
        """
        names = list(self.transformer_cls_names_to_wrap or getattr(model, "_no_split_modules", None) or [])
        model_name = type(model).__name__
        if not names:
            raise ValueError(
                f"auto_wrap_policy=transformer_based_wrap needs layer class names (fsdp_transformer_layer_cls_to_wrap, "
                f"e.g. LlamaDecoderLayer); {model_name} declares no _no_split_modules"
            )
        present = {type(m).__name__ for m in model.modules()}
        unknown = [n for n in names if n not in present]
        if unknown:
            with_params = sorted({type(m).__name__ for m in model.modules() if any(True for _ in m.parameters())})
            raise ValueError(
                f"fsdp_transformer_layer_cls_to_wrap: {', '.join(unknown)} not found in {model_name}; its module "
                f"classes with parameters are {', '.join(with_params)}"
            )
        return names

    def _resolve_resharding(self) -> None:
        settings = current_settings()  # one snapshot for every field read here
        strategy = self.sharding_strategy
        if isinstance(self.reshard_after_forward, (str, enum.Enum)):  # Accelerate writes FSDP1 names here
            strategy, self.reshard_after_forward = self.reshard_after_forward, None
        if strategy is None and settings.is_set(env.FSDP_SHARDING_STRATEGY):
            strategy = settings.get(env.FSDP_SHARDING_STRATEGY)
        if strategy is not None:
            strategy = _enum_name(strategy, _STRATEGY_NUMBERS)
            translated = reshard_after_forward_for(strategy)  # the launcher's translation, not a copy
            if translated is None:
                raise ValueError(
                    f"sharding_strategy={strategy}: fully_shard runs FULL_SHARD (reshard_after_forward=True) and "
                    "SHARD_GRAD_OP (False); for NO_SHARD use distributed_type MULTI_GPU/MULTI_CPU (DDP), for HYBRID_SHARD "
                    "ParallelismConfig(dp_replicate_size=R, dp_shard_size=S) (HSDP)"
                )
            if self.reshard_after_forward is not None and bool(self.reshard_after_forward) != translated:
                raise ValueError(
                    f"sharding_strategy={strategy} contradicts reshard_after_forward={self.reshard_after_forward}; "
                    "give one of them"
                )
            self.reshard_after_forward = translated
        if self.reshard_after_forward is None:
            self.reshard_after_forward = settings.get(env.FSDP_RESHARD_AFTER_FORWARD)
        self.reshard_after_forward = bool(self.reshard_after_forward)

    def mixed_precision(self, mode: str) -> Any:
        """The ``MixedPrecisionPolicy`` for the accelerator's ``mixed_precision`` ``mode``."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        policy = self.mixed_precision_policy
        if isinstance(policy, MixedPrecisionPolicy):
            return policy
        if isinstance(policy, dict):
            fields = {key: _dtype(key, value) for key, value in policy.items()}
            return MixedPrecisionPolicy(**fields)
        if isinstance(policy, (str, torch.dtype)):
            dtype = _dtype("mixed_precision_policy", policy)
            return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        if policy is not None:
            raise TypeError(
                f"mixed_precision_policy: expected a MixedPrecisionPolicy, a dict or a dtype, got {type(policy).__name__}"
            )
        dtype = _DTYPES.get(mode)
        if dtype is None:
            return MixedPrecisionPolicy()
        # Gradients are reduced in float32: summing many bf16 gradients loses bits where it matters.
        return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def needs_cpu_collectives(plugin: FullyShardedDataParallelPlugin | None, settings: Settings) -> bool:
    """Whether FSDP as configured makes collectives on CPU tensors: CPU offload, or full state
    dicts (gathered to the CPU); as Accelerate decides, from the plugin or the launcher's variables."""
    settings = current_settings()  # one snapshot for every field read here
    if plugin is not None:
        return bool(plugin.cpu_offload) or plugin.state_dict_type == "FULL_STATE_DICT"
    state_dict_type = _enum_name(settings.get(env.FSDP_STATE_DICT_TYPE), _STATE_DICT_NUMBERS)
    return bool(settings.get(env.FSDP_OFFLOAD_PARAMS)) or state_dict_type == "FULL_STATE_DICT"


def _dtype(name: str, value: Any) -> Any:
    if value is None or isinstance(value, (torch.dtype, bool)):
        return value
    dtype = _DTYPES.get(str(value).lower().removeprefix("torch."))
    if dtype is None:
        raise ValueError(f"mixed_precision_policy {name}={value!r}: expected one of {', '.join(sorted(_DTYPES))}")
    return dtype


# Accelerate also takes torch's FSDP1 enums and their 1-based numbers (its config files' style).
_STRATEGY_NUMBERS = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
_STATE_DICT_NUMBERS = ("FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT")
_PREFETCH_NUMBERS = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")


def _enum_name(value: Any, numbered: tuple[str, ...]) -> str:
    """``ShardingStrategy.FULL_SHARD``, ``"full_shard"``, ``"ShardingStrategy.FULL_SHARD"`` or 1 -> ``"FULL_SHARD"``."""
    if isinstance(value, enum.Enum):
        return value.name.upper()
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= len(numbered):
        return numbered[value - 1]
    text = str(value).strip()
    if text.isdigit() and 1 <= int(text) <= len(numbered):
        return numbered[int(text) - 1]
    return text.rsplit(".", 1)[-1].upper()
