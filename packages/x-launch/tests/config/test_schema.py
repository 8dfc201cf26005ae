"""The launch config's keys and value checks: canonical values, one-line errors, Accelerate's keys."""

from __future__ import annotations

import datetime
import inspect
import re
import time
from typing import Any

import pytest

from x_common import env
from x_common.kinds import Bool, Choice, Float, Int
from x_launch.config.schema import IGNORED_KEYS, SCHEMA, SECTIONS, all_fields, check_value, nearest
from x_launch.config.value_preview import preview


def typed(value: Any) -> tuple[str, Any]:
    """(type name, value): makes ``True == 1`` and ``2 == 2.0`` count as different."""
    return type(value).__name__, value


FIELDS = all_fields()


# --- accepted values come back in canonical form ---------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("num_processes", 4, 4),
        ("num_processes", "4", 4),  # from a flag or an X_LAUNCH_* variable
        ("num_processes", " 8 ", 8),
        ("main_process_port", 0, 0),  # 0 picks a free port
        ("main_process_port", 65535, 65535),
        ("machine_rank", 0, 0),
        ("use_cpu", True, True),
        ("use_cpu", False, False),
        ("use_cpu", "yes", True),
        ("use_cpu", "Off", False),
        ("use_cpu", "1", True),
        ("use_cpu", "0", False),
        ("mixed_precision", "BF16", "bf16"),
        ("mixed_precision", " fp16 ", "fp16"),
        ("mixed_precision", False, "no"),  # YAML 1.1 reads an unquoted `no` as false
        ("distributed_type", "multi_gpu", "MULTI_GPU"),
        ("distributed_type", False, "NO"),  # unquoted `NO`
        ("compute_environment", "local_machine", "LOCAL_MACHINE"),
        ("rdzv_backend", "C10D", "c10d"),
        ("gpu_ids", "all", "all"),
        ("gpu_ids", "ALL", "all"),
        ("gpu_ids", 0, "0"),
        ("gpu_ids", "0, 1,2", "0,1,2"),
        ("gpu_ids", [0, 1], "0,1"),
        ("main_process_ip", "10.0.0.1", "10.0.0.1"),
        ("fsdp_config.fsdp_version", 1, 1),
        ("fsdp_config.fsdp_version", "2", 2),
        ("fsdp_config.fsdp_transformer_layer_cls_to_wrap", "LlamaDecoderLayer", "LlamaDecoderLayer"),
        ("fsdp_config.fsdp_transformer_layer_cls_to_wrap", ["BertLayer", "BertEmbeddings"], "BertLayer,BertEmbeddings"),
        ("fsdp_config.fsdp_transformer_layer_cls_to_wrap", "BertLayer, BertSelfOutput", "BertLayer,BertSelfOutput"),
        ("fsdp_config.fsdp_state_dict_type", "sharded_state_dict", "SHARDED_STATE_DICT"),
        ("deepspeed_config.zero_stage", 0, 0),
        ("deepspeed_config.zero_stage", 3, 3),
        ("deepspeed_config.gradient_clipping", 1.0, 1.0),
        ("deepspeed_config.gradient_clipping", "0.5", 0.5),
        ("deepspeed_config.offload_optimizer_device", "CPU", "cpu"),
        ("dynamo_config.dynamo_backend", "inductor", "INDUCTOR"),
        ("dynamo_config.dynamo_mode", "max-autotune", "max-autotune"),
        ("num_processes", None, None),
    ],
)
def test_accepted_value_is_canonical(key: str, value: Any, expected: Any) -> None:
    assert typed(check_value(key, FIELDS[key], value)) == typed(expected)


def test_integer_fields_return_int_not_float() -> None:
    assert typed(check_value("deepspeed_config.zero_stage", FIELDS["deepspeed_config.zero_stage"], "2")) == ("int", 2)
    assert typed(
        check_value("deepspeed_config.gradient_clipping", FIELDS["deepspeed_config.gradient_clipping"], 1)
    ) == (
        "float",
        1.0,
    )


