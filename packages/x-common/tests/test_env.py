"""The launcher -> runtime environment contract: names, kinds, round trips and error text."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

from x_common import env
from x_common.env import CONTRACT, FOREIGN, EnvVar, launch_flag_var, read_contract, to_environ
from x_common.kinds import Bool, Choice, Float, Int, Str, StrList

PACKAGES = Path(__file__).resolve().parents[2]  # .../packages

FOREIGN_NAMES = {
    # torch.distributed / torchrun
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "PET_SIGNALS_TO_HANDLE",
    "PET_LOCAL_ADDR",
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
    # SLURM
    "SLURM_JOB_ID",
    "SLURM_JOB_NODELIST",
    "SLURM_NNODES",
    "SLURM_NODEID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_CPUS_PER_TASK",
    "SLURM_GPUS_ON_NODE",
    "SLURM_STEP_ID",
    "SLURM_STEP_NODELIST",
    # CUDA, XLA
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "PJRT_DEVICE",
    "CPU_NUM_DEVICES",
    "XLA_DOWNCAST_BF16",
    # DeepSpeed
    "DS_ACCELERATOR",
    "HF_TOKEN",
    "XDG_CACHE_HOME",
    "XDG_CONFIG_HOME",
    "HF_HOME",
    "ACCELERATE_FP8_BACKEND",
    "ACCELERATE_ENABLE_RICH",
    # Accelerate's ParallelismConfig
    "PARALLELISM_CONFIG_DP_REPLICATE_SIZE",
    "PARALLELISM_CONFIG_DP_SHARD_SIZE",
    "PARALLELISM_CONFIG_TP_SIZE",
    "PARALLELISM_CONFIG_CP_SIZE",
    "PARALLELISM_CONFIG_CP_BACKEND",
    "PARALLELISM_CONFIG_SP_SIZE",
    "PARALLELISM_CONFIG_SP_BACKEND",
    "PARALLELISM_CONFIG_CP_COMM_STRATEGY",
    "PARALLELISM_CONFIG_SP_SEQ_LENGTH",
    "PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE",
    "PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION",
    "ACCELERATE_USE_PARALLELISM_CONFIG",
}


def module_env_vars() -> dict[str, EnvVar]:
    return {name: value for name, value in vars(env).items() if isinstance(value, EnvVar)}


# --- the tables -------------------------------------------------------------------------


def test_contract_names_are_prefixed_and_unique() -> None:
    names = [var.name for var in CONTRACT]
    assert (
        len(names) == 43
    )  # + X_FAILURE_REPORT, X_TORCH_DEVICE, X_PROGRESS_DIR, X_PROVIDE_ACCELERATE, X_MEMORY_GUARD, X_MEMORY_BUDGET
    assert len(set(names)) == len(names)
    for name in names:
        assert re.fullmatch(r"X_[A-Z][A-Z0-9_]*", name), name
        assert not name.startswith(env.LAUNCH_FLAG_PREFIX), f"{name} would collide with launch flag variables"


def test_foreign_names_are_the_real_ones() -> None:
    assert {var.name for var in FOREIGN} == FOREIGN_NAMES
    assert len(FOREIGN) == len(FOREIGN_NAMES)


def test_every_module_variable_is_in_exactly_one_table() -> None:
    everything = module_env_vars()
    assert set(CONTRACT) | set(FOREIGN) == set(everything.values())
    assert set(CONTRACT) & set(FOREIGN) == set()
    for attribute in everything:
        assert attribute in env.__all__


def test_defaults_are_valid_values_of_their_kind() -> None:
    for var in (*CONTRACT, *FOREIGN):
        if var.default is not None:
            assert var.read({var.name: var.format(var.default)}) == var.default, var.name


@pytest.mark.parametrize(
    ("var", "default"),
    [
        (env.LAUNCHED_BY_X, False),
        (env.MIXED_PRECISION, "no"),
        (env.GRADIENT_ACCUMULATION_STEPS, 1),
        (env.PROCESS_GROUP_TIMEOUT, 1800),
        (env.DYNAMO_DYNAMIC, None),
        (env.FSDP_VERSION, 2),
        (env.FSDP_RESHARD_AFTER_FORWARD, True),
        (env.FSDP_MIN_NUM_PARAMS, 100_000_000),
        (env.DEEPSPEED_ZERO_STAGE, None),
        (env.RANK, None),
    ],
    ids=lambda v: v.name if isinstance(v, EnvVar) else repr(v),
)
def test_unset_reads_default(var: EnvVar, default: Any) -> None:
    assert var.read({}) == default
    assert var.read({var.name: ""}) == default  # empty counts as unset
    assert var.read({var.name: "   "}) == default
    assert var.read({"OTHER": "1"}) == default


# --- round trips: every contract variable ------------------------------------------------


def sample_values(var: EnvVar) -> list[Any]:
    kind = var.kind
    if isinstance(kind, Bool):
        return [True, False]
    if isinstance(kind, Int):
        low = 0 if kind.minimum is None else kind.minimum
        high = low + 1000 if kind.maximum is None else kind.maximum
        return sorted({low, (low + high) // 2, high})
    if isinstance(kind, Float):
        return [0.0 if kind.minimum is None else kind.minimum, 1.5, 1e-3, 12345.678]
    if isinstance(kind, Choice):
        return list(kind.choices)
    if isinstance(kind, Str):
        return ["/tmp/config file.yaml", "x"]
    if isinstance(kind, StrList):
        return [("LlamaDecoderLayer",), ("LlamaDecoderLayer", "LlamaMLP")]
    raise AssertionError(f"no samples for kind {kind!r} of {var.name}")


@pytest.mark.parametrize("var", CONTRACT, ids=lambda v: v.name)
def test_write_read_round_trip(var: EnvVar) -> None:
    for value in sample_values(var):
        environ: dict[str, str] = {}
        text = var.write(value, environ)
        assert environ == {var.name: text}
        assert text == var.format(value)
        assert var.is_set(environ)
        assert var.read(environ) == value


# --- each kind ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        *[(word, True) for word in ("1", "true", "TRUE", "True", "yes", "YES", "on", "On", " true ")],
        *[(word, False) for word in ("0", "false", "FALSE", "no", "No", "off", "OFF", "\tno\n")],
    ],
)
def test_bool_words(raw: str, expected: bool) -> None:
    assert env.USE_CPU.read({"X_USE_CPU": raw}) is expected


@pytest.mark.parametrize("raw", ["2", "maybe", "y", "n", "t", "enabled", "-1", "1.0"])
def test_bool_malformed(raw: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        env.USE_CPU.read({"X_USE_CPU": raw})
    assert str(excinfo.value) == (
        f"X_USE_CPU={raw!r} is not valid: expected a boolean (1, true, yes, on or 0, false, no, off)"
    )


def test_bool_format() -> None:
    assert env.USE_CPU.format(True) == "1"
    assert env.USE_CPU.format(False) == "0"
    for value in ("1", 1, 0, None):
        with pytest.raises(ValueError) as excinfo:
            env.USE_CPU.format(value)
        assert str(excinfo.value) == f"X_USE_CPU={value!r} is not valid: expected True or False"


@pytest.mark.parametrize(
    ("var", "raw", "expected"),
    [
        (env.GRADIENT_ACCUMULATION_STEPS, "4", 4),
        (env.GRADIENT_ACCUMULATION_STEPS, " 16 ", 16),
        (env.GRADIENT_ACCUMULATION_STEPS, "1", 1),
        (env.FSDP_VERSION, "1", 1),
        (env.FSDP_VERSION, "2", 2),
        (env.FSDP_MIN_NUM_PARAMS, "0", 0),
        (env.DEEPSPEED_ZERO_STAGE, "3", 3),
        (env.MASTER_PORT, "65535", 65535),
        (env.MASTER_PORT, "0", 0),
    ],
    ids=lambda v: v.name if isinstance(v, EnvVar) else repr(v),
)
def test_int_parse(var: EnvVar, raw: str, expected: int) -> None:
    assert var.read({var.name: raw}) == expected


@pytest.mark.parametrize(
    ("var", "raw", "accepted"),
    [
        (env.GRADIENT_ACCUMULATION_STEPS, "0", "an integer >= 1"),
        (env.GRADIENT_ACCUMULATION_STEPS, "-3", "an integer >= 1"),
        (env.GRADIENT_ACCUMULATION_STEPS, "four", "an integer >= 1"),
        (env.GRADIENT_ACCUMULATION_STEPS, "2.0", "an integer >= 1"),
        (env.GRADIENT_ACCUMULATION_STEPS, "0x10", "an integer >= 1"),
        (env.FSDP_VERSION, "3", "an integer from 1 to 2"),
        (env.FSDP_VERSION, "0", "an integer from 1 to 2"),
        (env.DEEPSPEED_ZERO_STAGE, "4", "an integer from 0 to 3"),
        (env.MASTER_PORT, "65536", "an integer from 0 to 65535"),
        (env.RANK, "-1", "an integer >= 0"),
    ],
    ids=lambda v: v.name if isinstance(v, EnvVar) else repr(v),
)
def test_int_malformed(var: EnvVar, raw: str, accepted: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        var.read({var.name: raw})
    assert str(excinfo.value) == f"{var.name}={raw!r} is not valid: expected {accepted}"


def test_int_format() -> None:
    assert env.GRADIENT_ACCUMULATION_STEPS.format(8) == "8"
    assert env.FSDP_VERSION.format(1) == "1"
    for value in (True, 2.0, "2", None):
        with pytest.raises(ValueError) as excinfo:
            env.FSDP_VERSION.format(value)
        assert str(excinfo.value) == f"X_FSDP_VERSION={value!r} is not valid: expected an integer from 1 to 2"
    with pytest.raises(ValueError) as excinfo:
        env.FSDP_VERSION.format(3)
    assert str(excinfo.value) == "X_FSDP_VERSION=3 is not valid: expected an integer from 1 to 2"
    assert Int().format("N", -5) == "-5"
    with pytest.raises(ValueError, match=r"^N='x' is not valid: expected an integer$"):
        Int().parse("N", "x")


def test_float_parse_and_format() -> None:
    var = env.DEEPSPEED_GRADIENT_CLIPPING
    assert var.read({var.name: "1.0"}) == 1.0
    assert var.read({var.name: " 0 "}) == 0.0
    assert var.read({var.name: "1e-3"}) == 1e-3
    assert var.format(1) == "1.0"
    assert var.format(0.1) == "0.1"
    assert var.read({var.name: var.format(1 / 3)}) == 1 / 3  # repr keeps every digit
    assert Float().parse("F", "-2.5") == -2.5


@pytest.mark.parametrize("raw", ["nan", "NaN", "inf", "-inf", "Infinity", "-0.5", "one", ""])
def test_float_malformed(raw: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        env.DEEPSPEED_GRADIENT_CLIPPING.kind.parse("X_DEEPSPEED_GRADIENT_CLIPPING", raw)
    assert str(excinfo.value) == f"X_DEEPSPEED_GRADIENT_CLIPPING={raw!r} is not valid: expected a number >= 0"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -0.5, True, "1.0", None])
def test_float_format_rejects(value: object) -> None:
    with pytest.raises(ValueError) as excinfo:
        env.DEEPSPEED_GRADIENT_CLIPPING.format(value)
    assert str(excinfo.value) == f"X_DEEPSPEED_GRADIENT_CLIPPING={value!r} is not valid: expected a number >= 0"


def test_float_without_minimum_rejects_nan() -> None:
    with pytest.raises(ValueError, match=r"^F='nan' is not valid: expected a number$"):
        Float().parse("F", "nan")


@pytest.mark.parametrize(
    ("var", "raw", "canonical"),
    [
        (env.MIXED_PRECISION, "BF16", "bf16"),
        (env.MIXED_PRECISION, " fp8 ", "fp8"),
        (env.MIXED_PRECISION, "No", "no"),
        (env.DISTRIBUTED_TYPE, "fsdp", "FSDP"),
        (env.DISTRIBUTED_TYPE, "multi_gpu", "MULTI_GPU"),
        (env.DYNAMO_MODE, "MAX-AUTOTUNE", "max-autotune"),
        (env.FSDP_SHARDING_STRATEGY, "hybrid_shard_zero2", "HYBRID_SHARD_ZERO2"),
        (env.PJRT_DEVICE, "tpu", "TPU"),
    ],
    ids=lambda v: v.name if isinstance(v, EnvVar) else repr(v),
)
def test_choice_is_case_insensitive_and_canonical(var: EnvVar, raw: str, canonical: str) -> None:
    assert var.read({var.name: raw}) == canonical
    assert var.format(raw) == canonical
    assert var.write(raw, {}) == canonical


def test_choice_malformed() -> None:
    with pytest.raises(ValueError) as excinfo:
        env.MIXED_PRECISION.read({"X_MIXED_PRECISION": "fp32"})
    assert str(excinfo.value) == "X_MIXED_PRECISION='fp32' is not valid: expected one of no, fp16, bf16, fp8"
    with pytest.raises(ValueError) as excinfo:
        env.MIXED_PRECISION.format(16)
    assert str(excinfo.value) == "X_MIXED_PRECISION=16 is not valid: expected one of no, fp16, bf16, fp8"
    with pytest.raises(ValueError) as excinfo:
        env.DISTRIBUTED_TYPE.read({"X_DISTRIBUTED_TYPE": "DDP"})
    assert str(excinfo.value) == (
        "X_DISTRIBUTED_TYPE='DDP' is not valid: expected one of NO, MULTI_CPU, MULTI_GPU, MULTI_XPU, FSDP, DEEPSPEED, XLA"
    )


def test_str() -> None:
    var = env.CONFIG_FILE
    assert var.read({var.name: " a b "}) == " a b "  # kept as written
    assert var.format("cfg.yaml") == "cfg.yaml"
    with pytest.raises(ValueError) as excinfo:
        var.format("  ")
    assert str(excinfo.value) == "X_CONFIG_FILE='  ' is not valid: expected a non-empty string"
    with pytest.raises(ValueError) as excinfo:
        var.format(5)
    assert str(excinfo.value) == "X_CONFIG_FILE=5 is not valid: expected a string"


def test_str_list() -> None:
    var = env.FSDP_TRANSFORMER_CLS_TO_WRAP
    assert var.read({var.name: "LlamaDecoderLayer"}) == ("LlamaDecoderLayer",)
    assert var.read({var.name: " A , B,C "}) == ("A", "B", "C")
    assert var.format(["A", "B"]) == "A,B"
    assert var.format(("A", " B ")) == "A,B"
    for raw in ("A,,B", "A,", ",A", " , "):
        with pytest.raises(ValueError) as excinfo:
            var.read({var.name: raw})
        assert str(excinfo.value) == (
            f"X_FSDP_TRANSFORMER_CLS_TO_WRAP={raw!r} is not valid: "
            "expected comma-separated non-empty names, e.g. 'LlamaDecoderLayer,LlamaMLP'"
        )
    for value in ("A,B", ["A", 1]):
        with pytest.raises(ValueError) as excinfo:
            var.format(value)
        assert str(excinfo.value) == f"X_FSDP_TRANSFORMER_CLS_TO_WRAP={value!r} is not valid: expected a list of names"


@pytest.mark.parametrize("value", [5, 1.5, None, object()])
def test_str_list_format_non_iterable_raises_value_error(value: object) -> None:
    # EnvVar.format documents ValueError for a value not of the variable's kind.
    with pytest.raises(ValueError, match=r"^X_FSDP_TRANSFORMER_CLS_TO_WRAP=.* is not valid: expected a list of names$"):
        env.FSDP_TRANSFORMER_CLS_TO_WRAP.format(value)


def test_write_refuses_without_touching_environ() -> None:
    environ: dict[str, str] = {}
    with pytest.raises(ValueError, match=r"^X_FSDP_VERSION=7 is not valid"):
        env.FSDP_VERSION.write(7, environ)
    assert environ == {}


# --- os.environ as the default mapping ---------------------------------------------------


def test_read_write_default_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("X_MIXED_PRECISION", "placeholder")  # restored after the test
    assert env.MIXED_PRECISION.write("FP16") == "fp16"
    import os

    assert os.environ["X_MIXED_PRECISION"] == "fp16"
    assert env.MIXED_PRECISION.read() == "fp16"
    assert env.MIXED_PRECISION.is_set()
    monkeypatch.setenv("X_MIXED_PRECISION", "")
    assert not env.MIXED_PRECISION.is_set()
    assert env.MIXED_PRECISION.read() == "no"
    monkeypatch.delenv("X_MIXED_PRECISION")
    assert not env.MIXED_PRECISION.is_set()


@pytest.mark.parametrize(("raw", "expected"), [(None, False), ("", False), ("  ", False), ("0", True), ("x", True)])
def test_is_set(raw: str | None, expected: bool) -> None:
    environ = {} if raw is None else {"X_USE_CPU": raw}
    assert env.USE_CPU.is_set(environ) is expected


# --- whole contract ----------------------------------------------------------------------


def test_read_contract_defaults() -> None:
    values = read_contract({})
    assert values == {var.name: var.default for var in CONTRACT}
    assert list(values) == [var.name for var in CONTRACT]


def test_read_contract_values() -> None:
    values = read_contract({"X_USE_CPU": "yes", "X_MIXED_PRECISION": "BF16", "X_FSDP_VERSION": "1", "RANK": "junk"})
    assert values["X_USE_CPU"] is True
    assert values["X_MIXED_PRECISION"] == "bf16"
    assert values["X_FSDP_VERSION"] == 1
    assert "RANK" not in values  # foreign variables are not part of the contract


def test_read_contract_lists_every_problem() -> None:
    environ = {"X_USE_CPU": "maybe", "X_FSDP_VERSION": "9", "X_MIXED_PRECISION": "fp32", "X_DEBUG_MODE": "1"}
    with pytest.raises(ValueError) as excinfo:
        read_contract(environ)
    assert str(excinfo.value).splitlines() == [
        "X_MIXED_PRECISION='fp32' is not valid: expected one of no, fp16, bf16, fp8",
        "X_USE_CPU='maybe' is not valid: expected a boolean (1, true, yes, on or 0, false, no, off)",
        "X_FSDP_VERSION='9' is not valid: expected an integer from 1 to 2",
    ]


def test_to_environ() -> None:
    assert to_environ({env.USE_CPU: True, env.GRADIENT_ACCUMULATION_STEPS: 4, env.DYNAMO_DYNAMIC: None}) == {
        "X_USE_CPU": "1",
        "X_GRADIENT_ACCUMULATION_STEPS": "4",
    }
    assert to_environ({env.DYNAMO_DYNAMIC: False, env.MIXED_PRECISION: "BF16"}) == {
        "X_DYNAMO_DYNAMIC": "0",
        "X_MIXED_PRECISION": "bf16",
    }
    assert to_environ({}) == {}
    with pytest.raises(ValueError, match=r"^X_GRADIENT_ACCUMULATION_STEPS=0 is not valid: expected an integer >= 1$"):
        to_environ({env.GRADIENT_ACCUMULATION_STEPS: 0})


def test_to_environ_round_trips_through_read_contract() -> None:
    chosen = {env.DISTRIBUTED_TYPE: "FSDP", env.FSDP_TRANSFORMER_CLS_TO_WRAP: ("Block",), env.USE_CPU: False}
    values = read_contract(to_environ(chosen))
    for var, value in chosen.items():
        assert values[var.name] == value


# --- launch flags ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "name"),
    [
        ("--num_processes", "X_LAUNCH_NUM_PROCESSES"),
        ("--num-processes", "X_LAUNCH_NUM_PROCESSES"),
        ("--mixed_precision", "X_LAUNCH_MIXED_PRECISION"),
        ("--main-process-port", "X_LAUNCH_MAIN_PROCESS_PORT"),
        ("-m", "X_LAUNCH_M"),
        ("num_machines", "X_LAUNCH_NUM_MACHINES"),
        ("--fp8", "X_LAUNCH_FP8"),
    ],
)
def test_launch_flag_var(flag: str, name: str) -> None:
    assert launch_flag_var(flag) == name


@pytest.mark.parametrize(
    "flag", ["", "-", "--", "---", "--num processes", "--num=4", "--a.b", "--x/y", "--$HOME", "--a,b"]
)
def test_launch_flag_var_rejects(flag: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        launch_flag_var(flag)
    assert str(excinfo.value) == f"invalid flag {flag!r}: expected a long option such as '--num_processes'"


@pytest.mark.parametrize("flag", ["--café", "--x²"])
def test_launch_flag_var_rejects_non_ascii(flag: str) -> None:
    # Environment variable names are ASCII letters, digits and '_'; str.isalnum admits more.
    with pytest.raises(ValueError, match=r"^invalid flag "):
        launch_flag_var(flag)


# --- design rule: variable names live in x_common/env.py only ----------------------------


def test_contract_names_are_spelled_only_in_env_module() -> None:
    contract_names = {var.name for var in CONTRACT}
    literal = re.compile(r"""(?<![A-Za-z0-9_])[rbuRBUfF]*["'](X_[A-Z][A-Z0-9_]*)""")
    sources = sorted(PACKAGES.glob("*/src/**/*.py"))
    env_module = PACKAGES / "x-common" / "src" / "x_common" / "env.py"
    assert env_module in sources
    offenders = []
    for path in sources:
        if path == env_module:
            continue
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in literal.finditer(line):
                name = match.group(1)
                if name in contract_names or name.startswith(env.LAUNCH_FLAG_PREFIX):
                    offenders.append(f"{path.relative_to(PACKAGES)}:{lineno}: {name}")
    assert offenders == []


def test_design_rule_scanner_finds_a_literal() -> None:
    # the scan above must not be vacuous: its pattern matches the ways a name can be spelled
    literal = re.compile(r"""(?<![A-Za-z0-9_])[rbuRBUfF]*["'](X_[A-Z][A-Z0-9_]*)""")
    samples = ['os.environ["X_USE_CPU"]', "get('X_MIXED_PRECISION')", 'f"X_LAUNCH_{x}"', 'r"X_DEBUG_MODE"']
    assert [m.group(1) for s in samples for m in literal.finditer(s)] == [
        "X_USE_CPU",
        "X_MIXED_PRECISION",
        "X_LAUNCH_",
        "X_DEBUG_MODE",
    ]
