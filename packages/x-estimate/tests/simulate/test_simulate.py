"""The simulated step: the ledger, the breakdown at the peak, precisions, checkpointing, sharding,
the fallback to the formulas, and the CLI around them. Small models: each simulation is fast."""

from __future__ import annotations

import pytest
import torch

from x_estimate.simulate.error import SimulationError
from x_estimate.simulate.ledger import Ledger
from x_estimate.simulate.step import PARTS, simulate_training


def test_ledger_counts_storages_not_views_and_sees_frees() -> None:
    with Ledger() as ledger:
        a = torch.ones(256, 256)  # 256 KiB
        view = a[:10]  # a view: no allocation
        a.add_(1)  # in place: no allocation
        b = a @ a  # 256 KiB
        del b
        c = torch.ones(10)
    assert ledger.peak == 2 * 256 * 256 * 4
    assert ledger.live == 256 * 256 * 4 + 40
    assert [x.nbytes for x in ledger.at_peak()] == [256 * 256 * 4, 256 * 256 * 4]
    assert view.untyped_storage().nbytes() == a.untyped_storage().nbytes() and c.numel() == 10


def _llama(**overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    values = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=1000, architectures=["LlamaForCausalLM"],
    )  # fmt: skip
    config = LlamaConfig(**{**values, **overrides})
    with torch.device("meta"):
        return LlamaForCausalLM(config), config


def test_breakdown_sums_to_the_peak_and_the_model_is_left_on_meta() -> None:
    model, config = _llama()
    before = {n: p for n, p in model.named_parameters()}
    step = simulate_training(model, config, batch_size=2, seq_len=32)
    n = sum(p.numel() for p in model.parameters())
    assert n == 2 * 1000 * 64 + 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64) + 64  # untied head
    assert set(step.at_peak) == set(PARTS)
    assert sum(step.at_peak.values()) == step.peak
    assert step.at_peak["weights"] == 4 * n + sum(4 * b.numel() for b in model.buffers())
    # AdamW fp32: two float32 moments per parameter plus one step counter per tensor.
    tensors = len(before)
    assert step.at_peak["optimizer_state"] == 8 * n + 4 * tensors
    assert step.steady == step.at_peak["weights"] + step.at_peak["optimizer_state"]
    assert step.at_peak["logits"] >= 2 * 2 * 32 * 1000 * 4  # logits and their gradient
    assert all(p.device.type == "meta" for p in model.parameters())
    assert {n: p for n, p in model.named_parameters()} == before  # the same objects, restorable


def test_pure_bf16_halves_weights_and_state_and_mixed_keeps_fp32_weights() -> None:
    model, config = _llama()
    fp32 = simulate_training(model, config, batch_size=2, seq_len=32)
    bf16 = simulate_training(model, config, precision="bf16", batch_size=2, seq_len=32)
    mixed = simulate_training(model, config, precision="mixed-bf16", batch_size=2, seq_len=32)
    assert bf16.at_peak["weights"] == fp32.at_peak["weights"] // 2
    n, tensors = sum(p.numel() for p in model.parameters()), len(list(model.parameters()))
    buffers = sum(b.numel() for b in model.buffers())
    assert fp32.steady == 12 * n + 4 * buffers + 4 * tensors
    assert bf16.steady == 6 * n + 2 * buffers + 4 * tensors  # AdamW's step counters stay float32
    assert mixed.steady == fp32.steady  # autocast: float32 weights and state, no master copy
    assert mixed.at_peak["weights"] == fp32.at_peak["weights"]
    assert mixed.peak != fp32.peak  # 16-bit activations and weight copies instead of float32 ones


