"""FSDP2 on real processes (torchrun, gloo on CPU): parity with one plain process, checkpoints
in both layouts resuming bit for bit, consolidated ``save_model``, and the wrap policies.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from x_common import env

FSDP = {
    env.DISTRIBUTED_TYPE.name: "FSDP",
    env.FSDP_TRANSFORMER_CLS_TO_WRAP.name: "Block",
    env.FSDP_ACTIVATION_CHECKPOINTING.name: "1",
}


def _flat(weights: dict) -> torch.Tensor:
    return torch.cat([torch.tensor(weights[k]) for k in sorted(weights)])


@pytest.fixture(scope="module")
def runs(tmp_path_factory, launch) -> dict:
    """Plain single process; FSDP on 2 processes saving full then sharded checkpoints at an
    accumulation boundary (micro-step 8 of 24); resumes from each."""
    root = tmp_path_factory.mktemp("fsdp")
    results: dict = {}

    def run(name: str, nprocs: int, extra: dict, *args: str) -> None:
        out, project = root / name, root / f"{name}-project"
        out.mkdir()
        project.mkdir(exist_ok=True)
        launch("sharded_worker.py", nprocs, str(out), str(project), *args, env=extra)
        results[name] = [json.loads((out / f"rank{r}.json").read_text()) for r in range(nprocs)]
        results[name + ":project"] = project

    run("plain", 1, {}, "0", "0")
    run("full", 2, FSDP, "8", "0")
    sharded = {**FSDP, env.FSDP_STATE_DICT_TYPE.name: "SHARDED_STATE_DICT"}
    run("sharded", 2, sharded, "8", "0")
    for name, extra in (("full", FSDP), ("sharded", sharded)):
        project = results[name + ":project"]
        resumed = root / f"{name}-resume-project"
        resumed.mkdir()
        (resumed / "ckpt").symlink_to(project / "ckpt")
        out = root / f"{name}-resume"
        out.mkdir()
        launch("sharded_worker.py", 2, str(out), str(resumed), "0", "0", "resume", env=extra)
        results[name + "-resume"] = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return results


def test_two_fsdp_processes_train_like_one_plain_process(runs) -> None:
    plain, fsdp = runs["plain"][0], runs["full"][0]
    assert plain["distributed_type"] == "NO" and fsdp["distributed_type"] == "FSDP"
    assert fsdp["steps"] == plain["steps"] == 24
    difference = (_flat(plain["weights"]) - _flat(fsdp["weights"])).abs().max().item()
    assert difference < 1e-5, difference


def test_parameters_are_sharded_in_units_of_the_named_layer_class(runs) -> None:
    ranks = runs["full"]
    assert [r["param_type"] for r in ranks] == ["DTensor", "DTensor"]
    # inp.weight is 16x6: each of the two ranks holds half of its rows.
    assert [r["local_numel"] for r in ranks] == [48, 48]
    assert ranks[0]["units"] == ["", "blocks.0", "blocks.1", "blocks.2"]


def test_full_state_dict_checkpoint_holds_whole_tensors_by_name(runs) -> None:
    project: Path = runs["full:project"]
    files = runs["full"][0]["checkpoint_files"]
    assert "model.safetensors" in files and "optimizer.bin" in files and "model_sharded" not in files
    weights = load_file(project / "ckpt" / "model.safetensors")
    assert tuple(weights["inp.weight"].shape) == (16, 6)
    assert tuple(weights["blocks.2.ff.0.weight"].shape) == (32, 16)
    optimizer = torch.load(project / "ckpt" / "optimizer.bin", weights_only=True)
    assert "blocks.0.ff.0.weight" in optimizer["state"]
    assert tuple(optimizer["state"]["inp.weight"]["exp_avg"].shape) == (16, 6)
    manifest = json.loads((project / "ckpt" / "x_checkpoint.json").read_text())
    assert manifest["layouts"]["models"] == [{"layout": "full", "strategy": "FSDP", "file": "model.safetensors"}]


def test_sharded_checkpoint_is_written_by_every_rank_through_dcp(runs) -> None:
    files = runs["sharded"][0]["checkpoint_files"]
    assert "model_sharded" in files and "optimizer_sharded" in files and "model.safetensors" not in files
    assert runs["sharded"][0]["sharded_files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]


@pytest.mark.parametrize("layout", ["full", "sharded"])
def test_resume_from_a_checkpoint_ends_bit_identical(runs, layout) -> None:
    uninterrupted, resumed = runs[layout][0], runs[layout + "-resume"][0]
    assert resumed["steps"] == 24
    assert resumed["losses"] == uninterrupted["losses"][8:]
    assert torch.equal(_flat(resumed["weights"]), _flat(uninterrupted["weights"]))


def test_save_model_writes_consolidated_safetensors(runs) -> None:
    final = load_file(runs["full:project"] / "final" / "model.safetensors")
    expected = runs["full"][0]["weights"]
    assert sorted(final) == sorted(expected)
    assert all(torch.equal(final[k].flatten(), torch.tensor(v)) for k, v in expected.items())


@pytest.fixture(scope="module")
def cases(tmp_path_factory, launch) -> list[dict]:
    out = tmp_path_factory.mktemp("fsdp-cases")
    launch("fsdp_cases_worker.py", 2, str(out))
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_cpu_offload_is_refused_on_cpu_with_the_reason(cases) -> None:
    assert cases[0]["offload"] == (
        "FSDP cpu_offload (fsdp_offload_params) needs a GPU: this run computes on CPU, where parameters already "
        "live in CPU memory; set it to false"
    )


def test_unknown_wrap_class_is_refused_on_every_rank(cases) -> None:
    for case in cases:
        assert case["unknown_class"].startswith("fsdp_transformer_layer_cls_to_wrap: MysteryLayer not found in Net")


def test_bf16_policy_trains_with_fp32_shards_and_size_based_units(cases) -> None:
    bf16 = cases[0]["bf16"]
    assert bf16["losses"][1] < bf16["losses"][0] * 0.5
    # Shards (and the optimizer's view of them) stay float32; outputs come back as float32.
    assert (bf16["param_dtype"], bf16["output_dtype"]) == ("torch.float32", "torch.float32")
    # Each Block's feed-forward holds 1,072 parameters (>= 1,000) and becomes the unit; the
    # LayerNorms (32 each), inp (112) and out (17) stay with the root.
    assert bf16["units"] == ["", "blocks.0.ff", "blocks.1.ff", "blocks.2.ff"]


def test_meta_model_on_other_ranks_receives_rank0_weights(cases) -> None:
    assert cases[0]["meta"] == {"rank0_weights_everywhere": True, "finite_output": True}
    assert cases[1]["meta"]["finite_output"] is True


def test_sharded_checkpoint_from_two_processes_resumes_on_one(runs, tmp_path, launch) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    project = tmp_path / "project"
    project.mkdir()
    (project / "ckpt").symlink_to(runs["sharded:project"] / "ckpt")
    one = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    extra = {**FSDP, env.FSDP_STATE_DICT_TYPE.name: "SHARDED_STATE_DICT", **one}
    launch("sharded_worker.py", 1, str(tmp_path), str(project), "0", "0", "resume", env=extra)
    alone = json.loads((tmp_path / "rank0.json").read_text())
    assert alone["ranks"] == 1 and alone["param_type"] == "DTensor"
    difference = (_flat(alone["weights"]) - _flat(runs["sharded"][0]["weights"])).abs().max().item()
    assert difference < 1e-5, difference


def test_one_process_started_by_x_launch_shards_over_a_world_of_one(inline_worker, workers) -> None:
    # x-launch --num_processes 1 runs the script directly (no torchrun, no RANK): X_LAUNCHED says so.
    script = inline_worker(
        """
        import torch
        from _helpers import report
        from x_runtime import Accelerator
        accelerator = Accelerator(cpu=True)
        model = accelerator.prepare(torch.nn.Linear(4, 2))
        report({"type": accelerator.distributed_type, "param": type(next(model.parameters())).__name__})
        """
    )
    extra = {env.LAUNCHED_BY_X.name: "1", env.DISTRIBUTED_TYPE.name: "FSDP"}
    assert workers(script, 1, env=extra) == [{"type": "FSDP", "param": "DTensor"}]
