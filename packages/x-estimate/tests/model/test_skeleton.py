"""Which class is built, on the meta device, and tied weights counted once."""

from __future__ import annotations

import json
import re

import pytest
import torch

from x_common.module_sizes import sizes_of
from x_common.sizes import format_size
from x_estimate.model.errors import EstimateError
from x_estimate.model.skeleton import build_skeleton
from x_estimate.model.source import resolve_source


def _real_sizes(model: torch.nn.Module) -> tuple[int, int]:
    """(unique parameters, float32 bytes of unique parameters and buffers) of a meta model."""
    params = {id(p): p for p in model.parameters()}
    buffers = {id(b): b for b in model.buffers()}
    nbytes = sum(p.numel() * 4 for p in params.values())
    nbytes += sum(b.numel() * (4 if b.is_floating_point() else b.element_size()) for b in buffers.values())
    return sum(p.numel() for p in params.values()), nbytes


def test_skeleton_is_on_meta_and_in_float32(model_dir, configs) -> None:
    skeleton = build_skeleton(resolve_source(str(model_dir(configs.llama(dtype="bfloat16")))))
    tensors = [*skeleton.model.parameters(), *skeleton.model.buffers()]
    assert tensors
    assert {t.device.type for t in tensors} == {"meta"}
    assert {t.dtype for t in skeleton.model.parameters()} == {torch.float32}
    assert skeleton.class_name == "LlamaForCausalLM"
    assert skeleton.note == "config.architectures"
    assert skeleton.no_split == frozenset({"LlamaDecoderLayer"})


@pytest.mark.parametrize(
    ("config_name", "class_name"),
    [("gpt2", "GPT2LMHeadModel"), ("bert", "BertForMaskedLM"), ("llama", "LlamaForCausalLM")],
)
def test_config_architectures_is_built_and_printed(config_name, class_name, model_dir, configs, cli) -> None:
    folder = model_dir(getattr(configs, config_name)())
    result = cli(folder, "--dtypes", "float32")
    assert result.code == 0, result.err
    assert result.out.splitlines()[0] == (
        f"Memory for `{folder}`: {class_name} (transformers, config.architectures; from local folder)"
    )
    assert cli(folder, "--json").json["class"] == class_name


def test_base_model_builds_the_bare_model(model_dir, configs, cli) -> None:
    folder = model_dir(configs.bert())
    headed = cli(folder, "--dtypes", "float32", "--json").json
    bare = cli(folder, "--dtypes", "float32", "--json", "--base-model").json
    assert headed["class"] == "BertForMaskedLM"
    assert bare["class"] == "BertModel"
    text = cli(folder, "--dtypes", "float32", "--base-model").out
    assert (
        "BertModel (transformers, the bare base model (--base-model), as Accelerate builds it; from local folder)"
        in (text)
    )
    # BertModel has a pooler (64x64 + 64) the MLM model lacks; the MLM head adds a transform
    # (64x64 + 64 + LayerNorm 128) and a decoder bias (1000); the decoder weight is tied.
    assert headed["parameters"] - bare["parameters"] == (64 * 64 + 64 + 128 + 1000) - (64 * 64 + 64)


def test_unknown_architecture_falls_back_to_the_bare_model(model_dir, configs, cli) -> None:
    folder = model_dir(configs.gpt2(architectures=["NoSuchModelClass"]))
    result = cli(folder, "--dtypes", "float32")
    assert result.code == 0, result.err
    assert "GPT2Model (transformers, no known class in config.architectures: the bare base model;" in result.out


def test_bert_mlm_decoder_is_tied_and_counted_once(model_dir, configs, cli) -> None:
    from transformers import BertForMaskedLM

    config = configs.bert()
    real = BertForMaskedLM(config)
    assert real.cls.predictions.decoder.weight is real.bert.embeddings.word_embeddings.weight
    data = cli(model_dir(config), "--dtypes", "float32", "--json").json
    assert data["parameters"] == sum(p.numel() for p in real.parameters())
    assert data["rows"][0]["total_bytes"] == _real_sizes(real)[1]


