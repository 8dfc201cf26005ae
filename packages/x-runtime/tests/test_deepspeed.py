"""DeepSpeed ZeRO 1-3 on real processes (torchrun, gloo on CPU); runs where DeepSpeed is installed
(the ``tests_deepspeed`` nox session, which CI runs)."""

from __future__ import annotations

import json

import pytest
import torch

from x_common import env

pytest.importorskip("deepspeed")


def _flat(weights: dict) -> torch.Tensor:
    return torch.cat([torch.tensor(weights[k]) for k in sorted(weights)])


def _deepspeed(stage: int, gather: bool = True) -> dict[str, str]:
    return {
        env.DISTRIBUTED_TYPE.name: "DEEPSPEED",
        env.DEEPSPEED_ZERO_STAGE.name: str(stage),
        env.DEEPSPEED_GRADIENT_CLIPPING.name: "0.5",
        # ZeRO-3's whole weights are gathered for saving only when the config asks (as in Accelerate)
        env.DEEPSPEED_ZERO3_SAVE_16BIT_MODEL.name: "1" if gather else "0",
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory, launch) -> dict:
    root = tmp_path_factory.mktemp("deepspeed")
    results: dict = {}

    def run(name: str, nprocs: int, extra: dict, *args: str, project_of: str | None = None) -> None:
        out, project = root / name, root / f"{name}-project"
        out.mkdir()
        project.mkdir()
        if project_of is not None:
            (project / "ckpt").symlink_to(results[project_of] / "ckpt")
        launch("sharded_worker.py", nprocs, str(out), str(project), *args, env=extra, timeout=400)
        results[name] = [json.loads((out / f"rank{r}.json").read_text()) for r in range(nprocs)]
        results[name + ":project"] = project

    run("plain", 1, {}, "0", "0")
    for stage in (1, 2, 3):
        run(f"zero{stage}", 2, _deepspeed(stage), "8", "0")
    for stage in (2, 3):
        run(f"zero{stage}-resume", 2, _deepspeed(stage), "0", "0", "resume", project_of=f"zero{stage}:project")
    run("zero3-no-gather", 2, _deepspeed(3, gather=False), "4", "0")
    return results


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stage_trains_like_one_plain_process(runs, stage) -> None:
    plain, ds = runs["plain"][0], runs[f"zero{stage}"][0]
    assert ds["distributed_type"] == "DEEPSPEED" and ds["steps"] == 24
    difference = (_flat(plain["weights"]) - _flat(ds["weights"])).abs().max().item()
    assert difference < 1e-5, difference


@pytest.mark.parametrize("stage", [2, 3])
def test_resume_from_the_engines_checkpoint_is_bit_identical(runs, stage) -> None:
    uninterrupted, resumed = runs[f"zero{stage}"][0], runs[f"zero{stage}-resume"][0]
    assert resumed["losses"] == uninterrupted["losses"][8:]
    assert torch.equal(_flat(resumed["weights"]), _flat(uninterrupted["weights"]))


def test_checkpoint_holds_the_engines_files(runs) -> None:
    files = runs["zero3"][0]["checkpoint_files"]
    assert "model_deepspeed" in files and "x_checkpoint.json" in files and "model.safetensors" not in files
    folder = runs["zero3:project"] / "ckpt" / "model_deepspeed" / "state"
    assert sorted(p.name for p in folder.iterdir()) == [
        "zero_pp_rank_0_mp_rank_00_model_states.pt",
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_model_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    ]


def test_save_model_gathers_zero3_weights(runs) -> None:
    from safetensors.torch import load_file

    final = load_file(runs["zero3:project"] / "final" / "model.safetensors")
    expected = runs["zero3"][0]["weights"]
    assert sorted(final) == sorted(expected)
    assert tuple(final["inp.weight"].shape) == (16, 6)
    assert all(torch.equal(final[k].flatten(), torch.tensor(v)) for k, v in expected.items())


def test_zero3_weights_are_gathered_only_when_the_config_asks(runs) -> None:
    refused = runs["zero3-no-gather"][0]["state_dict_refused"]
    assert refused is not None and refused.startswith("ZeRO-3 keeps each weight in shards")
    assert "stage3_gather_16bit_weights_on_model_save" in refused
    assert runs["zero3"][0]["state_dict_refused"] is None
