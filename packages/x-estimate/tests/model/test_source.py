"""Where MODEL comes from: local folder, config.json path, the Hugging Face cache, timm's registry."""

from __future__ import annotations

import json

import pytest

from x_estimate.model.errors import EstimateError
from x_estimate.model.source import resolve_source


def test_local_folder_with_config_json(model_dir, configs, cli) -> None:
    folder = model_dir(configs.gpt2())
    source = resolve_source(str(folder))
    assert (source.library, source.origin, source.config_dir) == ("transformers", "local folder", folder)
    assert source.config["model_type"] == "gpt2"
    assert source.timm_name is None

    data = cli(folder, "--json").json
    assert (data["source"], data["library"], data["class"]) == ("local folder", "transformers", "GPT2LMHeadModel")


def test_path_to_a_config_json_file(model_dir, configs, cli) -> None:
    folder = model_dir(configs.gpt2())
    source = resolve_source(str(folder / "config.json"))
    assert (source.origin, source.config_dir) == ("local folder", folder)

    by_file = cli(folder / "config.json", "--json").json
    by_folder = cli(folder, "--json").json
    assert by_file["source"] == "local folder"
    assert by_file["rows"] == by_folder["rows"]


def test_a_file_of_another_name_is_the_file_read(model_dir, configs) -> None:
    folder = model_dir(configs.gpt2())
    (folder / "big.json").write_text(configs.gpt2(n_layer=5).to_json_string())
    source = resolve_source(str(folder / "big.json"))
    assert (source.config_file, source.config_dir) == (folder / "big.json", folder)
    assert source.config["n_layer"] == 5
    assert resolve_source(str(folder)).config_file == folder / "config.json"


