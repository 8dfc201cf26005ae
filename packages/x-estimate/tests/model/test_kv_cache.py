"""KV cache against the cache transformers itself builds.

Truth: a tiny model of each layout (small sizes, the same layout flags) built for real on the
CPU, run forward with ``use_cache=True``; the bytes of every tensor in the cache it returns.
The estimate: the same config's model on the meta device, measured by ``kv_layout`` (and, for
the layouts the config formula knows, the formula alone).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import pytest
import torch

from x_estimate.model.inference import AttentionShape, attention_shape, kv_cache_bytes

_SMALL = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4}
_WINDOW = 6

LAYOUTS: dict[str, dict[str, Any]] = {
    "llama": {"num_key_value_heads": 2},
    "mistral": {"num_key_value_heads": 2, "sliding_window": _WINDOW},
    "gemma2": {"num_key_value_heads": 2, "head_dim": 16, "sliding_window": _WINDOW},
    "falcon": {"multi_query": True, "new_decoder_architecture": False},
    "deepseek_v3": {
        "num_key_value_heads": 4,
        "q_lora_rank": 32,
        "kv_lora_rank": 16,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16,
        "v_head_dim": 12,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
    },
    # SDPA's mask reads the padding mask's values, impossible on meta: measured with eager attention.
    "biogpt": {},
    # Hybrid: gated delta-net layers keep constant-size conv and recurrent states.
    "qwen3_next": {
        "num_key_value_heads": 2,
        "head_dim": 16,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
    },
}
SEQ_LENS = (1, 3, _WINDOW - 1, _WINDOW, _WINDOW + 1, 3 * _WINDOW)


def _config(model_type: str) -> Any:
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type](vocab_size=100, **_SMALL, **LAYOUTS[model_type])


def _cache_bytes(obj: Any, seen: set[int]) -> int:
    if isinstance(obj, torch.Tensor):
        return 0 if id(obj) in seen or seen.add(id(obj)) else obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_cache_bytes(o, seen) for o in obj)
    return 0


def _real_cache_bytes(model: Any, seq_len: int, batch: int = 1) -> int:
    ids = torch.randint(0, 100, (batch, seq_len), generator=torch.Generator().manual_seed(seq_len))
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
    seen: set[int] = set()
    return sum(_cache_bytes(value, seen) for layer in cache.layers for value in vars(layer).values())


@pytest.fixture(scope="module", params=list(LAYOUTS))
def built(request: pytest.FixtureRequest) -> tuple[str, Any, Any, AttentionShape]:
    from transformers import AutoModelForCausalLM

    config = _config(request.param)
    torch.manual_seed(0)
    real = AutoModelForCausalLM.from_config(config).eval()
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    shape = attention_shape(config, model=meta)
    assert shape is not None and shape.kv is not None, f"{request.param}: no measured layout"
    return request.param, config, real, shape


def test_measured_cache_is_the_bytes_transformers_allocates(built) -> None:
    name, _, real, shape = built
    for seq_len in SEQ_LENS:
        truth = _real_cache_bytes(real, seq_len)
        assert kv_cache_bytes(shape, seq_len=seq_len, batch_size=1, bytes_per_value=4) == truth, (name, seq_len)
    truth = _real_cache_bytes(real, _WINDOW + 2, batch=3)
    assert kv_cache_bytes(shape, seq_len=_WINDOW + 2, batch_size=3, bytes_per_value=4) == truth, name


def test_layout_survives_the_summary_json(built) -> None:
    _, _, _, shape = built
    back = AttentionShape(**json.loads(json.dumps(asdict(shape))))
    assert back == shape
    assert kv_cache_bytes(back, seq_len=11, batch_size=2, bytes_per_value=2) == kv_cache_bytes(
        shape, seq_len=11, batch_size=2, bytes_per_value=2
    )


@pytest.mark.parametrize("model_type", ["llama", "mistral", "gemma2", "falcon", "deepseek_v3"])
def test_config_formula_agrees_where_it_knows_the_layout(model_type) -> None:
    # Without a model (or when its prefill cannot run on meta) the formula answers; for these
    # layouts it is exact too (float tensors only: position counters are not in the formula).
    from transformers import AutoModelForCausalLM

    config = _config(model_type)
    torch.manual_seed(0)
    real = AutoModelForCausalLM.from_config(config).eval()
    shape = attention_shape(config)
    assert shape is not None and shape.kv is None
    for seq_len in (1, _WINDOW, 3 * _WINDOW):
        ids = torch.zeros(1, seq_len, dtype=torch.long)
        with torch.no_grad():
            cache = real(input_ids=ids, use_cache=True).past_key_values
        floats = sum(t.numel() * 4 for layer in cache.layers for t in (layer.keys, layer.values))
        assert kv_cache_bytes(shape, seq_len=seq_len, batch_size=1, bytes_per_value=4) == floats, (model_type, seq_len)


def test_multi_query_falcon_has_one_kv_head_at_full_size() -> None:
    # Falcon-7B: 71 query heads sharing one key/value head; 71x too big when read as 71.
    from transformers import FalconConfig

    shape = attention_shape(FalconConfig(hidden_size=4544, num_attention_heads=71, num_hidden_layers=32))
    assert shape is not None and shape.kv_heads == 1
    assert kv_cache_bytes(shape, seq_len=2048, batch_size=1, bytes_per_value=2) == 2 * 64 * 2048 * 32 * 2


def test_prefill_that_cannot_run_falls_back_to_the_formula(configs) -> None:
    from transformers import LlamaForCausalLM

    config = configs.llama()
    with torch.device("meta"):
        model = LlamaForCausalLM(config)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no meta kernel")

    model.forward = broken
    shape = attention_shape(config, model=model)
    assert shape is not None and shape.kv is None
    assert kv_cache_bytes(shape, seq_len=10, batch_size=1, bytes_per_value=2) == 2 * 2 * 16 * 10 * 2 * 2


def test_measuring_leaves_the_config_as_it_was() -> None:
    # The MoE experts are switched to a meta-friendly kernel for the prefill, and back after:
    # what runs next (the training simulation) must see the model as configured.
    from transformers import AutoModelForCausalLM

    config = _config("deepseek_v3")
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    before = config._experts_implementation
    assert before not in (None, "eager", "batched_mm")
    shape = attention_shape(config, model=meta)
    assert shape is not None and shape.kv is not None
    assert config._experts_implementation == before


def test_eager_attention_fallback_leaves_the_attention_choice_as_it_was() -> None:
    from transformers import AutoModelForCausalLM

    config = _config("biogpt")
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    before = config._attn_implementation
    assert before == "sdpa"
    shape = attention_shape(config, model=meta)
    assert shape is not None and shape.kv is not None
    assert config._attn_implementation == before
