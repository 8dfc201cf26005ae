"""The launch config file's keys: Accelerate's names, so an Accelerate ``default_config.yaml`` works.

The keys are the settings table's (``x_launch.config.launch_config.TABLE``): top-level ones, and
sections (``fsdp_config``, ``deepspeed_config``, ``dynamo_config``, ``parallelism_config``) checked key by key. Keys
that Accelerate writes for features x does not offer (SageMaker, Megatron-LM, mpirun, TPU pods)
are accepted and reported as ignored, so an existing file keeps working.
"""

from __future__ import annotations

import datetime
import difflib
from typing import Any

from x_common.kinds import GpuIds, StrList
from x_launch.config.launch_config import TABLE
from x_launch.config.option import Option
from x_launch.config.value_preview import preview

__all__ = ["IGNORED_KEYS", "LEGACY_KEYS", "SCHEMA", "SECTIONS", "all_fields", "check_value", "nearest"]

# Views of the table for the file's two levels; the rows are the table's own objects.
SCHEMA: dict[str, Option] = {row.key: row for row in TABLE if row.section is None}


def _sections() -> dict[str, dict[str, Option]]:
    sections: dict[str, dict[str, Option]] = {}
    for row in TABLE:
        if row.section is not None:
            sections.setdefault(row.section, {})[row.key.partition(".")[2]] = row
    return sections


SECTIONS: dict[str, dict[str, Option]] = _sections()


def all_fields() -> dict[str, Option]:
    """Every key: top-level ones, and "section.key" for section keys."""
    return {row.key: row for row in TABLE}


# The keys `accelerate config default` writes, which `x-launch config default` writes too.
DEFAULT_FILE_KEYS = (
    "compute_environment",
    "distributed_type",
    "num_machines",
    "num_processes",
    "machine_rank",
    "rdzv_backend",
    "gpu_ids",
    "mixed_precision",
    "use_cpu",
)


def machine_defaults(gpus: int) -> dict[str, Any]:
    """The config ``x-launch config default`` writes on a machine with ``gpus`` CUDA devices.

    Each key's value is the settings table's default, except the three this machine decides: one
    process per GPU (DDP over them when there are several), and the CPU when there is none.

    Examples:
        >>> machine_defaults(4)["distributed_type"], machine_defaults(4)["num_processes"]
        ('MULTI_GPU', 4)
        >>> machine_defaults(0)["use_cpu"], machine_defaults(0)["mixed_precision"]
        (True, 'no')
    """
    rows = all_fields()
    values = {key: rows[key].default for key in DEFAULT_FILE_KEYS}
    values["num_processes"] = max(gpus, rows["num_processes"].default)
    values["use_cpu"] = gpus == 0
    if gpus > 1:
        values["distributed_type"] = "MULTI_GPU"
    return values


# Written by Accelerate for features x does not offer; accepted so that its files load unchanged.
IGNORED_KEYS = frozenset(
    {
        "same_network",
        "enable_cpu_affinity",
        "fp8_config",
        "ipex_config",
        "mpirun_config",
        "megatron_lm_config",
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
    if len(key) > 100:  # no key is that long: nothing is close, and difflib would take its time
        return None
    matches = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return matches[0] if matches else None


# What a value may be before its kind looks at it: a kind converts through str(), and the error
# it raises holds repr(), both of which take as long as the value is big.
_SCALARS = (str, int, float, datetime.date)
_LIST_KINDS = (StrList, GpuIds)  # these also take a YAML list: [0, 1], [LlamaDecoderLayer, LlamaMLP]
MAX_TEXT = 4096  # characters; the longest setting is a path
MAX_ITEMS = 256


def check_value(name: str, field: Option, value: Any) -> Any:
    """The value in canonical form, from YAML (typed) or a flag/variable (string).

    A value of a shape no setting takes (a mapping, a nested list, a very long text, a huge
    integer) is refused before anything formats it, and the error shows a bounded preview.

    Raises:
        ValueError: one line naming the key, the value and what is accepted.
    """
    if value is None:
        return None
    if not _fits(field, value):
        raise _refused(name, field, value)
    try:
        return field.check(name, value)
    except ValueError:
        raise _refused(name, field, value) from None


def _fits(field: Option, value: Any) -> bool:
    if isinstance(value, list) and isinstance(field.kind, _LIST_KINDS):
        return len(value) <= MAX_ITEMS and all(_fits_scalar(item) for item in value)
    return _fits_scalar(value)


def _fits_scalar(value: Any) -> bool:
    if isinstance(value, str):
        return len(value) <= MAX_TEXT
    if isinstance(value, int):  # bool too
        return abs(value).bit_length() <= 4096  # str() of a bigger one is slow, then refused
    return isinstance(value, _SCALARS)


def _refused(name: str, field: Option, value: Any) -> ValueError:
    # The kinds' own wording (x_common.kinds), with the value shown within bounds.
    return ValueError(f"{name}: {preview(value)} is not valid: expected {field.describe()}")