def test_hub_id_is_served_from_the_local_cache_while_offline(hub_cache, configs, run_script) -> None:
    # The real console script, offline, with only the cache layout huggingface_hub writes.
    hub_cache("acme/tiny-gpt2", configs.gpt2().to_dict())
    out = run_script("acme/tiny-gpt2", "--dtypes", "float32", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["source"] == "Hugging Face cache"
    assert data["class"] == "GPT2LMHeadModel"
    assert data["model"] == "acme/tiny-gpt2"
    # 2 layers of n_embd 64, vocab 1000, 128 positions, head tied to wte.
    assert data["parameters"] == 172_288
    assert data["rows"][0]["total_bytes"] == 172_288 * 4


def test_hub_id_in_cache_resolves_in_process(hub_cache, configs, cli) -> None:
    snapshot = hub_cache("acme/tiny-bert", configs.bert().to_dict())
    source = resolve_source("acme/tiny-bert")
    assert (source.origin, source.library, source.config_dir) == ("Hugging Face cache", "transformers", snapshot)
    result = cli("acme/tiny-bert", "--dtypes", "float32")
    assert result.code == 0, result.err
    assert "BertForMaskedLM (transformers, config.architectures; from Hugging Face cache)" in result.out


def test_hub_id_not_cached_while_offline_says_how_to_fix(cli) -> None:
    with pytest.raises(EstimateError) as exc:
        resolve_source("acme/not-cached")
    message = str(exc.value)
    assert "acme/not-cached is not in the Hugging Face cache and HF_HUB_OFFLINE is set" in message
    assert "hf download acme/not-cached config.json" in message
    assert "local folder" in message

    result = cli("acme/not-cached")
    assert result.code == 1
    assert result.out == ""
    assert result.err.strip().splitlines() == [f"Error: {message}"]


def test_timm_registry_name(cli) -> None:
    source = resolve_source("resnet50")
    assert (source.library, source.origin, source.timm_name, source.config) == (
        "timm",
        "timm registry",
        "resnet50",
        None,
    )
    data = cli("resnet50", "--dtypes", "float32", "--json").json
    assert (data["library"], data["class"], data["source"]) == ("timm", "ResNet", "timm registry")
    assert data["parameters"] == 25_557_032


def test_timm_hub_style_name_takes_head_size_from_the_registry_tag(cli) -> None:
    import timm
    import torch

    data = cli("timm/vit_base_patch16_224.augreg_in21k", "--dtypes", "float32", "--json").json
    assert (data["library"], data["class"], data["source"]) == ("timm", "VisionTransformer", "timm registry")
    with torch.device("meta"):
        in21k = timm.create_model("vit_base_patch16_224", num_classes=21843)
    expected = sum(p.numel() for p in in21k.parameters())
    assert data["parameters"] == expected
    # Against the 1000-class default: the head is 21843 x 768 + 21843 bias.
    default = cli("vit_base_patch16_224", "--dtypes", "float32", "--json").json
    assert data["parameters"] - default["parameters"] == (21843 - 1000) * (768 + 1)


def test_hf_hub_prefix_for_a_registry_name() -> None:
    source = resolve_source("hf-hub:timm/resnet18")
    assert (source.library, source.origin, source.timm_name) == ("timm", "timm registry", "resnet18")


def test_hub_unreachable_when_online_fails_fast_with_the_fix(monkeypatch) -> None:
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    with pytest.raises(EstimateError) as exc:
        resolve_source("acme/not-cached")
    assert str(exc.value) == (
        "acme/not-cached is not in the Hugging Face cache and http://127.0.0.1:9 cannot be reached: "
        "download its config once (hf download acme/not-cached config.json) or pass a local folder"
    )


def test_library_name_timm_for_a_registry_name(cli) -> None:
    result = cli("resnet18", "--library_name", "timm", "--dtypes", "float32")
    assert result.code == 0, result.err
    assert "ResNet (timm, timm.create_model('resnet18'); from timm registry)" in result.out
    assert "11,689,512 trainable parameters" in result.out
    # The dash spelling is accepted too.
    assert cli("resnet18", "--library-name", "timm", "--dtypes", "float32").out == result.out


def test_unknown_timm_name_with_library_timm(cli) -> None:
    result = cli("not_a_timm_net", "--library_name", "timm")
    assert result.code == 1
    assert result.err.strip() == (
        "Error: 'not_a_timm_net' is not a timm model name; list them with: "
        'python -c "import timm; print(timm.list_models())"'
    )


def test_library_name_overrides_detection(model_dir, cli) -> None:
    # A config with both timm's "architecture" and transformers' "model_type": detected as
    # transformers (a ResNetModel), built by timm when --library_name says so.
    folder = model_dir({"architecture": "resnet18", "model_type": "resnet", "num_classes": 7})
    detected = cli(folder, "--dtypes", "float32", "--json").json
    assert (detected["library"], detected["class"]) == ("transformers", "ResNetModel")

    forced = cli(folder, "--dtypes", "float32", "--json", "--library_name", "timm").json
    assert (forced["library"], forced["class"], forced["source"]) == ("timm", "ResNet", "local folder")
    # resnet18 with a 7-class head: 11,689,512 - 1000 * 513 + 7 * 513.
    assert forced["parameters"] == 11_689_512 - 993 * 513


def test_local_timm_folder_is_detected_and_uses_its_num_classes(model_dir, cli) -> None:
    folder = model_dir({"architecture": "resnet18", "num_classes": 7})
    source = resolve_source(str(folder))
    assert (source.library, source.timm_name) == ("timm", "resnet18")
    data = cli(folder, "--dtypes", "float32", "--json").json
    assert (data["library"], data["class"], data["parameters"]) == ("timm", "ResNet", 11_689_512 - 993 * 513)

    # Forcing transformers on it fails with a one-line reason, not a traceback.
    result = cli(folder, "--library_name", "transformers")
    assert result.code == 1
    assert result.err.startswith(f"Error: {folder}: transformers cannot read its config:")


def test_library_name_transformers_skips_the_timm_registry(cli) -> None:
    # "resnet50" is a timm name; forced to transformers it is a Hub id, not cached here.
    result = cli("resnet50", "--library_name", "transformers")
    assert result.code == 1
    assert "resnet50 is not in the Hugging Face cache" in result.err


@pytest.mark.parametrize("repo_id", ["timm/my_resnet_finetune", "acme/my_resnet_finetune"])
def test_hub_repo_with_a_timm_config_is_built_by_timm(repo_id, hub_cache, cli) -> None:
    # A timm checkpoint on the Hub that is not a registry name: its config.json names the
    # architecture and the head size. Detection must build it as --library_name timm does.
    hub_cache(repo_id, {"architecture": "resnet18", "num_classes": 5})
    forced = cli(repo_id, "--library_name", "timm", "--dtypes", "float32", "--json").json
    assert (forced["library"], forced["class"], forced["source"]) == ("timm", "ResNet", "Hugging Face cache")
    assert forced["parameters"] == 11_689_512 - 995 * 513

    detected = cli(repo_id, "--dtypes", "float32", "--json")
    assert detected.code == 0, detected.err
    assert detected.json["rows"] == forced["rows"]


@pytest.mark.parametrize("model", ["./does-not-exist", "/no/such/folder", "a/b/c", "missing-folder/"])
def test_path_like_names_that_do_not_exist(model) -> None:
    with pytest.raises(EstimateError) as exc:
        resolve_source(model)
    assert str(exc.value) == (
        f"{model}: no such file or folder; pass a folder holding config.json, a Hub id or a timm name"
    )


def test_a_mistyped_folder_is_said_to_be_missing_with_what_is_there(tmp_path, monkeypatch, configs, hub_cache, cli):
    (tmp_path / "models" / "gpt2").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    result = cli("models/gtp2")
    assert result.code == 1 and result.out == ""
    assert result.err.strip() == (
        "Error: models/gtp2: no such folder (models/ is a folder here; nor can a Hub id of that name be read); "
        "did you mean models/gpt2?"
    )
    assert "hf download" not in result.err
    # A folder named like a Hub organisation never hides a cached Hub id.
    (tmp_path / "acme").mkdir()
    hub_cache("acme/tiny-bert", configs.bert().to_dict())
    assert resolve_source("acme/tiny-bert").origin == "Hugging Face cache"


def test_unknown_library_is_refused() -> None:
    with pytest.raises(EstimateError, match="unknown library 'keras'; expected one of transformers, timm"):
        resolve_source("resnet50", "keras")
