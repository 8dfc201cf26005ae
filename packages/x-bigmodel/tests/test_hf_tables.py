"""transformers' key conversion table, built for one model only, equals transformers' own.

transformers builds the table for every model type on first use (~1,100 compiled patterns);
``x_bigmodel.transformers.key_tables`` runs the same builder with the transform classes recorded and makes only
the entries a model reads. Every entry, and the list for real model classes, must be what
transformers itself returns: same classes, patterns (as given and as processed), compiled
expressions and operations.
"""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from x_bigmodel import from_pretrained, init_empty_weights
from x_bigmodel.transformers.key_tables import _lazy_getter, model_conversions

transformers = pytest.importorskip("transformers")
conversion_mapping = pytest.importorskip("transformers.conversion_mapping")


def signature(transform: Any) -> dict[str, Any]:
    """Everything that decides what a transform does to a key or a tensor."""
    fields = ("source_patterns", "target_patterns", "_original_source_patterns", "_original_target_patterns")
    found: dict[str, Any] = {"class": type(transform)}
    found.update((name, getattr(transform, name, None)) for name in (*fields, "scope_prefix", "base_model_prefix"))
    compiled = getattr(transform, "compiled_sources", None)
    found["compiled"] = None if compiled is None else (compiled.pattern, compiled.flags)
    found["operations"] = [(type(op), sorted(vars(op).items())) for op in getattr(transform, "operations", None) or []]
    if hasattr(transform, "__dict__"):
        found["attributes"] = sorted((k, repr(v)) for k, v in vars(transform).items())
    return found


def unbuilt_view() -> types.SimpleNamespace:
    """The conversion_mapping module as in a fresh process (its table not built), without changing it."""
    return types.SimpleNamespace(**{**vars(conversion_mapping), "_checkpoint_conversion_mapping_cache": None})


def test_every_entry_is_transformers_own() -> None:
    get = _lazy_getter(unbuilt_view())
    assert get is not None
    own = conversion_mapping._build_checkpoint_conversion_mapping()
    assert len(own) > 200
    for model_type, transforms in own.items():
        assert [signature(t) for t in get(model_type)] == [signature(t) for t in transforms], model_type
    assert get("no-such-model-type") is None


def test_each_read_is_a_fresh_copy() -> None:
    get = _lazy_getter(unbuilt_view())
    first, second = get("mixtral"), get("mixtral")
    assert first and all(a is not b for a, b in zip(first, second, strict=True))


def meta_model(name: str, **config: Any) -> torch.nn.Module:
    with init_empty_weights():
        return getattr(transformers, name)(getattr(transformers, name).config_class(**config))


SMALL = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
MODELS = {
    "llama": ("LlamaForCausalLM", {**SMALL, "num_attention_heads": 4}),
    "mixtral": ("MixtralForCausalLM", {**SMALL, "num_attention_heads": 4, "num_local_experts": 4}),
    "gpt2": (
        "GPT2LMHeadModel",
        {"vocab_size": 64, "n_embd": 32, "n_layer": 2, "n_head": 4, "bos_token_id": 0, "eos_token_id": 0},
    ),
    "bert": ("BertModel", {**SMALL, "num_attention_heads": 4}),
    "llava": ("LlavaForConditionalGeneration", {}),
}


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_model_conversions_are_transformers_own(kind, monkeypatch) -> None:
    name, config = MODELS[kind]
    model = meta_model(name, **config)
    monkeypatch.setattr(conversion_mapping, "_checkpoint_conversion_mapping_cache", None)
    ours = model_conversions(model)
    # Only what the model reads was made: transformers' whole table was not built.
    assert conversion_mapping._checkpoint_conversion_mapping_cache is None
    theirs = conversion_mapping.get_model_conversion_mapping(model)
    assert [signature(t) for t in ours] == [signature(t) for t in theirs]


def test_a_table_transformers_built_is_used_as_it_is(monkeypatch) -> None:
    from transformers.core_model_loading import WeightRenaming

    name, config = MODELS["llama"]
    model = meta_model(name, **config)
    registered = WeightRenaming(r"^weights\.", "model.")
    table = {"llama": [registered], "legacy": []}
    monkeypatch.setattr(conversion_mapping, "_checkpoint_conversion_mapping_cache", table)
    assert [signature(t) for t in model_conversions(model)] == [signature(registered)]


def test_from_pretrained_does_not_build_the_whole_table(tmp_path, monkeypatch) -> None:
    name, config = MODELS["llama"]
    torch.manual_seed(0)
    reference = getattr(transformers, name)(transformers.LlamaConfig(**config, tie_word_embeddings=False)).eval()
    reference.save_pretrained(tmp_path)
    monkeypatch.setattr(conversion_mapping, "_checkpoint_conversion_mapping_cache", None)
    model = from_pretrained(tmp_path, show_progress=False)
    assert conversion_mapping._checkpoint_conversion_mapping_cache is None
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
