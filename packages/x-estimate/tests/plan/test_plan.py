"""``x-estimate MODEL --plan``: the cheapest settings that fit, each row a simulated figure.

The rows without offload must be exactly what the ordinary estimate prints for the same
settings (the same simulated CUDA step, replayed for one device), so the plan inherits that
path's checks against real steps; the search itself must return what fits, cheapest first.
"""

from __future__ import annotations

import pytest

from x_estimate.plan.search import MARGIN, OFFLOADS

MIB, GIB = 1 << 20, 1 << 30
PLAN = ("--seq-len", "128", "--batch-size", "4")


@pytest.fixture
def llama(model_dir, configs):
    # Deep enough (6 blocks) to be extrapolated, wide enough that sharding moves whole segments.
    config = configs.llama(hidden_size=512, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=8,
                           num_key_value_heads=4, vocab_size=8000)  # fmt: skip
    return model_dir(config)


def _plan(cli, folder, *args):
    return cli(folder, "--plan", *PLAN, *args, "--json").json


def _cost(row, precisions=("mixed-bf16", "bf16")):
    return (
        OFFLOADS.index(row["offload"]),
        precisions.index(row["precision"]),
        int(row["checkpointing"]),
        int(row["shard"] == "zero3"),
        row["accumulation"],
        ("none", "zero1", "zero2", "zero3").index(row["shard"]),
    )


def test_with_room_to_spare_the_cheapest_setting_is_plain_mixed_precision_at_the_full_batch(cli, llama) -> None:
    plan = _plan(cli, llama, "--gpus", "2", "--gpu-memory", "80GiB")
    first = plan["rows"][0]
    assert (first["precision"], first["shard"], first["offload"], first["checkpointing"]) == (
        "mixed-bf16", "none", "none", False,
    )  # fmt: skip
    assert (first["micro_batch"], first["accumulation"]) == (4, 1)
    assert first["reserved"] >= first["allocated"] > 64 * MIB  # two cuBLAS workspaces at least
    assert first["headroom"] == 80 * GIB - first["reserved"]
    assert "mixed_precision='bf16'" in first["how"] and "DataLoader(batch_size=4)" in first["how"]
    assert len(plan["rows"]) == 1  # nothing costlier needs fewer accumulation steps than none at all


def test_a_tight_budget_moves_to_the_next_cheapest_setting_that_fits(cli, llama) -> None:
    roomy = _plan(cli, llama, "--gpus", "4", "--gpu-memory", "80GiB")["rows"][0]
    # One byte too little for the cheapest setting: whatever comes first now is costlier and fits.
    budget = MARGIN + roomy["reserved"] - 1
    plan = _plan(cli, llama, "--gpus", "4", "--gpu-memory", f"{budget}B")
    rows = plan["rows"]
    assert rows, plan
    assert all(r["reserved"] <= budget - MARGIN for r in rows)
    assert [_cost(r) for r in rows] == sorted(_cost(r) for r in rows)
    assert _cost(rows[0]) > _cost(roomy)
    assert (rows[0]["precision"], rows[0]["offload"]) == ("mixed-bf16", "none")  # sharding or a smaller micro-batch


def test_rows_without_offload_are_the_ordinary_estimate_of_their_settings(cli, llama) -> None:
    roomy = _plan(cli, llama, "--gpus", "4", "--gpu-memory", "80GiB")["rows"][0]
    plan = _plan(cli, llama, "--gpus", "4", "--gpu-memory", f"{MARGIN + roomy['reserved'] - 1}B")
    checked = 0
    for row in plan["rows"]:
        if row["offload"] != "none":
            continue
        args = ["--dtypes", "bfloat16", "--precision", row["precision"], "--device", "cuda", "--seq-len", "128"]
        args += ["--batch-size", str(row["micro_batch"]), "--num-gpus", "4", "--shard", row["shard"]]
        if row["checkpointing"]:
            args.append("--activation-checkpointing")
        training = cli(llama, *args, "--json").json["rows"][0]["training"]
        assert (training["peak_bytes"], training["reserved_bytes"]) == (row["allocated"], row["reserved"]), row
        checked += 1
    assert checked >= 1


def test_sharding_and_offload_shrink_what_one_gpu_holds(cli, llama) -> None:
    def estimate(*args):
        base = ("--dtypes", "bfloat16", "--device", "cuda", "--seq-len", "128", "--batch-size", "1", "--json")
        return cli(llama, *base, *args).json["rows"][0]["training"]

    alone, zero3 = estimate(), estimate("--num-gpus", "4", "--shard", "zero3")
    assert zero3["reserved_bytes"] < alone["reserved_bytes"]
    assert zero3["at_peak"]["optimizer_state"] * 4 <= alone["at_peak"]["optimizer_state"] + 4 * 512
    # A budget only offload meets: every row left keeps its optimizer state off the GPU.
    plan = _plan(cli, llama, "--gpus", "1", "--gpu-memory", f"{MARGIN + alone['reserved_bytes'] - 32 * MIB}B")
    offloaded = [r for r in plan["rows"] if r["offload"] != "none"]
    assert offloaded, plan
    for row in offloaded:
        assert row["at_peak"]["optimizer_state"] == 0
        assert row["host"] > 0
        assert "cpu" in row["how"]


def test_nothing_fits_names_the_setting_that_needs_least(cli, llama) -> None:
    result = cli(llama, "--plan", *PLAN, "--gpu-memory", f"{MARGIN + 8 * MIB}B")
    assert result.code == 0, result.err
    assert "Nothing fits in 8.00 MiB per GPU" in result.out
    assert "too many: more GPUs, a bigger GPU, or a shorter --seq-len" in result.out
    plan = _plan(cli, llama, "--gpu-memory", f"{MARGIN + 8 * MIB}B")
    assert plan["fits"] is False and plan["rows"] == []
    assert plan["nearest"]["micro_batch"] == 1 and plan["nearest"]["reserved"] > 8 * MIB


def test_the_table_shows_each_row_and_how_to_run_the_first(cli, llama, parse_table) -> None:
    out = cli(llama, "--plan", *PLAN, "--gpus", "8", "--gpu-memory", "80GiB").out
    table = parse_table(out)
    assert table["#"][:3] == ["precision", "sharding", "offload"]
    assert table["1"][:5] == ["mixed-bf16", "none", "-", "no", "4 x 1"]
    assert "Cheapest that fits (row 1): Accelerator(mixed_precision='bf16'), DataLoader(batch_size=4), DDP" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--gpu-memory", "80GiB"), "--plan needs --seq-len N"),
        (("--seq-len", "128"), "--plan needs --gpu-memory SIZE"),
        (("--seq-len", "128", "--gpu-memory", "80GiB", "--shard", "zero2"), "--plan chooses what --shard"),
        (("--seq-len", "128", "--gpu-memory", "80GiB", "--device", "cpu"), "--plan chooses what --device cpu"),
        (("--seq-len", "128", "--gpu-memory", "lots"), "Invalid value for '--gpu-memory'"),
    ],
)
def test_bad_plan_options_are_one_line_and_exit_2(cli, llama, args, message) -> None:
    result = cli(llama, "--plan", *args)
    assert result.code == 2
    assert message in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert result.out == ""


def test_an_optimizer_without_fake_kernels_is_refused_in_one_line(cli, llama) -> None:
    result = cli(llama, "--plan", *PLAN, "--gpu-memory", "80GiB", "--optimizer", "adamw8bit")
    assert result.code == 1
    assert result.err.startswith("Error: --plan simulates every setting, and this one cannot run: ")
    assert "bitsandbytes" in result.err
