"""KV cache of decoder models and training activations (Korthikanti et al., 2022)."""

from __future__ import annotations

import pytest

from x_estimate.model.inference import AttentionShape, activation_bytes, attention_shape, kv_cache_bytes

GiB = 2**30


def _llama3_8b_config(configs):
    return configs.llama(
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=14336,
        vocab_size=128256,
        max_position_embeddings=8192,
    )


def _korthikanti(s: int, b: int, h: int, a: int, layers: int) -> int:
    return layers * (s * b * h * 34 + 5 * a * s * s * b)


def test_llama3_8b_kv_cache_is_one_gib_at_8192_tokens(model_dir, configs, cli, parse_table) -> None:
    folder = model_dir(_llama3_8b_config(configs))
    data = cli(folder, "--seq-len", "8192", "--json").json
    assert data["class"] == "LlamaForCausalLM"
    assert data["parameters"] == 8_030_261_248
    rows = {r["dtype"]: r for r in data["rows"]}
    assert rows["bfloat16"]["kv_cache_bytes"] == GiB  # 2 * 8 kv heads * 128 * 8192 * 32 layers * 2 B
    assert rows["float16"]["kv_cache_bytes"] == GiB
    assert rows["float32"]["kv_cache_bytes"] == 2 * GiB
    assert rows["int8"]["kv_cache_bytes"] == rows["int4"]["kv_cache_bytes"] == GiB  # cache stays 16-bit
    acts = _korthikanti(8192, 1, 4096, 32, 32)
    assert rows["bfloat16"]["activation_bytes"] == acts
    assert rows["bfloat16"]["activation_bytes_checkpointed"] == 32 * 2 * 8192 * 4096
    assert rows["int4"]["activation_bytes"] is None  # no training row, no activations
    table = parse_table(cli(folder, "--seq-len", "8192", "--dtypes", "bfloat16", "--method", "formula").out)
    assert table["dtype"][3:] == ["KV cache", "Activations", "Activations (ckpt)"]
    assert table["bfloat16"][3] == "1.00 GiB"
    assert table["bfloat16"][5] == "2.00 GiB"  # 32 layers * 2 * 8192 * 4096 B


def test_kv_cache_scales_with_batch_and_inference_total_counts_it(model_dir, configs, cli) -> None:
    config = configs.llama(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    folder = model_dir(config)
    one = cli(folder, "--seq-len", "100", "--dtypes", "bfloat16", "--json").json["rows"][0]
    four = cli(folder, "--seq-len", "100", "--batch-size", "4", "--dtypes", "bfloat16", "--json").json["rows"][0]
    per_token = 2 * 2 * 16 * 2 * 2  # K and V, 2 kv heads, head_dim 16, 2 layers, 2 bytes
    assert one["kv_cache_bytes"] == 100 * per_token
    assert four["kv_cache_bytes"] == 4 * 100 * per_token
    assert four["activation_bytes"] == _korthikanti(100, 4, 64, 4, 2)
    assert four["activation_bytes_checkpointed"] == 2 * 2 * 100 * 4 * 64


def test_explicit_head_dim_is_used(model_dir, configs, cli) -> None:
    # head_dim 128 while hidden / heads = 64: the cache follows head_dim.
    config = configs.llama(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=128)
    data = cli(model_dir(config), "--seq-len", "10", "--dtypes", "float16", "--json").json
    assert data["rows"][0]["kv_cache_bytes"] == 2 * 2 * 128 * 10 * 2 * 2


def test_sliding_window_layers_are_capped(model_dir, cli) -> None:
    from transformers import Gemma2Config

    config = Gemma2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=1000,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        architectures=["Gemma2ForCausalLM"],
    )
    folder = model_dir(config)
    rows = cli(folder, "--seq-len", "64", "--dtypes", "bfloat16", "--json").json["rows"]
    positions = 15 + 64 + 15 + 64  # transformers keeps window - 1 positions of a sliding layer
    # + 16 B when the cache is measured (model/summary.py passing the model): each sliding layer's
    # int64 window counter, which the config formula (keys and values only) leaves out.
    assert rows[0]["kv_cache_bytes"] - 2 * 2 * 32 * positions * 2 in (0, 16)
    # Below the window every layer holds the whole sequence.
    short = cli(folder, "--seq-len", "8", "--dtypes", "bfloat16", "--json").json["rows"]
    assert short[0]["kv_cache_bytes"] - 2 * 2 * 32 * 8 * 4 * 2 in (0, 16)


def test_sliding_window_without_layer_types_caps_every_layer(configs) -> None:
    from transformers import MistralConfig

    shape = attention_shape(
        MistralConfig(
            hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, sliding_window=16
        )
    )
    assert shape == AttentionShape(3, 64, 4, 2, 16, (16, 16, 16))
    assert kv_cache_bytes(shape, seq_len=100, batch_size=1, bytes_per_value=2) == 2 * 2 * 16 * 15 * 3 * 2


