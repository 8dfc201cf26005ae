"""The environment a launch gives its processes, derived from the settings table (``contract_env``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from x_common import env
from x_common.kinds import Bool, BoolOrChoice, Choice, Float, Int, Str, StrList
from x_launch.cli import main
from x_launch.config import parallelism
from x_launch.config.contract_env import contract_environment
from x_launch.config.launch_config import TABLE
from x_launch.config.option import Option
from x_launch.config.resolve import resolve

CARRIED = [row for row in TABLE if row.env is not None]
# ParallelismConfig rows travel together, when it is on and with the sizes' checks (test_parallelism.py).
ALONE = [row for row in CARRIED if not parallelism.owns(row)]
TOGETHER = [row for row in CARRIED if parallelism.owns(row)]


def other_value(row: Option) -> str:
    """A value for ``row``, as an ``X_LAUNCH_*`` variable spells it, that is not its default."""
    kind = row.kind
    if isinstance(kind, (Bool, BoolOrChoice)):
        return "false" if row.default is True else "true"
    if isinstance(kind, Choice):
        return next(c for c in kind.choices if c.lower() != str(row.default).lower())
    if isinstance(kind, Int):
        return next(str(n) for n in (1, 2, 3) if n != row.default and row.kind.check(row.key, n) == n)
    if isinstance(kind, Float):
        return "0.5"
    if isinstance(kind, StrList):
        return "LlamaDecoderLayer,LlamaMLP"
    assert isinstance(kind, Str), f"{row.key}: no sample value for {kind!r}"
    return "/tmp/ds_config.json"


def dry_run_environment(capsys, tmp_path: Path, *args: str) -> dict[str, str]:
    """The child environment ``x-launch --dry-run`` prints."""
    script = tmp_path / "train.py"
    script.write_text("")
    with pytest.raises(SystemExit) as info:
        main(["--dry-run", *args, str(script)])
    out = capsys.readouterr().out
    assert info.value.code == 0, out
    lines = out.splitlines()
    env_lines = lines[lines.index("environment:") + 1 :]
    return dict(line.strip().split("=", 1) for line in env_lines)


def test_every_carried_row_is_tested() -> None:
    assert len(ALONE) >= 30  # the table lost its variables if this drops
    assert len(TOGETHER) == 12  # --use_parallelism_config and the eleven --parallelism_config_* options


@pytest.mark.parametrize("row", ALONE, ids=[row.key for row in ALONE])
def test_every_row_with_a_variable_reaches_the_child_environment(row: Option, capsys, tmp_path, monkeypatch) -> None:
    text = other_value(row)
    monkeypatch.setenv(row.flag_var, text)
    child = dry_run_environment(capsys, tmp_path)
    assert row.env.name in child, f"{row.key} set by {row.flag_var}={text} did not reach the child"
    assert row.env.read(child) == row.env.kind.parse(row.env.name, text)


@pytest.mark.parametrize("row", [r for r in CARRIED if r.section is not None], ids=lambda r: r.key)
def test_a_section_row_left_at_its_default_does_not_travel(row: Option, capsys, tmp_path) -> None:
    assert row.env.name not in dry_run_environment(capsys, tmp_path)


def test_representative_values_arrive_as_the_runtime_spells_them(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("X_LAUNCH_DYNAMO_BACKEND", "INDUCTOR")
    monkeypatch.setenv("X_LAUNCH_FSDP_TRANSFORMER_LAYER_CLS_TO_WRAP", "BertLayer, BertEmbeddings")
    monkeypatch.setenv("X_LAUNCH_ZERO3_INIT_FLAG", "yes")
    child = dry_run_environment(capsys, tmp_path, "--mixed_precision", "FP16", "--gradient_accumulation_steps", "4")
    assert child[env.DYNAMO_BACKEND.name] == "inductor"
    assert child[env.FSDP_TRANSFORMER_CLS_TO_WRAP.name] == "BertLayer,BertEmbeddings"
    assert child[env.DEEPSPEED_ZERO3_INIT.name] == "1"
    assert child[env.MIXED_PRECISION.name] == "fp16"
    assert child[env.GRADIENT_ACCUMULATION_STEPS.name] == "4"
    assert child[env.LAUNCHED_BY_X.name] == "1"


def test_an_fsdp1_strategy_in_reshard_after_forward_travels_as_the_strategy(capsys, tmp_path, monkeypatch) -> None:
    # Accelerate's FSDP1 files write the strategy into this key; it wins over fsdp_sharding_strategy.
    monkeypatch.setenv("X_LAUNCH_FSDP_RESHARD_AFTER_FORWARD", "shard_grad_op")
    monkeypatch.setenv("X_LAUNCH_FSDP_SHARDING_STRATEGY", "FULL_SHARD")
    child = dry_run_environment(capsys, tmp_path)
    assert child[env.FSDP_SHARDING_STRATEGY.name] == "SHARD_GRAD_OP"
    assert env.FSDP_RESHARD_AFTER_FORWARD.name not in child


@pytest.mark.parametrize("row", TOGETHER, ids=[row.key for row in TOGETHER])
def test_every_parallelism_row_reaches_the_child_environment(row: Option) -> None:
    text = row.choices[0] if len(row.choices) == 1 else other_value(row)  # cp_backend torch, sp_backend deepspeed
    # The context- and sequence-parallel extras travel only with their dimension in use, as Accelerate.
    sizes = {"cp": "parallelism_config_cp_size", "sp": "parallelism_config_sp_size"}
    dimension = next(
        (flag for short, flag in sizes.items() if row.flag.startswith(f"parallelism_config_{short}_")), None
    )
    flags = {row.flag: text, **({dimension: "2"} if dimension and dimension != row.flag else {})}
    child = contract_environment(resolve(None, flags, environ={}))
    assert row.env.name in child, f"{row.key} set by --{row.flag} {text} did not reach the child"
    assert row.env.read(child) == row.env.kind.parse(row.env.name, text)
    assert env.USE_PARALLELISM_CONFIG.read(child) is True