# --- rejected values: one line naming the key, the value and what is accepted -----------------


@pytest.mark.parametrize(
    ("key", "value", "accepted"),
    [
        ("num_processes", 0, "an integer >= 1"),
        ("num_processes", -2, "an integer >= 1"),
        ("num_processes", 2.5, "an integer >= 1"),
        ("num_processes", "two", "an integer >= 1"),
        ("num_processes", True, "an integer >= 1"),  # a bool is not a count
        ("main_process_port", 70000, "an integer from 0 to 65535"),
        ("main_process_port", -1, "an integer from 0 to 65535"),
        ("mixed_precision", "fp32", "one of no, fp16, bf16, fp8"),
        ("mixed_precision", True, "one of no, fp16, bf16, fp8"),  # unquoted `yes`
        ("distributed_type", "bogus", "one of NO, MULTI_CPU, MULTI_GPU, MULTI_XPU, FSDP, DEEPSPEED, XLA"),
        ("use_cpu", "maybe", "true or false"),
        ("use_cpu", 2, "true or false"),
        ("gpu_ids", "a,b", "'all' or comma-separated GPU indices such as 0,1"),
        ("gpu_ids", "0,,1", "'all' or comma-separated GPU indices such as 0,1"),
        ("gpu_ids", "", "'all' or comma-separated GPU indices such as 0,1"),
        ("gpu_ids", -1, "'all' or comma-separated GPU indices such as 0,1"),
        ("main_process_ip", "", "a string"),
        ("main_process_ip", ["10.0.0.1"], "a string"),
        ("main_process_ip", True, "a string"),
        ("fsdp_config.fsdp_version", 3, "an integer from 1 to 2"),
        ("fsdp_config.fsdp_transformer_layer_cls_to_wrap", "A,,B", "comma-separated names"),
        ("deepspeed_config.zero_stage", 4, "an integer from 0 to 3"),
        ("deepspeed_config.gradient_clipping", -0.1, "a number >= 0"),
        ("deepspeed_config.gradient_clipping", "nan", "a number >= 0"),
        ("deepspeed_config.gradient_clipping", "abc", "a number >= 0"),
        ("deepspeed_config.gradient_clipping", False, "a number >= 0"),
        (
            "dynamo_config.dynamo_mode",
            "fast",
            "one of default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs",
        ),
    ],
)
def test_rejected_value_is_one_line_with_key_value_and_accepted_values(key: str, value: Any, accepted: str) -> None:
    with pytest.raises(ValueError) as info:
        check_value(key, FIELDS[key], value)
    assert str(info.value) == f"{key}: {value!r} is not valid: expected {accepted}"
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "value",
    [[1.0], {"max": 1.0}, datetime.date(2024, 1, 1)],
    ids=["list", "mapping", "yaml-date"],
)
def test_number_field_rejects_non_scalar_yaml_value_with_value_error(value: Any) -> None:
    # `gradient_clipping: [1.0]` or `gradient_clipping: 2024-01-01` in a YAML file must be a
    # one-line ValueError like every other bad value, not a TypeError from float().
    field = FIELDS["deepspeed_config.gradient_clipping"]
    with pytest.raises(
        ValueError, match=r"^deepspeed_config\.gradient_clipping: .* is not valid: expected a number >= 0$"
    ):
        check_value("deepspeed_config.gradient_clipping", field, value)


SHARED_SHOWN = "[" * 7 + "'lol', " * 7 + "'lol... (a list of 9 items)"


def _shared_lists(levels: int) -> list:
    """What YAML aliases build: ``levels`` lists of 9 copies of the one below, 9**levels items."""
    value: Any = ["lol"] * 9
    for _ in range(levels - 1):
        value = [value] * 9
    return value


