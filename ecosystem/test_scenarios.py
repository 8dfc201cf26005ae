"""Each scenario under the real Accelerate and under x serving it: the same losses, weights, files and maps.

The accelerate side is the script started plainly (``python``, ``torchrun``) with the real
package; the x side is the same script with ``X_PROVIDE_ACCELERATE=1`` (``python``, ``torchrun``)
and under ``x-launch --provide-accelerate``. Results are compared whole and exactly: CPU runs are
deterministic, so equal means bit for bit (weights by digest). The FSDP cases are the exception
(``close``): there x shards where Accelerate on CPU does not, and the numbers agree to a tolerance.

    python -m pytest ecosystem/test_scenarios.py --results DIR                # both sides
    pip uninstall -y accelerate
    python -m pytest ecosystem/test_scenarios.py --results DIR --sides x      # x alone, against DIR
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).with_name("scenarios.py")
TIMEOUT = 600


@dataclass(frozen=True)
class Case:
    name: str
    scenario: str
    processes: int = 1
    env: dict[str, str] = field(default_factory=dict)
    compared: tuple[str, ...] | None = None  # the result's keys both sides share (None: all of it)
    x_launchers: tuple[str, ...] = ("torchrun", "x-launch")
    close: bool = False  # the two sides run different algorithms: losses and weights agree to a tolerance

    def launchers(self, side: str) -> tuple[str, ...]:
        if side == "accelerate":
            return ("python",) if self.processes == 1 else ("torchrun",)
        return ("python",) if self.processes == 1 else self.x_launchers

    def part(self, result: dict[str, Any]) -> dict[str, Any]:
        keys = self.compared if self.compared is not None else tuple(result)
        return {key: result[key] for key in keys if key in result}


# The GPU's cases (nox -s tests_gpu): CUDA kernels may sum in another order from run to run (atomics in
# backward), so losses are compared to 1e-5 there and weights not at all; the files and maps exactly.
GPU_COMPARED = ("accelerate", "checkpoint_files", "steps", "strategy", "saved_files")
_TRAINED = ("accelerate", "losses", "eval_losses", "weights", "steps")  # compared exactly
# On CPU, Accelerate 1.15 runs an FSDP plugin as plain data parallelism (MULTI_CPU: nothing sharded)
# while x shards with FSDP2 over gloo, and AdamW then updates each rank's shard where Accelerate updates
# whole tensors: elementwise kernels split a tensor into vector lanes and a remainder that may round
# differently (a fused multiply-add or not), and where the split falls depends on the CPU. So losses
# and weights agree to a tolerance there (equal bit for bit on this machine's CPU; the same kind of
# drift reached 1.1e-5 on another, integration-tests/test_strategies_launch.py), the checkpoint files
# are FSDP's on x.
_SHARDED_ON_X = ("accelerate", "steps")
# A tenth of the most one AdamW step moves a weight (Trainer's learning rate, 5e-5): rounding drifts by
# ulps of the weights (under 1e-7 here), a step taken differently shows at once.
WEIGHT_TOLERANCE = 5e-6


GPU_CASES = (
    Case("gpu-trainer-bf16", "trainer", env={"DEVICE": "cuda", "BF16": "1"}, compared=GPU_COMPARED),
    Case("gpu-trainer-fp16", "trainer", env={"DEVICE": "cuda", "FP16": "1"}, compared=GPU_COMPARED),
    Case("gpu-sft-lora", "sft_lora", env={"DEVICE": "cuda", "BF16": "1"}, compared=GPU_COMPARED),
    Case("gpu-device-maps", "device_maps", env={"DEVICE": "cuda"}),
)
GPU2_CASES = (
    Case("gpu-trainer-2-gpus", "trainer", processes=2, env={"DEVICE": "cuda", "BF16": "1"}, compared=GPU_COMPARED),
    Case(
        "gpu-trainer-fsdp2",
        "trainer",
        processes=2,
        env={"DEVICE": "cuda", "BF16": "1", "FSDP": "1"},
        compared=GPU_COMPARED,
    ),
    Case(
        "gpu-deepspeed-zero3",
        "trainer",
        processes=2,
        env={"DEVICE": "cuda", "BF16": "1", "DEEPSPEED": "3"},
        compared=GPU_COMPARED,
    ),
)

CASES = (
    Case("trainer", "trainer"),
    Case("trainer-2-processes", "trainer", processes=2, x_launchers=("torchrun",)),
    Case(
        "trainer-2-processes-bf16-accumulate",
        "trainer",
        processes=2,
        env={"BF16": "1", "GA": "2"},
        x_launchers=("x-launch",),
    ),
    Case(
        "trainer-fsdp2-2-processes",
        "trainer",
        processes=2,
        env={"FSDP": "1"},
        compared=_SHARDED_ON_X,
        x_launchers=("torchrun",),
        close=True,
    ),
    Case(
        "trainer-fsdp2-sharded-checkpoints",
        "trainer",
        processes=2,
        env={"FSDP": "1", "FSDP_SHARDED": "1"},
        compared=_SHARDED_ON_X,
        x_launchers=("x-launch",),
        close=True,
    ),
    Case(
        "trainer-deepspeed-zero2",
        "trainer",
        processes=2,
        env={"DEEPSPEED": "2", "DS_ACCELERATOR": "cpu"},
        x_launchers=("x-launch",),
    ),
    Case(
        "trainer-deepspeed-zero3-config-optimizer",
        "trainer",
        processes=2,
        env={"DEEPSPEED": "3", "DEEPSPEED_OPTIMIZER": "1", "DS_ACCELERATOR": "cpu"},
        x_launchers=("torchrun",),
    ),
    Case(
        "trainer-deepspeed-zero3-loaded-partitioned",
        "trainer",
        processes=2,
        env={"DEEPSPEED": "3", "LOAD_AFTER_ARGS": "1", "DS_ACCELERATOR": "cpu"},
        x_launchers=("torchrun",),
    ),
    Case("sft", "sft"),
    Case("sft-lora", "sft_lora"),
    Case("dpo", "dpo"),
    Case(
        "dpo-deepspeed-zero3",
        "dpo",
        processes=2,
        env={"DEEPSPEED": "3", "DS_ACCELERATOR": "cpu"},
        x_launchers=("torchrun",),
    ),
    Case("device-maps", "device_maps"),
)


def _case(name: str) -> Case:
    return next(case for case in CASES if case.name == name)


def _environment(case: Case, side: str, launcher: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("X_", "ACCELERATE_", "RANK", "WORLD_SIZE"))}
    environ.update(case.env)
    environ.update(
        {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    )
    if side == "x" and launcher != "x-launch":
        environ["X_PROVIDE_ACCELERATE"] = "1"
    return environ


def _command(case: Case, side: str, launcher: str, out: Path, resume: Path | None) -> list[str]:
    script = [str(SCRIPT), case.scenario, str(out), *(["--resume", str(resume)] if resume else [])]
    if launcher == "python":
        return [sys.executable, *script]
    if launcher == "x-launch":
        x_launch = shutil.which("x-launch", path=str(Path(sys.executable).parent)) or "x-launch"
        return [x_launch, "--num_processes", str(case.processes), "--cpu", "--provide-accelerate", *script]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={case.processes}",
        *script,
    ]


_DONE: dict[Path, dict[str, Any]] = {}


def run(
    case: Case, side: str, launcher: str, results: Path, *, resume: Path | None = None, tag: str = ""
) -> dict[str, Any]:
    """The scenario's result on one side (run once per session; the accelerate side is read back when not run here)."""
    out = results / case.name / f"{side}-{launcher}{tag}"
    if out in _DONE:
        return _DONE[out]
    if side == "accelerate" and "accelerate" not in _sides:
        found = out / "result.json"
        if not found.is_file():
            pytest.fail(f"no accelerate result at {found}: run this suite with --sides accelerate,x first")
        return json.loads(found.read_text())
    shutil.rmtree(out, ignore_errors=True)
    started = time.monotonic()
    done = subprocess.run(
        _command(case, side, launcher, out, resume),
        capture_output=True,
        text=True,
        env=_environment(case, side, launcher),
        timeout=TIMEOUT,
    )
    if side == "accelerate" and done.returncode != 0 and _aborted_after_its_work(done, out):
        # torch's gloo exit race (x-runtime's process/topology/exit_settle.py): Accelerate's rank
        # finished and wrote its result, then died in interpreter finalization. The x side gets no pass.
        print(f"{case.name} accelerate {launcher}{tag}: a rank aborted at exit after its work (gloo exit race)")
    elif done.returncode != 0 or not (out / "result.json").is_file():
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
        pytest.fail(f"{case.name} on {side} ({launcher}) exited {done.returncode}:\n{tail}")
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    print(f"{case.name} {side} {launcher}{tag}: {time.monotonic() - started:.1f} s")
    _DONE[out] = result
    return result


