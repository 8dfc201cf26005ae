"""The launch config's keys: Accelerate's names, so an Accelerate ``default_config.yaml`` works.

Each key has a kind that checks values read from YAML (already typed) or from a flag or an
``X_LAUNCH_*`` variable (strings), and a default. Sections (``fsdp_config``,
``deepspeed_config``, ``dynamo_config``) are checked key by key. Keys that Accelerate writes for
features x does not offer (SageMaker, Megatron-LM, mpirun, TPU pods) are accepted and reported
as ignored, so an existing file keeps working.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from x_common.env import DISTRIBUTED_TYPES, DYNAMO_MODES, MIXED_PRECISIONS

__all__ = ["IGNORED_KEYS", "LEGACY_KEYS", "SCHEMA", "SECTIONS", "Field", "check_value", "nearest"]

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class Field:
    kind: str  # "int", "bool", "bool_or_choice", "str", "choice", "float", "gpu_ids", "names"
    default: Any = None
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    doc: str = ""

    def describe(self) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        if self.kind == "bool_or_choice":
            return "true, false or one of " + ", ".join(self.choices)
        if self.kind == "int":
            if self.minimum is not None and self.maximum is not None:
                return f"an integer from {self.minimum:g} to {self.maximum:g}"
            return "an integer" + (f" >= {self.minimum:g}" if self.minimum is not None else "")
        if self.kind == "float":
            return "a number" + (f" >= {self.minimum:g}" if self.minimum is not None else "")
        return {
            "bool": "true or false",
            "str": "a string",
            "gpu_ids": "'all' or comma-separated GPU indices such as 0,1",
            "names": "comma-separated names",
        }[self.kind]


def _choice(*choices: str, default: Any = None, doc: str = "") -> Field:
    return Field("choice", default, choices, doc=doc)


SCHEMA: dict[str, Field] = {
    "compute_environment": _choice("LOCAL_MACHINE", "SLURM", default="LOCAL_MACHINE", doc="where the job runs"),
    "distributed_type": _choice(*DISTRIBUTED_TYPES, default="NO", doc="how processes share the work"),
    "num_machines": Field("int", 1, minimum=1, doc="machines (nodes) in the job"),
    "num_processes": Field("int", 1, minimum=1, doc="processes in the whole job"),
    "machine_rank": Field("int", 0, minimum=0, doc="this machine's index, 0 on the main one"),
    "main_process_ip": Field("str", None, doc="address of machine 0"),
    "main_process_port": Field("int", 29500, minimum=0, maximum=65535, doc="rendezvous port; 0 picks a free one"),
    "rdzv_backend": _choice("static", "c10d", default="static", doc="torchrun rendezvous"),
    "max_restarts": Field("int", 0, minimum=0, doc="restarts of the whole group after a failure"),
    "gpu_ids": Field("gpu_ids", "all", doc="GPUs this machine may use"),
    "mixed_precision": _choice(*MIXED_PRECISIONS, default="no", doc="autocast dtype"),
    "use_cpu": Field("bool", False, doc="train on CPU even when GPUs are present"),
    "gradient_accumulation_steps": Field("int", 1, minimum=1, doc="micro-batches per optimizer step"),
    "debug": Field("bool", False, doc="check shapes agree across ranks before collectives"),
    "tpu": Field("bool", False, doc="launch through torch_xla"),
    "main_training_function": Field("str", "main", doc="function of the script each TPU process calls"),
}

SECTIONS: dict[str, dict[str, Field]] = {
    "dynamo_config": {
        "dynamo_backend": _choice(
            "NO",
            "EAGER",
            "AOT_EAGER",
            "INDUCTOR",
            "CUDAGRAPHS",
            "ONNXRT",
            "OPENXLA",
            "TENSORRT",
            "TVM",
            "IPEX",
            default="NO",
        ),
        "dynamo_mode": _choice(*DYNAMO_MODES, default="default"),
        "dynamo_use_fullgraph": Field("bool", False),
        "dynamo_use_dynamic": Field("bool", None),
        "dynamo_use_regional_compilation": Field("bool", False),
    },
    "fsdp_config": {
        "fsdp_version": Field("int", 2, minimum=1, maximum=2),
        # FSDP2 takes a bool; Accelerate writes FSDP1's sharding strategy name into the same key.
        "fsdp_reshard_after_forward": Field(
            "bool_or_choice", True, ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
        ),
        "fsdp_sharding_strategy": _choice(
            "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2", default="FULL_SHARD"
        ),
        "fsdp_auto_wrap_policy": _choice("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP", default=None),
        "fsdp_transformer_layer_cls_to_wrap": Field("names", None),
        "fsdp_min_num_params": Field("int", 100_000_000, minimum=0),
        "fsdp_offload_params": Field("bool", False),
        "fsdp_state_dict_type": _choice(
            "FULL_STATE_DICT", "SHARDED_STATE_DICT", "LOCAL_STATE_DICT", default="FULL_STATE_DICT"
        ),
        "fsdp_activation_checkpointing": Field("bool", False),
        "fsdp_cpu_ram_efficient_loading": Field("bool", False),
        "fsdp_sync_module_states": Field("bool", True),
        "fsdp_use_orig_params": Field("bool", True),
        "fsdp_forward_prefetch": Field("bool", False),
        "fsdp_backward_prefetch": _choice("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH", default="BACKWARD_PRE"),
    },
    "deepspeed_config": {
        "deepspeed_config_file": Field("str", None),
        "zero_stage": Field("int", None, minimum=0, maximum=3),
        "offload_optimizer_device": _choice("none", "cpu", "nvme", default="none"),
        "offload_param_device": _choice("none", "cpu", "nvme", default="none"),
        "offload_optimizer_nvme_path": Field("str", None),
        "offload_param_nvme_path": Field("str", None),
        "gradient_accumulation_steps": Field("int", None, minimum=1),
        "gradient_clipping": Field("float", None, minimum=0),
        "zero3_init_flag": Field("bool", False),
        "zero3_save_16bit_model": Field("bool", False),
        "deepspeed_multinode_launcher": Field("str", None),
        "deepspeed_hostfile": Field("str", None),
        "deepspeed_inclusion_filter": Field("str", None),
        "deepspeed_exclusion_filter": Field("str", None),
        "deepspeed_moe_layer_cls_names": Field("names", None),
    },
}

# Written by Accelerate for features x does not offer; accepted so that its files load unchanged.
IGNORED_KEYS = frozenset(
    {
        "same_network",
        "enable_cpu_affinity",
        "downcast_bf16",
        "fp8_config",
        "ipex_config",
        "mpirun_config",
        "megatron_lm_config",
        "parallelism_config",
        "tpu_name",
        "tpu_zone",
        "tpu_use_cluster",
        "tpu_use_sudo",
        "tpu_vm",
        "tpu_env",
        "command_file",
        "commands",
        "iam_role_name",
        "image_uri",
        "profile",
        "region",
        "base_job_name",
        "pytorch_version",
        "transformers_version",
        "py_version",
        "sagemaker_inputs_file",
        "sagemaker_metrics_file",
        "additional_args",
    }
)


# Keys older Accelerate releases wrote at the top level, and where they live now.
LEGACY_KEYS = {"dynamo_backend": "dynamo_config.dynamo_backend"}


def nearest(key: str, known: set[str] | frozenset[str] | dict[str, Any]) -> str | None:
    """The known key closest to a misspelt one, if any is close."""
    matches = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return matches[0] if matches else None


def check_value(name: str, field: Field, value: Any) -> Any:
    """The value in canonical form, from YAML (typed) or a flag/variable (string).

    Raises:
        ValueError: one line naming the key, the value and what is accepted.
    """
    bad = ValueError(f"{name}: {value!r} is not valid: expected {field.describe()}")
    if value is None:
        return None
    kind = field.kind
    if kind == "bool_or_choice":
        try:
            return check_value(name, Field("bool"), value)
        except ValueError:
            try:
                return check_value(name, Field("choice", choices=field.choices), value)
            except ValueError:
                raise bad from None
    if kind == "bool":
        if isinstance(value, bool):
            return value
        word = str(value).strip().lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
        raise bad
    if kind in ("int", "float"):
        if isinstance(value, bool):
            raise bad
        try:
            number: float = int(str(value).strip(), 10) if kind == "int" else float(value)
        except (ValueError, TypeError):  # TypeError: a YAML list, mapping or date
            raise bad from None
        if kind == "float" and number != number:  # NaN
            raise bad
        if (field.minimum is not None and number < field.minimum) or (
            field.maximum is not None and number > field.maximum
        ):
            raise bad
        return number
    if kind == "choice":
        if isinstance(value, bool):
            # YAML 1.1 reads an unquoted NO / no / off as false: "distributed_type: NO" means "NO".
            value = "yes" if value else "no"
        for choice in field.choices:
            if str(value).strip().lower() == choice.lower():
                return choice
        raise bad
    if kind == "gpu_ids":
        text = ",".join(str(v) for v in value) if isinstance(value, list) else str(value).strip()
        if text.lower() == "all":
            return "all"
        parts = [p.strip() for p in text.split(",")]
        if not parts or not all(p.isdigit() for p in parts):
            raise bad
        return ",".join(parts)
    if kind == "names":
        items = value if isinstance(value, list) else str(value).split(",")
        names = [str(v).strip() for v in items]
        if not names or not all(names):
            raise bad
        return ",".join(names)
    if not isinstance(value, (str, int, float)) or isinstance(value, bool) or not str(value).strip():
        raise bad
    return str(value)
