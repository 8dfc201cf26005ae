"""Extrapolating a uniform block stack from 2 and 3 simulated blocks equals simulating them all."""

from __future__ import annotations

import pytest
import torch

from x_estimate.simulate.layer_extrapolation import ExtrapolatedStep, uniform_stack
from x_estimate.simulate.step import simulate_training


def _model(name: str, layers: int):
    import transformers as T

    if name == "llama":
        config = T.LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=500, architectures=["LlamaForCausalLM"],
        )  # fmt: skip
        cls = T.LlamaForCausalLM
    else:
        config = T.GPT2Config(n_layer=layers, n_embd=64, n_head=4, vocab_size=500, n_positions=64)
        cls = T.GPT2LMHeadModel
    with torch.device("meta"):
        return cls(config), config


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("llama", {}),
        ("llama", {"precision": "mixed-bf16", "checkpointing": True}),
        ("gpt2", {"attn_implementation": "eager", "optimizer": "sgd"}),
    ],
)
def test_extrapolated_equals_whole(name, kwargs) -> None:
    model, config = _model(name, 7)
    fast = simulate_training(model, config, batch_size=2, seq_len=32, **kwargs)
    assert isinstance(fast, ExtrapolatedStep)
    assert len(uniform_stack(model, config)[0]._modules[uniform_stack(model, config)[1]]) == 7  # restored
    whole = simulate_training(model, config, batch_size=2, seq_len=32, extrapolate=False, **kwargs)
    assert (fast.peak, fast.at_peak, fast.steady, fast.phase) == (whole.peak, whole.at_peak, whole.steady, whole.phase)
    assert fast.activation_peak == whole.activation_peak
    divisors = {"optimizer_state": 4, "gradients": 4}
    assert fast.sharded(divisors, 100) == whole.sharded(divisors, 100)


def test_short_or_mixed_stacks_are_simulated_whole() -> None:
    model, config = _model("llama", 4)
    assert uniform_stack(model, config) is None  # fewer than MIN_BLOCKS
    model, config = _model("llama", 8)
    config.layer_types = ["full_attention", "sliding_attention"] * 4
    assert uniform_stack(model, config) is None