def test_gpt2_lm_head_is_tied_to_wte_and_counted_once(model_dir, configs) -> None:
    from x_estimate.model.summary import summarize

    skeleton = build_skeleton(resolve_source(str(model_dir(configs.gpt2()))))
    assert skeleton.model.lm_head.weight is skeleton.model.transformer.wte.weight
    summary = summarize(skeleton)
    wte = [t for t in summary.tensors if "transformer.wte.weight" in t.names]
    assert len(wte) == 1
    assert set(wte[0].names) == {"transformer.wte.weight", "lm_head.weight"}
    params, nbytes = _real_sizes(skeleton.model)
    assert summary.parameters == params == 172_288
    assert sizes_of(summary.tensors, "float32")[""] == nbytes
    # Untied, the head is a second 1000 x 64 matrix.
    untied = summarize(
        build_skeleton(resolve_source(str(model_dir(configs.gpt2(tie_word_embeddings=False), "untied"))))
    )
    assert untied.parameters == 172_288 + 1000 * 64


def test_t5_small_shared_embedding_counted_once(model_dir, cli, parse_table) -> None:
    from transformers import T5Config

    config = T5Config(
        d_model=512,
        d_ff=2048,
        num_layers=6,
        num_heads=8,
        vocab_size=32128,
        architectures=["T5ForConditionalGeneration"],
    )
    folder = model_dir(config)
    data = cli(folder, "--json").json
    assert data["class"] == "T5ForConditionalGeneration"
    assert data["parameters"] == 60_506_624
    f32 = data["rows"][0]
    assert f32["dtype"] == "float32"
    assert f32["total_bytes"] == 60_506_624 * 4
    assert f32["largest_layer"] == {"name": "shared", "bytes": 32128 * 512 * 4}
    table = parse_table(cli(folder).out)
    assert table["float32"][1] == "230.81 MiB"
    assert table["float16"][1] == "115.41 MiB" == format_size(60_506_624 * 2)


def test_config_declaring_bfloat16_is_sized_from_float32(model_dir, configs, cli) -> None:
    config = configs.llama(dtype="bfloat16")
    folder = model_dir(config)
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        real = LlamaForCausalLM._from_config(configs.llama(), dtype=torch.float32)
    params, f32_bytes = _real_sizes(real)
    rows = {r["dtype"]: r for r in cli(folder, "--json").json["rows"]}
    assert rows["float32"]["total_bytes"] == f32_bytes
    buffers = sum(b.numel() * 4 for b in real.buffers())  # rotary inv_freq, float32
    assert rows["bfloat16"]["total_bytes"] == rows["float16"]["total_bytes"] == params * 2 + buffers // 2


def test_config_declaring_float16_in_the_old_key_is_sized_from_float32(model_dir, configs, cli) -> None:
    config = configs.gpt2().to_dict()
    config.pop("dtype", None)
    config["torch_dtype"] = "float16"
    rows = {r["dtype"]: r for r in cli(model_dir(config), "--json").json["rows"]}
    assert rows["float32"]["total_bytes"] == 172_288 * 4
    assert rows["float16"]["total_bytes"] == 172_288 * 2


def test_config_transformers_cannot_build_is_one_line(model_dir, configs) -> None:
    # hidden size 65 is not a multiple of 4 heads: transformers refuses to build the attention.
    folder = model_dir(configs.bert(hidden_size=65).to_dict())
    with pytest.raises(EstimateError) as exc:
        build_skeleton(resolve_source(str(folder)))
    assert str(exc.value).startswith(f"{folder}")
    assert "\n" not in str(exc.value)


def test_auto_map_without_trust_remote_code_is_refused(model_dir, configs) -> None:
    config = {**configs.gpt2().to_dict(), "auto_map": {"AutoModel": "modeling_x.XModel"}}
    folder = model_dir(config)
    with pytest.raises(EstimateError) as exc:
        build_skeleton(resolve_source(str(folder)))
    assert str(exc.value) == (
        f"{folder} defines its model in its own code (auto_map in config.json); read that code, "
        "then pass --trust_remote_code to run it"
    )


def test_a_named_json_file_is_read_not_its_folders_config_json(model_dir, configs, cli) -> None:
    folder = model_dir(configs.llama(num_hidden_layers=2))
    big = configs.llama(num_hidden_layers=6, hidden_size=128)
    (folder / "big.json").write_text(big.to_json_string())
    with torch.device("meta"):
        truth = type(build_skeleton(resolve_source(str(folder))).model)(big)
    data = cli(folder / "big.json", "--dtypes", "float32", "--json").json
    assert data["rows"][0]["total_bytes"] == _real_sizes(truth)[1]
    assert data["parameters"] == _real_sizes(truth)[0]
    small = cli(folder, "--dtypes", "float32", "--json").json
    assert small["rows"][0]["total_bytes"] < data["rows"][0]["total_bytes"]