def test_encoder_model_has_no_kv_cache_but_has_activations(model_dir, configs, cli) -> None:
    folder = model_dir(configs.bert(architectures=["BertModel"]))
    data = cli(folder, "--seq-len", "128", "--json").json
    for row in data["rows"]:
        assert row["kv_cache_bytes"] is None
    rows = {r["dtype"]: r for r in data["rows"]}
    # 16-bit activations for the mixed-precision rows, twice that for fp32 training.
    assert rows["bfloat16"]["activation_bytes"] == _korthikanti(128, 1, 64, 4, 2)
    assert rows["bfloat16"]["activation_bytes_checkpointed"] == 2 * 2 * 128 * 64
    assert rows["float32"]["activation_bytes"] == 2 * _korthikanti(128, 1, 64, 4, 2)
    assert rows["float32"]["activation_bytes_checkpointed"] == 2 * 2 * 2 * 128 * 64
    assert "KV cache: not a decoder-only model; no cache." in data["assumptions"]


def test_activations_follow_the_training_precision(model_dir, configs, cli) -> None:
    folder = model_dir(configs.llama())
    fp32 = cli(folder, "--seq-len", "32", "--precision", "fp32", "--json").json["rows"]
    bf16 = cli(folder, "--seq-len", "32", "--precision", "bf16", "--json").json["rows"]
    for row in fp32[:3]:
        assert row["activation_bytes"] == 2 * _korthikanti(32, 1, 64, 4, 2)
    for row in bf16[:3]:
        assert row["activation_bytes"] == _korthikanti(32, 1, 64, 4, 2)
        assert row["activation_bytes_checkpointed"] == 2 * 2 * 32 * 64


def test_bert_base_activations_in_the_table(model_dir, cli, parse_table) -> None:
    from transformers import BertConfig

    text = cli(model_dir(BertConfig(vocab_size=28996)), "--base-model", "--seq-len", "128", "--method", "formula").out
    table = parse_table(text)
    # 12 * 128 * 768 * (34 + 5 * 12 * 128 / 768) = 51,904,512 B in 16 bits; checkpointed 12 * 2 * 128 * 768.
    assert table["bfloat16"][3:6] == ["-", "49.50 MiB", "2.25 MiB"]
    assert table["float16"][3:6] == ["-", "49.50 MiB", "2.25 MiB"]
    assert table["float32"][3:6] == ["-", "99.00 MiB", "4.50 MiB"]


def test_encoder_decoder_gets_neither(model_dir, cli) -> None:
    from transformers import T5Config

    config = T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16, vocab_size=1000)
    data = cli(model_dir(config), "--seq-len", "32", "--json").json
    assert all(r["kv_cache_bytes"] is None and r["activation_bytes"] is None for r in data["rows"])
    assert any("not estimated" in a for a in data["assumptions"])


def test_gpt2_has_a_kv_cache_from_n_head(model_dir, configs, cli) -> None:
    data = cli(model_dir(configs.gpt2()), "--seq-len", "64", "--dtypes", "float32", "--json").json
    assert data["rows"][0]["kv_cache_bytes"] == 2 * 4 * 16 * 64 * 2 * 4  # no GQA: 4 kv heads of 16


def test_no_seq_len_no_input_columns(model_dir, configs, cli, parse_table) -> None:
    folder = model_dir(configs.gpt2())
    data = cli(folder, "--json").json
    assert all(r["kv_cache_bytes"] is None and r["activation_bytes"] is None for r in data["rows"])
    assert parse_table(cli(folder).out)["dtype"] == ["Largest Layer", "Total Size", "Training (adamw)"]


@pytest.mark.parametrize(
    ("checkpointing", "expected"),
    [(False, 3 * (7 * 2 * 96 * 34 + 5 * 6 * 7 * 7 * 2)), (True, 3 * 2 * 7 * 2 * 96)],
)
def test_activation_formula(checkpointing, expected) -> None:
    shape = AttentionShape(layers=3, hidden=96, heads=6, kv_heads=2, head_dim=16, windows=(None,) * 3)
    assert activation_bytes(shape, seq_len=7, batch_size=2, checkpointing=checkpointing) == expected


def test_attention_shape_none_without_the_fields() -> None:
    assert attention_shape(None) is None

    class NoHeads:
        num_hidden_layers = 2
        hidden_size = 64

    assert attention_shape(NoHeads()) is None


@pytest.mark.parametrize(
    "model_type", ["gemma4_text", "embedding_gemma2_text", "dots3_note_text", "neomme", "diffusion_gemma", "musicgen"]
)
def test_per_layer_attributes_do_not_sink_the_attention_shape(model_type) -> None:
    # Heterogeneous configs raise AmbiguousGlobalPerLayerAttributeError on a global read of a
    # per-layer attribute (MusicGen: a ValueError for its two text configs); that attribute is
    # then unknown, and the rest of the estimate stands.
    from transformers import CONFIG_MAPPING

    config = CONFIG_MAPPING[model_type]()
    shape = attention_shape(config)
    text = config.get_text_config() if model_type != "musicgen" else config
    if shape is not None:
        assert shape.layers == text.num_hidden_layers
        assert len(shape.windows) == shape.layers


def test_heterogeneous_config_is_estimated_without_seq_len(model_dir, cli) -> None:
    from transformers import Gemma4TextConfig

    config = Gemma4TextConfig()
    config.architectures = ["Gemma4ForCausalLM"]
    result = cli(model_dir(config), "--dtypes", "bfloat16", "--json")
    assert result.code == 0, result.err
    assert result.json["class"] == "Gemma4ForCausalLM"
    assert result.json["rows"][0]["total_bytes"] > 0
