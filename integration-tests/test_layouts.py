"""Layouts past FSDP alone, with real processes on CPU (gloo): a tiny transformers Llama trains to the
weights of one process under TP, HSDP, FSDP2 x TP and HSDP x TP on 8 ranks, given in code or by
x-launch's ``--parallelism_config_*`` flags; resumes exactly across layouts and world sizes; its
sharded checkpoint merges to one safetensors file.

Budget: about 3 minutes on 2 cores (10 launches; each launch trains fp32 then bf16 in the same
processes, where a layout is asked for both).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("transformers")

WORKER = Path(__file__).parent / "workers" / "layout_train.py"
TRAINER = Path(__file__).parent / "workers" / "layout_trainer.py"
X_LAUNCH = str(Path(sys.executable).with_name("x-launch"))
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))

# Measured (torch 2.13 CPU): every layout within 1.4e-6 of one process after 3 AdamW steps at lr
# 1e-4, while each weight moves ~3e-4 (checked below): a wrong gradient (counted twice by a tp
# group, averaged over the wrong ranks, a batch read twice) moves weights by about the lr.
TOLERANCE = 1e-5
BF16_LOSS = 2e-3  # bf16 compute against fp32 losses of ~5.5 (measured within 3e-4)


def _run(argv: list[str], env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-6000:]
    return result


def _torchrun(n: int, *args: str) -> list[str]:
    return [TORCHRUN, "--standalone", "--nproc_per_node", str(n), str(WORKER), *args]


def _x_launch(n: int, sizes: dict[str, int], *args: str) -> list[str]:
    flags = [f"--parallelism_config_{dim}_size={size}" for dim, size in sizes.items()]
    return [X_LAUNCH, "--cpu", "--num_processes", str(n), "--use_parallelism_config", *flags, str(WORKER), *args]


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "weights.safetensors"))


def _report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("layouts")


@pytest.fixture(scope="module")
def one_process(root: Path, launch_env) -> dict[str, Path]:
    """The reference: one plain process, 3 and 4 steps (fp32 and bf16 for 3)."""
    env = launch_env(root)
    _run([sys.executable, str(WORKER), str(root / "one3"), "--precisions", "no,bf16"], env)
    _run([sys.executable, str(WORKER), str(root / "one3tied"), "--tied"], env)
    _run([sys.executable, str(WORKER), str(root / "one4"), "--steps", "4", "--split"], env)
    return {"3": root / "one3" / "no", "3tied": root / "one3tied" / "no", "4": root / "one4" / "no"}


def _initial(root: Path, launch_env, tied: bool) -> dict[str, torch.Tensor]:
    out = root / ("zero-tied" if tied else "zero")
    if not (out / "no").exists():
        _run([sys.executable, str(WORKER), str(out), "--steps", "0", *(["--tied"] if tied else [])], launch_env(root))
    return _weights(out / "no")


LAYOUTS = {
    # name: (processes, sizes, given in code or by x-launch's flags, expected mesh, dp, type)
    # Tied embeddings: the vocabulary-parallel embedding and the colwise head share one split weight.
    "tp2": (2, {"dp_replicate": 1, "dp_shard": 1, "tp": 2}, "code-tied", ["tp"], 1, "MULTI_CPU"),
    "hsdp2x2": (4, {"dp_replicate": 2, "dp_shard": 2, "tp": 1}, "flags", ["dp_replicate", "dp_shard"], 4, "FSDP"),
    "fsdp2xtp2": (4, {"dp_replicate": 1, "dp_shard": 2, "tp": 2}, "code-plan", ["dp_shard", "tp"], 2, "FSDP"),
    "hsdp2x2xtp2": (
        8,
        {"dp_replicate": 2, "dp_shard": 2, "tp": 2},
        "flags",
        ["dp_replicate", "dp_shard", "tp"],
        4,
        "FSDP",
    ),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_a_layout_trains_to_the_weights_of_one_process(name: str, root: Path, one_process, launch_env) -> None:
    processes, sizes, given, mesh, dp, kind = LAYOUTS[name]
    out = root / name
    args = [str(out), "--precisions", "no,bf16"]
    if given == "flags":
        argv = _x_launch(processes, sizes, *args)
    else:
        layout = ",".join(str(sizes[dim]) for dim in ("dp_replicate", "dp_shard", "tp"))
        extra = {"code-plan": ["--user-plan"], "code-tied": ["--tied"]}.get(given, [])
        argv = _torchrun(processes, *args, "--layout", layout, *extra)
    _run(argv, launch_env(root))

    reference = _weights(one_process["3tied" if given == "code-tied" else "3"])
    moved = _max_diff(reference, _initial(root, launch_env, tied=given == "code-tied"))
    assert moved > 20 * TOLERANCE  # the runs trained: agreement below is not two untouched models
    assert _max_diff(_weights(out / "no"), reference) <= TOLERANCE
    report = _report(out / "no")
    assert (report["mesh"], report["dp"], report["distributed_type"]) == (mesh, dp, kind)
    assert report["eval_ids"] == list(range(13))  # gather_for_metrics: each sample once, in order
    assert report["stream_ids"] == list(range(13))  # an iterable dataset, dispatched to tp groups from rank 0
    # reduce and gather: every rank's value, as in Accelerate (tp innermost: a group's ranks are neighbours).
    assert report["counted"] == processes
    assert report["gathered"] == [rank for rank in range(dp) for _ in range(processes // dp)]
    fp32_losses = _report(one_process["3tied" if given == "code-tied" else "3"])["losses"]
    assert report["losses"] == pytest.approx(fp32_losses, abs=1e-5)

    bf16 = _report(out / "bf16")
    assert bf16["losses"] == pytest.approx(fp32_losses, abs=BF16_LOSS)
    assert bf16["losses"] != report["losses"]  # computed in bf16, not fp32 again
    assert bf16["eval_ids"] == list(range(13))


def test_resume_across_layouts_and_world_sizes_is_exact(root: Path, one_process, launch_env) -> None:
    """2 x 2 (FSDP2 x TP, sharded) -> 4 x 1 (FSDP2, sharded) -> 1 process (reads DCP parts, writes whole
    files) -> TP 2 (reads the whole files): each run one step further, the last equal to 4 steps in one."""
    env = dict(launch_env(root), FSDP_STATE_DICT_TYPE="SHARDED_STATE_DICT")
    states = root / "states"
    _run(_torchrun(4, str(root / "r1"), "--layout", "1,2,2", "--steps", "1", "--split", "--save", f"{states}/1"), env)
    assert (states / "1" / "model_sharded").is_dir() and (states / "1" / "optimizer_sharded").is_dir()
    step2 = ["--steps", "2", "--split", "--load", f"{states}/1", "--save", f"{states}/2"]
    _run(_torchrun(4, str(root / "r2"), "--layout", "1,4,1", *step2), env)
    step3 = ["--steps", "3", "--split", "--load", f"{states}/2", "--save", f"{states}/3"]
    _run([sys.executable, str(WORKER), str(root / "r3"), *step3], env)
    assert (states / "3" / "model.safetensors").is_file()  # one process writes whole tensors
    assert _max_diff(_weights(root / "r3" / "no"), _weights(one_process["3"])) <= TOLERANCE
    step4 = ["--steps", "4", "--split", "--load", f"{states}/3", "--save", f"{states}/4"]
    _run(_torchrun(2, str(root / "r4"), "--layout", "1,1,2", *step4), env)
    final = _weights(root / "r4" / "no")
    assert _max_diff(final, _weights(one_process["4"])) <= TOLERANCE
    losses = [_report(root / f"r{i}" / "no")["losses"] for i in (1, 2, 3, 4)]
    assert [loss for run in losses for loss in run] == pytest.approx(_report(one_process["4"])["losses"], abs=1e-5)

    # The tensor-parallel parts merge into one file holding the run's whole weights.
    merged = root / "merged"
    _run([X_LAUNCH, "merge-weights", str(states / "4" / "model_sharded"), str(merged)], env)
    assert _max_diff(load_file(str(merged / "model.safetensors")), final) == 0.0


def test_a_plan_naming_no_module_is_one_line(root: Path, launch_env, tmp_path: Path) -> None:
    script = tmp_path / "bad_plan.py"
    script.write_text(
        "import torch\n"
        "from x_runtime import Accelerator, ParallelismConfig, TorchTensorParallelConfig\n"
        "plan = TorchTensorParallelConfig(plan={'blocks.*.up': 'colwise'})\n"
        "accelerator = Accelerator(parallelism_config=ParallelismConfig(tp_size=2, tp_handler=plan))\n"
        "accelerator.prepare(torch.nn.Sequential(torch.nn.Linear(4, 4)))\n"
    )
    result = subprocess.run(
        [X_LAUNCH, "--cpu", "--num_processes", "2", str(script)],
        env=launch_env(root),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    line = (
        "tensor parallelism: the plan names 'blocks.*.up' but Sequential has no such module; "
        "fix the plan's module names (printed by model.named_modules())"
    )
    assert result.stderr.count(line) == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr


def test_trainer_trains_a_layout_from_its_training_arguments(root: Path, launch_env) -> None:
    """``TrainingArguments(parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2))`` with x serving
    ``accelerate``: Trainer's own loop on 4 processes ends at the weights of its loop on one."""
    env = dict(launch_env(root), X_PROVIDE_ACCELERATE="1")
    _run([sys.executable, str(TRAINER), str(root / "trainer1")], env)
    launch = [X_LAUNCH, "--provide-accelerate", "--cpu", "--num_processes", "4"]
    result = _run([*launch, str(TRAINER), str(root / "trainer4"), "--layout", "1,2,2"], env)
    assert "redistributing" not in result.stderr  # torch's warning of the 2-D gather, once per rank and save
    one, four = (load_file(str(root / name / "final.safetensors")) for name in ("trainer1", "trainer4"))
    assert _max_diff(one, four) <= TOLERANCE
    report = json.loads((root / "trainer4" / "report.json").read_text())
    assert report["tp_size"] == 2 and report["sizes"]["dp_shard_size"] == 2
    assert report["losses"] == pytest.approx(
        json.loads((root / "trainer1" / "report.json").read_text())["losses"], abs=1e-5
    )


