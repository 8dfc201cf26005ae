"""Strategies chosen by a launch config: an Accelerate-style FSDP config drives x-launch and the
runtime shards a real transformers model, training exactly like one plain process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

WORKERS = Path(__file__).parent / "workers"

# As `accelerate config` writes it (Accelerate 1.15), including keys x ignores.
FSDP_CONFIG = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
enable_cpu_affinity: false
fsdp_config:
  fsdp_activation_checkpointing: true
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_cpu_ram_efficient_loading: true
  fsdp_offload_params: false
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
  fsdp_version: 2
machine_rank: 0
main_training_function: main
mixed_precision: 'no'
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: true
"""


# Two ranks average their half-batch gradients where one process takes the mean of the whole
# batch: the same sum in another order. After 6 AdamW steps the rounding reaches 1.1e-5 on some
# CPUs (measured; plain runs on 1 and on 2 threads agree exactly). Each AdamW step moves a weight
# by up to lr = 5e-3, so a step computed from different gradients shows far above this bound.
WEIGHT_TOLERANCE = 5e-5


def _flat(weights: dict) -> torch.Tensor:
    return torch.cat([torch.tensor(weights[k]) for k in sorted(weights)])


@pytest.fixture(scope="module")
def llama_runs(tmp_path_factory, launch_env) -> dict:
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("llama")
    reports = {}
    for name in ("plain", "fsdp"):
        out, project = root / name, root / f"{name}-project"
        out.mkdir()
        project.mkdir()
        script = [str(WORKERS / "train_llama.py"), str(out), str(project)]
        if name == "plain":
            argv = [sys.executable, *script]
        else:
            config = root / "fsdp.yaml"
            config.write_text(FSDP_CONFIG)
            argv = [str(Path(sys.executable).with_name("x-launch")), "--config_file", str(config), *script]
        result = subprocess.run(argv, env=launch_env(root), capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-4000:]
        reports[name] = json.loads((out / "report.json").read_text())
        reports[name + ":project"] = project
    return reports


def test_accelerate_fsdp_config_shards_each_decoder_layer(llama_runs) -> None:
    fsdp = llama_runs["fsdp"]
    assert (fsdp["type"], fsdp["world"]) == ("FSDP", 2)
    assert fsdp["units"] == ["", "model.layers.0", "model.layers.1", "model.layers.2"]


def test_fsdp_llama_trains_like_one_plain_process(llama_runs) -> None:
    plain, fsdp = llama_runs["plain"], llama_runs["fsdp"]
    assert plain["type"] == "NO"
    assert len(fsdp["losses"]) == len(plain["losses"]) == 6
    assert fsdp["losses"][-1] < fsdp["losses"][0]
    difference = (_flat(plain["weights"]) - _flat(fsdp["weights"])).abs().max().item()
    assert difference < WEIGHT_TOLERANCE, difference


def test_sharded_checkpoint_and_consolidated_model_files(llama_runs) -> None:
    project = llama_runs["fsdp:project"]
    assert {"model_sharded", "optimizer_sharded", "x_checkpoint.json"} <= set(llama_runs["fsdp"]["checkpoint"])
    final = load_file(project / "final" / "model.safetensors")
    plain = load_file(llama_runs["plain:project"] / "final" / "model.safetensors")
    assert sorted(final) == sorted(plain)
    assert tuple(final["model.embed_tokens.weight"].shape) == (64, 32)
    assert max((final[k] - plain[k]).abs().max().item() for k in final) < WEIGHT_TOLERANCE