def test_two_hundred_thousand_layers_are_refused_in_seconds(model_dir, configs, run_python) -> None:
    import time

    from x_estimate.model.config_checks import MAX_LAYERS

    folder = model_dir(configs.llama(num_hidden_layers=200_000))
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over fork and exec, so a child of a large
    # pytest process would report its parent's size; the high-water mark is the new image's own.
    code = (
        "import re, sys\n"
        "from x_estimate.cli import main\n"
        "try:\n    main(sys.argv[1:])\n"
        "except SystemExit as exc:\n"
        "    hwm = re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1)\n"
        "    print(exc.code, hwm)\n"
    )
    start = time.monotonic()
    out = run_python(code, folder, timeout=60)
    elapsed = time.monotonic() - start
    assert elapsed < 30, elapsed
    exit_code, max_rss_kib = out.stdout.split()
    assert exit_code == "1"
    assert int(max_rss_kib) < 2 * 2**20  # under 2 GiB: the layers were never built
    line = out.stderr.strip()
    assert "\n" not in line
    assert line.endswith(
        f"sets num_hidden_layers to 200,000; x-estimate builds at most {MAX_LAYERS:,} layers "
        "(published models have under 200): check the config"
    )


def test_layer_bound_applies_to_nested_configs(model_dir, configs) -> None:
    folder = model_dir({**configs.llama().to_dict(), "text_config": {"num_hidden_layers": 5000}})
    with pytest.raises(EstimateError, match=r"sets text_config.num_hidden_layers to 5,000;"):
        build_skeleton(resolve_source(str(folder)))


def test_list_sizes_transformers_accepts_are_built(model_dir) -> None:
    # Swin: num_heads is one count per stage; refused before as "not a positive integer".
    from transformers import SwinConfig, SwinModel

    config = SwinConfig(embed_dim=16, depths=[1, 1], num_heads=[2, 4], image_size=32, window_size=4)
    config.architectures = ["SwinModel"]
    skeleton = build_skeleton(resolve_source(str(model_dir(config))))
    with torch.device("meta"):
        truth = SwinModel(config)
    assert skeleton.class_name == "SwinModel"
    assert _real_sizes(skeleton.model) == _real_sizes(truth)


def test_zero_size_that_breaks_the_build_is_named(model_dir, configs) -> None:
    folder = model_dir({**configs.bert().to_dict(), "num_attention_heads": 0})
    with pytest.raises(EstimateError) as info:
        build_skeleton(resolve_source(str(folder)))
    message = str(info.value)
    assert "\n" not in message
    assert message.endswith("(config.json sets num_attention_heads to 0)")


def test_tying_follows_the_class_not_tie_word_embeddings(model_dir) -> None:
    # LUKE ties its entity head, not its word decoder, even with tie_word_embeddings=True.
    from transformers import LukeConfig, LukeForMaskedLM

    config = LukeConfig(
        vocab_size=100, entity_vocab_size=50, hidden_size=32, entity_emb_size=16, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=64, tie_word_embeddings=True, architectures=["LukeForMaskedLM"],
    )  # fmt: skip
    skeleton = build_skeleton(resolve_source(str(model_dir(config))))
    with torch.device("meta"):
        truth = LukeForMaskedLM._from_config(config, dtype=torch.float32)
    assert _real_sizes(skeleton.model) == _real_sizes(truth)
    assert skeleton.model.lm_head.decoder.weight is not skeleton.model.luke.embeddings.word_embeddings.weight


@pytest.mark.parametrize(("key", "value"), [("hidden_size", -64), ("num_attention_heads", [2, -1]), ("n_head", 2.5)])
def test_negative_or_fractional_sizes_are_refused_by_name(key, value, model_dir, configs) -> None:
    folder = model_dir({**configs.bert().to_dict(), key: value})
    with pytest.raises(EstimateError, match=re.escape(f"sets {key} to {value!r}; it must be a positive integer") + "$"):
        build_skeleton(resolve_source(str(folder)))