def _aborted_after_its_work(done: subprocess.CompletedProcess[str], out: Path) -> bool:
    """Whether a run wrote its result and then lost a rank to SIGABRT in interpreter finalization."""
    return (out / "result.json").is_file() and "terminate called without an active exception" in done.stderr


_sides: tuple[str, ...] = ("accelerate", "x")


@pytest.fixture(autouse=True)
def _chosen_sides(sides: tuple[str, ...]) -> None:
    global _sides
    _sides = sides


def _same(expected: dict[str, Any], got: dict[str, Any], what: str) -> None:
    assert expected.pop("accelerate") == "module", f"{what}: the accelerate side did not import the real package"
    assert got.pop("accelerate") == "ServedModule", f"{what}: the x side did not import accelerate from x"
    assert got == expected, f"{what} differs from Accelerate's"


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_x_gives_accelerates_results(case: Case, results: Path) -> None:
    jobs = [("accelerate", case.launchers("accelerate")[0]), *(("x", launcher) for launcher in case.launchers("x"))]
    # One-process runs take one core each (OMP_NUM_THREADS=1): the two sides run at once on two cores.
    with ThreadPoolExecutor(max_workers=2 if case.processes == 1 else 1) as pool:
        found = list(pool.map(lambda job: run(case, job[0], job[1], results), jobs))
    expected = found[0]
    for (_side, launcher), got in zip(jobs[1:], found[1:], strict=True):
        _same(case.part(expected), case.part(got), f"{case.name} under {launcher}")
        if case.close:
            _losses_close(case, expected, got)
            _weights_close(case, results, launcher)