@pytest.mark.parametrize(
    ("key", "value", "shown"),
    [
        ("num_processes", _shared_lists(7), SHARED_SHOWN),
        ("mixed_precision", _shared_lists(7), SHARED_SHOWN),
        (
            "use_cpu",
            {f"k{i}": list(range(100)) for i in range(1000)},
            "{'k0': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15... (a mapping of 1000 keys)",
        ),
        (
            "gpu_ids",
            [[0, 1]] * 100_000,
            "[[0, 1], [0, 1], [0, 1], [0, 1], [0, 1], [0, 1], [0, 1], [0,... (a list of 100000 items)",
        ),
        (
            "gpu_ids",
            list(range(100_000)),
            "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 1... (a list of 100000 items)",
        ),
        ("main_process_ip", "1" * 1_000_000, "'" + "1" * 59 + "... (1000000 characters)"),
        ("num_processes", 2**20000, "<an integer of about 6021 digits>"),
        ("num_processes", {1, 2}, "{1, 2}"),
        ("num_processes", b"\x00" * 10, repr(b"\x00" * 10)),
    ],
    ids=[
        "shared-lists-int",
        "shared-lists-choice",
        "big-mapping",
        "nested-lists",
        "long-list",
        "long-text",
        "huge-int",
        "set",
        "bytes",
    ],
)
def test_value_of_the_wrong_shape_is_refused_before_it_is_formatted(key: str, value: Any, shown: str) -> None:
    # str() of the shared lists is 4.8 million items: the kinds' str() and repr() took seconds
    # and megabytes, and with two more levels (a 600-byte file) hung with gigabytes.
    start = time.perf_counter()
    with pytest.raises(ValueError) as info:
        check_value(key, FIELDS[key], value)
    assert time.perf_counter() - start < 0.1
    assert str(info.value) == f"{key}: {shown} is not valid: expected {FIELDS[key].describe()}"


def test_a_short_list_still_works_where_a_list_is_taken() -> None:
    assert check_value("gpu_ids", FIELDS["gpu_ids"], list(range(8))) == "0,1,2,3,4,5,6,7"


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("fp32", "'fp32'"),
        ([1.0], "[1.0]"),
        ((1,), "(1,)"),
        (set(), "set()"),
        ({"a": [1, (2, 3)]}, "{'a': [1, (2, 3)]}"),
        (datetime.date(2024, 1, 1), "datetime.date(2024, 1, 1)"),
        ("x" * 61, "'" + "x" * 59 + "... (61 characters)"),
        (list(range(30)), "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 1... (a list of 30 items)"),
        ([[]] * 1, "[[]]"),
    ],
)
def test_preview_is_repr_when_short_and_bounded_when_not(value: Any, shown: str) -> None:
    assert preview(value) == shown
    assert len(preview(value)) <= 60 + len("... (a mapping of 1000000000 keys)")


def test_preview_of_a_list_that_holds_itself_ends() -> None:
    endless: list = []
    endless.append(endless)
    assert preview(endless) == "[" * 60 + "... (a list of 1 item)"


def test_describe_texts() -> None:
    assert Int(minimum=1).describe() == "an integer >= 1"
    assert Int(minimum=0, maximum=65535).describe() == "an integer from 0 to 65535"
    assert Int().describe() == "an integer"
    assert Float(minimum=0).describe() == "a number >= 0"
    assert Choice(("a", "b")).describe() == "one of a, b"
    assert Bool().describe() == "true or false"


# --- the key sets -----------------------------------------------------------------------------


def test_nearest_suggests_close_keys_only() -> None:
    known = {*SCHEMA, *SECTIONS, *IGNORED_KEYS}
    assert nearest("num_proceses", known) == "num_processes"
    assert nearest("mixed_precison", known) == "mixed_precision"
    assert nearest("fsdp_verison", SECTIONS["fsdp_config"]) == "fsdp_version"
    assert nearest("zzzz", known) is None


def test_key_sets_do_not_overlap() -> None:
    assert not set(SCHEMA) & set(SECTIONS)
    assert not set(SCHEMA) & IGNORED_KEYS
    assert not set(SECTIONS) & IGNORED_KEYS


def test_every_default_is_already_canonical() -> None:
    for key, field in FIELDS.items():
        assert typed(check_value(key, field, field.default)) == typed(field.default), key


