"""Placement units and the largest one, which the report names as the Largest Layer."""

from __future__ import annotations

from x_estimate.model.layers import largest_unit, placement_units


def test_no_split_module_is_one_unit_and_direct_tensors_are_their_own() -> None:
    modules = {
        "": "Net",
        "embed": "Embedding",
        "blocks": "ModuleList",
        "blocks.0": "Block",
        "blocks.0.fc1": "Linear",
        "blocks.0.fc2": "Linear",
        "blocks.1": "Block",
        "blocks.1.fc1": "Linear",
        "blocks.1.fc2": "Linear",
        "head": "Linear",
    }
    tensors = [
        "cls_token",
        "embed.weight",
        "blocks.0.fc1.weight",
        "blocks.0.fc2.weight",
        "blocks.1.fc1.weight",
        "blocks.1.fc2.weight",
        "head.weight",
        "head.bias",
    ]
    assert placement_units(modules, tensors, no_split=["Block"]) == [
        "cls_token",
        "embed",
        "blocks.0",
        "blocks.1",
        "head",
    ]
    # Without no_split classes every leaf module is a unit.
    assert placement_units(modules, tensors) == [
        "cls_token",
        "embed",
        "blocks.0.fc1",
        "blocks.0.fc2",
        "blocks.1.fc1",
        "blocks.1.fc2",
        "head",
    ]


def test_root_in_no_split_is_the_whole_model() -> None:
    modules = {"": "Block", "fc": "Linear"}
    assert placement_units(modules, ["fc.weight"], no_split=["Block"]) == [""]


def test_largest_unit_ties_go_to_the_first_in_module_order() -> None:
    sizes = {"": 100, "a": 40, "b": 40, "c": 20}
    assert largest_unit(sizes, ["a", "b", "c"]) == ("a", 40)
    assert largest_unit(sizes, ["c", "b", "a"]) == ("b", 40)
    assert largest_unit({}, []) == ("", 0)
    assert largest_unit({}, ["x"]) == ("x", 0)


def test_bert_embeddings_is_the_largest_unit(model_dir, cli) -> None:
    from transformers import BertConfig

    folder = model_dir(BertConfig(vocab_size=28996))
    data = cli(folder, "--base-model", "--json").json
    f32 = data["rows"][0]
    # word (28996 x 768) + positions (512 x 768) + token types (2 x 768) + LayerNorm (2 x 768), float32,
    # + the int64 position_ids and token_type_ids buffers (512 each): BertEmbeddings is kept whole.
    expected = (28996 + 512 + 2 + 2) * 768 * 4 + 2 * 512 * 8
    assert f32["largest_layer"] == {"name": "embeddings", "bytes": expected}
    halves = {r["dtype"]: r["largest_layer"] for r in data["rows"]}
    assert halves["float16"] == {"name": "embeddings", "bytes": (28996 + 512 + 2 + 2) * 768 * 2 + 2 * 512 * 8}
    text = cli(folder, "--base-model").out
    assert "Largest layer: embeddings, the largest unit a device map keeps whole." in text


def test_gpt2_largest_unit_is_the_tied_embedding(model_dir, configs, cli) -> None:
    data = cli(model_dir(configs.gpt2(n_layer=1)), "--dtypes", "float32", "--json").json
    assert data["rows"][0]["largest_layer"] == {"name": "transformer.wte", "bytes": 1000 * 64 * 4}


def test_decoder_block_is_the_largest_unit_when_it_outweighs_the_embedding(model_dir, configs, cli) -> None:
    # Tiny vocabulary, wide MLP: a whole LlamaDecoderLayer (a no-split unit) is the largest.
    config = configs.llama(vocab_size=16, intermediate_size=1024, tie_word_embeddings=False)
    data = cli(model_dir(config), "--dtypes", "float32", "--json").json
    layer = 4 * 64 * 64 - 2 * 64 * 32 + 3 * 64 * 1024 + 2 * 64  # q,o 64x64; k,v 64x32 (2 kv heads); MLP; 2 norms
    assert data["rows"][0]["largest_layer"] == {"name": "model.layers.0", "bytes": layer * 4}


def test_largest_layer_line_is_omitted_when_rows_disagree(model_dir, configs, cli, parse_table) -> None:
    # float32: the decoder layer (209,024 parameters) beats the 2000 x 64 embedding; int8/int4
    # shrink the layer's linear weights but not the embedding, which then is the largest.
    config = configs.llama(vocab_size=2000, intermediate_size=1024, tie_word_embeddings=False)
    data = cli(model_dir(config), "--json").json
    names = {r["dtype"]: r["largest_layer"]["name"] for r in data["rows"]}
    assert names == {
        "float32": "model.layers.0",
        "float16": "model.layers.0",
        "bfloat16": "model.layers.0",
        "int8": "model.embed_tokens",
        "int4": "model.embed_tokens",
    }
    out = cli(model_dir(config, name="again")).out
    assert "Largest layer:" not in out