@pytest.mark.parametrize("case", [CASES[0], _case("trainer-deepspeed-zero2")], ids=lambda case: case.name)
def test_a_checkpoint_resumes_exactly_across_the_two(case: Case, results: Path) -> None:
    """A Trainer checkpoint written under Accelerate resumes under x to Accelerate's uninterrupted run, and back."""
    for writer, reader in (("accelerate", "x"), ("x", "accelerate")):
        if reader not in _sides:
            continue
        uninterrupted = run(case, "accelerate", case.launchers("accelerate")[0], results)
        writer_launcher, reader_launcher = case.launchers(writer)[0], case.launchers(reader)[0]
        run(case, writer, writer_launcher, results)  # its checkpoint-8 is the one resumed
        checkpoint = results / case.name / f"{writer}-{writer_launcher}" / "checkpoint-8"
        resumed = run(case, reader, reader_launcher, results, resume=checkpoint, tag=f"-resumes-{writer}")
        expected, got = dict(uninterrupted), dict(resumed)
        for key in ("accelerate", "checkpoint_files"):  # the resumed run writes checkpoint-16 only
            expected.pop(key), got.pop(key)
        assert got == expected, f"{reader} resuming {writer}'s checkpoint-8 differs from the uninterrupted run"


@pytest.mark.parametrize("case", [c for c in CASES if c.env.get("FSDP")], ids=lambda case: case.name)
def test_an_fsdp_checkpoint_resumes_exactly(case: Case, results: Path) -> None:
    """x's FSDP2 checkpoint of a Trainer run (Accelerate's file layout, full or sharded) resumes to the same end."""
    launcher = case.x_launchers[0]
    uninterrupted = run(case, "x", launcher, results)
    checkpoint = results / case.name / f"x-{launcher}" / "checkpoint-8"
    names = sorted(p.name for p in checkpoint.iterdir())
    assert ("pytorch_model_fsdp_0" in names and "optimizer_0" in names) or "pytorch_model_fsdp.bin" in names, names
    resumed = run(case, "x", launcher, results, resume=checkpoint, tag="-resumed")
    assert {k: resumed[k] for k in _TRAINED} == {k: uninterrupted[k] for k in _TRAINED}


def _losses_close(case: Case, expected: dict[str, Any], got: dict[str, Any]) -> None:
    for key in ("losses", "eval_losses"):
        assert len(expected.get(key, [])) == len(got.get(key, [])), f"{case.name}: {key} {got} vs {expected}"
        for theirs, ours in zip(expected.get(key, []), got.get(key, []), strict=True):
            assert abs(theirs - ours) <= 1e-5 * max(1.0, abs(theirs)), f"{case.name}: {key} {ours} vs {theirs}"


def _weights_close(case: Case, results: Path, launcher: str) -> None:
    from safetensors.torch import load_file

    theirs = load_file(results / case.name / f"accelerate-{case.launchers('accelerate')[0]}" / "weights.safetensors")
    ours = load_file(results / case.name / f"x-{launcher}" / "weights.safetensors")
    assert sorted(ours) == sorted(theirs), f"{case.name}: the final weights' names differ"
    worst = max(float((ours[name] - theirs[name]).abs().max()) for name in theirs)
    assert worst <= WEIGHT_TOLERANCE, f"{case.name} under {launcher}: a final weight differs by {worst:.3g}"


def _close(case: Case, results: Path) -> None:
    expected = run(case, "accelerate", case.launchers("accelerate")[0], results)
    for launcher in case.launchers("x"):
        got = run(case, "x", launcher, results)
        _same(case.part(expected), case.part(got), f"{case.name} under {launcher}")
        _losses_close(case, expected, got)


@pytest.mark.requires_cuda(1)
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda case: case.name)
def test_on_a_gpu_x_gives_accelerates_results(case: Case, results: Path) -> None:
    _close(case, results)


@pytest.mark.requires_cuda(2)
@pytest.mark.parametrize("case", GPU2_CASES, ids=lambda case: case.name)
def test_on_two_gpus_x_gives_accelerates_results(case: Case, results: Path) -> None:
    _close(case, results)