# Runtime variables that carry a config key to the training process: the launcher's default
# must be the runtime's default, or an unset key would mean different things on each side.
# The table says which variable carries which key; a few pairs are pinned here so that a row
# losing its variable (or getting another one) fails; test_contract_env.py checks that every
# row's variable reaches the child environment.
PINNED_PAIRS = {
    "mixed_precision": env.MIXED_PRECISION,
    "use_cpu": env.USE_CPU,
    "debug": env.DEBUG_MODE,
    "dynamo_config.dynamo_backend": env.DYNAMO_BACKEND,
    "fsdp_config.fsdp_reshard_after_forward": env.FSDP_RESHARD_AFTER_FORWARD,
    "fsdp_config.fsdp_transformer_layer_cls_to_wrap": env.FSDP_TRANSFORMER_CLS_TO_WRAP,
    "deepspeed_config.zero3_init_flag": env.DEEPSPEED_ZERO3_INIT,
}
CARRIED = {key: field.env for key, field in FIELDS.items() if field.env is not None}
# Variables the runtime reads as text, unset meaning its handler's own default: the launcher checks
# the value and writes accelerate launch's default (its --parallelism_config_* defaults) when in use.
LAUNCH_DEFAULTS = {
    "parallelism_config.parallelism_config_cp_comm_strategy": ("allgather", ("allgather", "alltoall")),
    "parallelism_config.parallelism_config_sp_attn_implementation": ("sdpa", ()),
}


def test_pinned_keys_travel_as_their_variables() -> None:
    assert {key: CARRIED.get(key) for key in PINNED_PAIRS} == PINNED_PAIRS
    # Keys the runtime does not read carry nothing.
    assert not {"num_machines", "gpu_ids", "deepspeed_config.gradient_accumulation_steps"} & set(CARRIED)


def test_no_two_keys_travel_as_one_variable() -> None:
    assert len(set(CARRIED.values())) == len(CARRIED)


@pytest.mark.parametrize("key", sorted(CARRIED))
def test_config_default_and_choices_match_the_runtime_contract(key: str) -> None:
    field, var = FIELDS[key], CARRIED[key]
    if key in LAUNCH_DEFAULTS:
        assert var.default is None and (field.default, field.choices) == LAUNCH_DEFAULTS[key]
        return
    if key == "distributed_type":
        # The runtime's None means "not launched by x-launch"; the launcher always sends a type.
        assert var.default is None and field.default in field.choices
        return
    if isinstance(field.default, str):
        assert field.default.lower() == var.default.lower()
    else:
        assert typed(field.default) == typed(var.default)
    runtime_choices = getattr(var.kind, "choices", None)
    if isinstance(field.kind, Choice):
        assert [c.lower() for c in field.choices] == [c.lower() for c in runtime_choices]


# --- Accelerate writes only keys that x knows --------------------------------------------------


def test_every_top_level_key_accelerate_can_write_is_known() -> None:
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    written = set(config_args.ClusterConfig.__dataclass_fields__)
    assert written, "ClusterConfig has no fields: accelerate changed shape"
    assert written - {*SCHEMA, *SECTIONS, *IGNORED_KEYS} == set()


@pytest.mark.parametrize("section", ["fsdp_config", "deepspeed_config", "dynamo_config", "parallelism_config"])
def test_every_section_key_accelerates_questionnaire_writes_is_known(section: str) -> None:
    cluster = pytest.importorskip("accelerate.commands.config.cluster")
    source = inspect.getsource(cluster)
    keys = set(re.findall(rf'{section}\["(\w+)"\]', source))
    # written as dynamo_config[prefix + "backend"] with prefix = "dynamo_" (parallelism_config: "parallelism_config_")
    prefix = {"dynamo_config": "dynamo_", "parallelism_config": "parallelism_config_"}.get(section)
    if prefix is not None:
        keys |= {prefix + k for k in re.findall(rf'{section}\[prefix \+ "(\w+)"\]', source)}
    assert len(keys) >= 5, f"found only {sorted(keys)} in accelerate's questionnaire: the pattern is stale"
    assert keys - set(SECTIONS[section]) == set()
