"""``--plan``'s tensor-parallel rows: one TP rank's model simulated, its layout in Accelerate's terms.

A TP row's figure is the simulated step of the model one rank holds (``model/tensor_parallel.py``):
its weights must be exactly the rank's share of the parameters, counted here from the config by
hand, and a real two-process TP step (torch's DTensor over gloo, the model's own plan) must hold
the same weights and optimizer state.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from x_estimate.plan.search import MARGIN

H, INTER, V, HEADS, KV, LAYERS = 128, 1024, 1024, 4, 2, 2
PLAN = ("--plan", "--seq-len", "256", "--batch-size", "4", "--precision", "mixed-bf16", "--gpus", "2")
WORKER = Path(__file__).parents[1] / "workers" / "tp_step.py"
_FOREIGN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_", "TORCHELASTIC_")


def _config(configs, **overrides):
    values = dict(hidden_size=H, intermediate_size=INTER, vocab_size=V, num_attention_heads=HEADS,
                  num_key_value_heads=KV, num_hidden_layers=LAYERS)  # fmt: skip
    return configs.llama(**{**values, **overrides})


def _tp_local_parameters(tp: int) -> list[int]:
    """Each parameter's element count on one of ``tp`` ranks, from the config by hand."""
    head_dim = H // HEADS
    q, kv = HEADS * head_dim // tp, KV * head_dim // tp
    block = [
        q * H,
        kv * H,
        kv * H,
        H * q,
        INTER // tp * H,
        INTER // tp * H,
        H * (INTER // tp),
        H,
        H,
    ]  # q k v o gate up down norms
    return [V // tp * H, *block * LAYERS, H, V // tp * H]  # embedding, blocks, final norm, head


def _block(nbytes: int) -> int:
    return -(-nbytes // 512) * 512  # the CUDA allocator's 512-byte blocks


def _one_rank_budget(configs, tp: int = 2) -> tuple[int, int]:
    """(reserved, weights) of one TP rank's simulated step at the plan's full micro-batch."""
    from transformers import LlamaForCausalLM

    from x_estimate.model.skeleton import Skeleton
    from x_estimate.model.tensor_parallel import tp_local
    from x_estimate.simulate.step import simulate_training

    config = _config(configs)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    skeleton = Skeleton(model=model, library="transformers", class_name="LlamaForCausalLM", config=config)
    step = simulate_training(tp_local(skeleton, tp).model, config, precision="mixed-bf16", batch_size=4,
                             seq_len=256, device="cuda")  # fmt: skip
    return step.reserved, step.at_peak["weights"]


@pytest.fixture
def llama(model_dir, configs):
    return model_dir(_config(configs))


def test_the_tp_2_row_holds_one_ranks_share_and_needs_less_than_one_device(cli, llama, configs) -> None:
    reserved, _ = _one_rank_budget(configs)
    plan = cli(llama, *PLAN, "--gpu-memory", f"{MARGIN + reserved}B", "--json").json
    rows = [r for r in plan["rows"] if r["tp"] == 2]
    assert plan["tp_degrees"] == [2] and len(rows) == 1, plan["rows"]
    row = rows[0]
    assert (row["layout"], row["dp_shard"], row["dp_replicate"]) == ("TP tp=2", 1, 1)
    assert row["reserved"] == reserved and "all-reduce" in row["note"]
    # The weights: every TP-local parameter in float32 (autocast's weights), each in its 512-byte
    # blocks, and the rotary tables (2 x head_dim / 2 floats), whole on every rank.
    head_dim = H // HEADS
    expected = sum(_block(4 * n) for n in _tp_local_parameters(2)) + 2 * _block(4 * head_dim // 2)
    assert row["at_peak"]["weights"] == expected
    alone = cli(llama, "--dtypes", "bfloat16", "--precision", "mixed-bf16", "--device", "cuda", "--seq-len", "256",
                "--batch-size", "4", "--json").json["rows"][0]["training"]  # fmt: skip
    assert row["allocated"] < alone["peak_bytes"] and row["reserved"] < alone["reserved_bytes"]
    # Ranked after every data-parallel row that fits without offload: TP all-reduces every block.
    plain = [i for i, r in enumerate(plan["rows"]) if r["tp"] == 1 and r["offload"] == "none"]
    assert all(i < plan["rows"].index(row) for i in plain)


def test_a_tp_degree_that_does_not_divide_the_heads_is_not_offered(configs) -> None:
    from transformers import LlamaForCausalLM

    from x_estimate.model.tensor_parallel import tp_degrees

    def degrees(**overrides):
        config = _config(configs, **overrides)
        with torch.device("meta"):
            return tp_degrees(LlamaForCausalLM(config), config, 8)

    assert degrees() == (
        [2],
        ["tp=4: do not divide the 2 key-value heads", "tp=8: do not divide the 4 attention heads"],
    )
    assert degrees(num_attention_heads=8, num_key_value_heads=8, intermediate_size=1004) == (
        [2, 4], ["tp=8: do not divide model.layers.0.mlp.gate_proj's split dimension (1004)"],
    )  # fmt: skip


def test_a_model_without_a_tp_plan_gets_no_tp_rows_and_the_report_says_why(cli, model_dir, configs) -> None:
    gpt2 = model_dir(configs.gpt2())
    args = ("--plan", "--seq-len", "32", "--batch-size", "1", "--precision", "mixed-bf16", "--gpus", "2")
    plan = cli(gpt2, *args, "--gpu-memory", "80GiB", "--json").json
    assert plan["tp_degrees"] == [] and all(r["tp"] == 1 for r in plan["rows"])
    why = "GPT2LMHeadModel has no tensor-parallel plan (config.base_model_tp_plan): no TP rows"
    assert f"No TP rows for {why}." in plan["notes"]
    assert f"- No TP rows for {why}." in cli(gpt2, *args, "--gpu-memory", "80GiB").out


def test_a_tp_row_runs_with_accelerates_parallelism_config(cli, llama, configs, tmp_path) -> None:
    reserved, _ = _one_rank_budget(configs)
    budget = ("--gpu-memory", f"{MARGIN + reserved}B", "--gpus", "4", "--num-machines", "2")
    # 4 GPUs on 2 machines, only one TP layout fits: TP within each machine, HSDP over the two.
    plan = cli(llama, *PLAN[:-2], *budget, "--json").json
    assert plan["machines"] == 2 and plan["tp_degrees"] == [2]
    from x_estimate.plan.config import launch_settings
    from x_estimate.plan.search import Setting

    tp = Setting("mixed-bf16", "zero3", "none", True, 2, 1, tp=2, dp_replicate=1)
    settings = launch_settings(tp, 8, ["LlamaDecoderLayer"])
    assert settings["distributed_type"] == "FSDP" and settings["fsdp_config"]["fsdp_version"] == 2
    assert settings["parallelism_config"] == {
        "parallelism_config_dp_replicate_size": 1, "parallelism_config_dp_shard_size": 4,
        "parallelism_config_tp_size": 2, "parallelism_config_cp_size": 1,
    }  # fmt: skip
    hsdp = Setting("mixed-bf16", "zero3", "none", False, 2, 1, tp=1, dp_replicate=2)
    assert hsdp.layout(8) == "HSDP dp_replicate=2 dp_shard=4"
    assert launch_settings(hsdp, 8, [], 2)["parallelism_config"]["parallelism_config_dp_replicate_size"] == 2
    # The printed settings of the plan's TP row, and the file --write-config writes for such a row 1.
    two = ("--gpu-memory", f"{MARGIN + reserved}B", "--gpus", "2")
    rows = cli(llama, *PLAN[:-2], *two, "--json").json["rows"]
    tp_rows = [r for r in rows if r["tp"] == 2]
    assert tp_rows and "x-launch --num_processes 2 --mixed_precision bf16 --use_parallelism_config " \
        "--parallelism_config_tp_size 2 your_script.py" in tp_rows[0]["how"]  # fmt: skip
    from x_estimate.plan.config import config_text
    from x_estimate.plan.search import Plan, PlanRow

    r = tp_rows[0]
    row = PlanRow(Setting(r["precision"], r["shard"], r["offload"], r["checkpointing"], r["micro_batch"],
                          r["accumulation"], r["tp"], r["dp_replicate"]), r["allocated"], r["reserved"],
                  r["headroom"], r["host"], r["at_peak"])  # fmt: skip
    plan = Plan(2, MARGIN + reserved, 4, 256, "adamw", ("mixed-bf16",), [row], None, 1)
    text = config_text(plan, row, model="llama", title="t", wrap=["LlamaDecoderLayer"], path=tmp_path / "tp.yaml")
    written = yaml.safe_load(text)
    assert (written["distributed_type"], written["fsdp_config"]["fsdp_version"]) == ("FSDP", 2)
    assert written["parallelism_config"] == {
        "parallelism_config_dp_replicate_size": 1, "parallelism_config_dp_shard_size": 1,
        "parallelism_config_tp_size": 2, "parallelism_config_cp_size": 1,
    }  # fmt: skip
    assert "# Setting: mixed-bf16, sharding TP tp=2," in text and "splits the model by its own tp_plan" in text
    assert "ParallelismConfig(tp_size=2)" in tp_rows[0]["how"]


def test_a_tp_2_ranks_weights_and_optimizer_state_match_a_real_tp_step(
    model_dir, configs, script_env, tmp_path
) -> None:
    """torch's DTensor TP over gloo, 2 processes, the model's own plan: the bytes each rank holds."""
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("needs torch.distributed with gloo")
    from transformers import LlamaForCausalLM

    from x_estimate.model.skeleton import Skeleton
    from x_estimate.model.tensor_parallel import tp_local
    from x_estimate.simulate.step import simulate_training

    config = _config(configs, intermediate_size=256)
    folder, out = model_dir(config), tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in script_env.items() if not k.startswith(_FOREIGN)}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    args = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(WORKER), str(out), str(folder)]
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-6000:])
    real = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    skeleton = Skeleton(model=model, library="transformers", class_name="LlamaForCausalLM", config=config)
    step = simulate_training(tp_local(skeleton, 2).model, config, precision="fp32", batch_size=2, seq_len=16)
    maxima, _ = step.phase_maxima({})
    simulated = maxima["optimizer"][1]  # weights, gradients and AdamW state are all live in the step
    for rank in real:
        assert simulated["weights"] == rank["weights"] + rank["buffers"]
        assert simulated["optimizer_state"] == rank["optimizer_state"]
        # DTensor's embedding backward leaves the vocab-parallel table's gradient replicated (full size)
        # on every rank, in torch's styles as in transformers' own: one rank's share is simulated.
        embedding = V * H * 4
        assert simulated["gradients"] == rank["gradients"] - embedding + embedding // 2