def test_checkpointing_and_eager_attention_change_the_activations() -> None:
    model, config = _llama(num_hidden_layers=4)
    plain = simulate_training(model, config, batch_size=2, seq_len=64, attn_implementation="sdpa")
    eager = simulate_training(model, config, batch_size=2, seq_len=64, attn_implementation="eager")
    ckpt = simulate_training(model, config, batch_size=2, seq_len=64, attn_implementation="sdpa", checkpointing=True)
    # eager keeps each layer's softmaxed scores (and dropout-free: the probabilities) for backward
    assert eager.at_peak["activations"] - plain.at_peak["activations"] >= 4 * 2 * 4 * 64 * 64 * 4
    assert ckpt.at_peak["activations"] < plain.at_peak["activations"] / 2
    flag = (
        "is_activation_checkpointing" if hasattr(model, "is_activation_checkpointing") else "is_gradient_checkpointing"
    )
    assert not getattr(model, flag)  # switched off again afterwards


def test_zero_stages_divide_what_they_shard() -> None:
    model, config = _llama()
    step = simulate_training(model, config, batch_size=2, seq_len=32)
    peak1, parts1, steady1 = step.sharded({"optimizer_state": 4})
    assert parts1["optimizer_state"] == -(-step.at_peak["optimizer_state"] // 4)
    assert peak1 == sum(parts1.values()) < step.peak
    assert steady1 == step.at_peak["weights"] + -(-step.at_peak["optimizer_state"] // 4)
    peak3, parts3, _ = step.sharded(dict.fromkeys(("optimizer_state", "gradients", "weights"), 4), extra_weights=1000)
    assert parts3["weights"] == -(-step.at_peak["weights"] // 4) + 1000
    assert peak3 < peak1


def test_an_optimizer_without_fake_kernels_is_refused_with_its_reason() -> None:
    model, config = _llama()
    with pytest.raises(SimulationError, match="adamw8bit optimizer needs bitsandbytes"):
        simulate_training(model, config, optimizer="adamw8bit", batch_size=1, seq_len=8)


@pytest.mark.parametrize("optimizer", ["sgd", "adafactor"])
def test_other_optimizers_simulate(optimizer) -> None:
    model, config = _llama()
    step = simulate_training(model, config, optimizer=optimizer, batch_size=1, seq_len=8)
    n = sum(p.numel() for p in model.parameters())
    if optimizer == "sgd":
        assert step.at_peak["optimizer_state"] == 4 * n  # one momentum buffer
    else:
        assert 0 < step.at_peak["optimizer_state"] < 4 * n  # factored second moments


# --- through the command line ------------------------------------------------------------------


def test_cli_simulates_with_seq_len_and_says_so(model_dir, configs, cli, parse_table) -> None:
    folder = model_dir(configs.llama())
    result = cli(folder, "--dtypes", "float32", "bfloat16", "--seq-len", 32, "--batch-size", 2)
    table = parse_table(result.out)
    assert table["dtype"][2:] == ["Training peak (adamw, simulated)", "KV cache", "Activations max"]
    assert "  float32 (fp32, simulated, peak in backward): weights " in result.out
    assert "Training peak: simulated (" in result.out
    data = cli(folder, "--dtypes", "float32", "--seq-len", 32, "--batch-size", 2, "--json").json
    t = data["rows"][0]["training"]
    assert (t["method"], t["peak_phase"]) == ("simulate", "backward")
    assert t["peak_bytes"] == sum(t["at_peak"].values()) > t["steady_bytes"]
    formula = cli(folder, "--dtypes", "float32", "--seq-len", 32, "--method", "formula", "--json").json
    assert formula["rows"][0]["training"]["method"] == "formula"
    assert parse_table(cli(folder, "--dtypes", "float32", "--seq-len", 32, "--method", "formula").out)["dtype"][2:] == [
        "Training (adamw)",
        "KV cache",
        "Activations",
        "Activations (ckpt)",
    ]


def test_cli_without_seq_len_uses_the_formula(model_dir, configs, cli) -> None:
    t = cli(model_dir(configs.llama()), "--dtypes", "float32", "--json").json["rows"][0]["training"]
    assert t["method"] == "formula" and t["peak_bytes"] == t["total"]


def test_cli_falls_back_to_the_formula_naming_why(model_dir, configs, cli) -> None:
    folder = model_dir(configs.llama())
    data = cli(folder, "--dtypes", "float32", "--seq-len", 16, "--optimizer", "adamw8bit", "--json").json
    assert data["rows"][0]["training"]["method"] == "formula"
    assert any("could not be simulated: the adamw8bit optimizer needs bitsandbytes" in a for a in data["assumptions"])
    insist = cli(folder, "--dtypes", "float32", "--seq-len", 16, "--optimizer", "adamw8bit", "--method", "simulate")
    assert insist.code == 1 and insist.out == ""
    assert insist.err.startswith("Error: cannot simulate the training step: the adamw8bit optimizer")
    assert len(insist.err.splitlines()) == 1


def test_method_simulate_needs_seq_len(model_dir, configs, cli) -> None:
    result = cli(model_dir(configs.llama()), "--method", "simulate")
    assert result.code == 2 and result.out == ""
    assert result.err.strip() == (
        "Error: --method simulate needs --seq-len (a step needs inputs); add --seq-len N (see x-estimate --help)"
    )


def test_zero3_per_device_figures_are_smaller(model_dir, configs, cli) -> None:
    folder = model_dir(configs.llama())
    args = ("--dtypes", "float32", "--seq-len", 32, "--json")
    one = cli(folder, *args).json["rows"][0]["training"]
    z3 = cli(folder, *args, "--shard", "zero3", "--num-gpus", 4).json["rows"][0]["training"]
    assert z3["method"] == "simulate"
    assert z3["at_peak"]["optimizer_state"] == -(-one["at_peak"]["optimizer_state"] // 4)
    assert z3["at_peak"]["gathered_layer"] > 0
    assert z3["peak_bytes"] < one["peak_bytes"]


def test_seq_len_beyond_max_positions_warns_once(model_dir, configs, cli) -> None:
    folder = model_dir(configs.gpt2())  # n_positions 128
    result = cli(folder, "--dtypes", "float32", "--seq-len", 256, "--method", "formula")
    assert result.code == 0
    assert result.err == (
        "Warning: --seq-len 256 is beyond the model's max_position_embeddings (128); "
        "the figures assume it can run that long\n"
    )
    assert cli(folder, "--dtypes", "float32", "--seq-len", 128, "--method", "formula").err == ""


def test_underscore_spellings_work(model_dir, configs, cli) -> None:
    folder = model_dir(configs.llama())
    dashed = cli(folder, "--seq-len", 16, "--batch-size", 2, "--num-gpus", 2, "--method", "formula", "--json").json
    under = cli(folder, "--seq_len", 16, "--batch_size=2", "--num_gpus", 2, "--method", "formula", "--json").json
    assert dashed == under
    assert dashed["options"]["batch_size"] == 2 and dashed["options"]["num_gpus"] == 2


def test_every_option_has_help() -> None:
    from x_estimate.cli.command import _command

    missing = [p.opts[0] for p in _command.params if p.param_type_name == "option" and not (p.help or "").strip()]
    assert missing == []
    names = {o for p in _command.params for o in p.opts}
    assert {"--attn-implementation", "--activation-checkpointing", "--method"} <= names


def test_a_repeat_estimate_reads_the_simulation_from_the_cache(model_dir, configs, cli, summary_cache) -> None:
    folder = model_dir(configs.llama())
    args = (folder, "--dtypes", "float32", "bfloat16", "--seq-len", 16, "--shard", "zero2", "--num-gpus", 2)
    first = cli(*args, "--json").json
    stored = sorted((summary_cache / "simulations").glob("*.json"))
    assert len(stored) == 1
    assert cli(*args, "--json").json == first
    # Another sharding replays the step differently: its own entry, its own figures.
    other = cli(folder, "--dtypes", "float32", "bfloat16", "--seq-len", 16, "--json").json
    assert len(sorted((summary_cache / "simulations").glob("*.json"))) == 2
    assert other["rows"][0]["training"]["peak_bytes"] > first["rows"][0]["training"]["peak_bytes"]
    assert (
        cli(folder, "--dtypes", "float32", "--seq-len", 16, "--no-cache", "--json").json["rows"][0] == other["rows"][0]
    )