# --- on GPUs (NCCL): written for a machine with 2 GPUs ------------------------------------------


@pytest.mark.requires_cuda(2)
@pytest.mark.parametrize(("name", "layout"), [("tp2", "1,1,2"), ("fsdp2", "1,2,1"), ("cp2", "1,1,1,2")])
def test_a_layout_on_two_gpus_trains_to_the_weights_of_one(name: str, layout: str, root: Path, launch_env) -> None:
    """NCCL layouts, and context parallelism (ring attention over SDPA, GPUs only): 2 GPUs against 1."""
    env = launch_env(root)
    one = root / "gpu1"
    if not (one / "no").exists():
        _run([sys.executable, str(WORKER), str(one)], dict(env, CUDA_VISIBLE_DEVICES="0"))
    out = root / f"gpu-{name}"
    _run(_torchrun(2, str(out), "--layout", layout), env)
    # Context parallelism splits each sequence's attention over the ranks: the same sums in another order.
    bound = 1e-3 if name == "cp2" else 5e-5
    assert _max_diff(_weights(out / "no"), _weights(one / "no")) <= bound
    report = _report(out / "no")
    assert report["eval_ids"] == list(range(13))
    assert report["losses"] == pytest.approx(_report(one / "no")["losses"], abs=1e-2 if name == "cp2" else 1e-4)
