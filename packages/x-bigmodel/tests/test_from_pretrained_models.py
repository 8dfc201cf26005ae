"""x_bigmodel.from_pretrained on an encoder-decoder (T5) and an MoE model (Mixtral), against transformers' own load.

Mixtral checkpoints hold one tensor per expert (``block_sparse_moe.experts.3.w1.weight``); transformers 5
fuses them at load time into ``mlp.experts.gate_up_proj`` with its own conversion table, which
from_pretrained must apply the same way. Tokens must match exactly (same kernels on the same values).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from x_bigmodel import from_pretrained

transformers = pytest.importorskip("transformers")


def checkpoint_keys(folder: Path) -> set[str]:
    keys: set[str] = set()
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            keys.update(f.keys())
    return keys


PROMPT = torch.tensor([[1, 17, 42, 7, 99, 23], [1, 5, 64, 12, 8, 31]])


def greedy(model: torch.nn.Module, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(PROMPT, max_new_tokens=20, min_new_tokens=20, do_sample=False, **kwargs)


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    config = transformers.MixtralConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=128,
        initializer_range=0.3, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(2)
    folder = tmp_path_factory.mktemp("mixtral") / "ckpt"
    transformers.MixtralForCausalLM(config).save_pretrained(folder, max_shard_size="60KB")
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    return folder, reference, greedy(reference)


def test_mixtral_experts_are_fused_by_transformers_conversion(mixtral) -> None:
    folder, reference, want = mixtral
    keys = checkpoint_keys(folder)
    assert "model.layers.0.block_sparse_moe.experts.3.w1.weight" in keys  # the per-expert layout on disk
    assert not any("gate_up_proj" in key for key in keys)
    model = from_pretrained(folder)
    assert model.hf_device_map == {"": "cpu"}
    fused = model.model.layers[0].mlp.experts.gate_up_proj
    assert torch.equal(fused, reference.model.layers[0].mlp.experts.gate_up_proj)
    assert torch.equal(greedy(model), want)


def test_mixtral_with_layers_on_disk(mixtral, tmp_path) -> None:
    folder, _, want = mixtral
    offload = tmp_path / "off"
    model = from_pretrained(folder, max_memory={"cpu": 400_000}, offload_folder=offload)
    devices = set(model.hf_device_map.values())
    assert devices == {"cpu", "disk"}, model.hf_device_map
    assert torch.equal(greedy(model), want)
    # Fused experts exist in no checkpoint file: those of disk layers are the only weights written.
    written = {p.name for p in offload.iterdir()} - {"index.json"}
    assert written and all(name.startswith("converted-") for name in written)


def test_t5_encoder_decoder_generates_transformers_tokens(tmp_path) -> None:
    config = transformers.T5Config(
        vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=3, num_decoder_layers=3, num_heads=4,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, initializer_factor=3.0,
    )  # fmt: skip
    torch.manual_seed(3)
    folder = tmp_path / "t5"
    transformers.T5ForConditionalGeneration(config).save_pretrained(folder, max_shard_size="60KB")
    assert (folder / "model.safetensors.index.json").is_file()
    reference = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    want = greedy(reference)
    assert torch.equal(greedy(from_pretrained(folder)), want)
    offload = tmp_path / "off"
    model = from_pretrained(folder, max_memory={"cpu": 350_000}, offload_folder=offload)
    assert set(model.hf_device_map.values()) == {"cpu", "disk"}, model.hf_device_map
    assert torch.equal(greedy(model), want)
    assert {p.name for p in offload.iterdir()} == {"index.json"}
