"""Training on 1, 2 and 3 real processes (torchrun, gloo) gives the single-process result."""

from __future__ import annotations

import signal

import pytest
import torch


@pytest.fixture(scope="module")
def runs(tmp_path_factory, launch) -> dict[int, dict]:
    import json

    results = {}
    for nprocs in (1, 2, 3):
        out = tmp_path_factory.mktemp(f"train{nprocs}")
        launch("train_worker.py", nprocs, str(out))
        reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(nprocs)]
        assert all(r["world"] == nprocs for r in reports), "every rank must see the whole world"
        results[nprocs] = reports
    return results


def _close(a: list[float], b: list[float], tol: float) -> None:
    assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=tol, rtol=0), (
        f"max difference {(torch.tensor(a) - torch.tensor(b)).abs().max().item():.3g} > {tol}"
    )


def test_single_process_accelerator_equals_plain_pytorch(runs) -> None:
    weights, steps = runs[1][0]["ddp"]
    assert steps == 6
    _close(weights, runs[1][0]["plain"], 1e-7)


@pytest.mark.parametrize("nprocs", [2, 3])
@pytest.mark.parametrize("case", ["ddp", "split", "accumulate", "accumulate_split", "shuffle"])
def test_processes_train_like_one_process_on_the_full_batch(runs, nprocs, case) -> None:
    reference, ref_steps = runs[1][0][case]
    for rank, report in enumerate(runs[nprocs]):
        weights, steps = report[case]
        assert steps == ref_steps, f"rank {rank}: {steps} optimizer steps, 1 process took {ref_steps}"
        _close(weights, reference, 1e-6)


def test_accumulation_equals_one_larger_batch(runs) -> None:
    # k micro-batches of size b accumulate to the gradient of one batch of k*b.
    for nprocs, reports in runs.items():
        _close(reports[0]["accumulate"][0], reports[0]["ddp"][0], 1e-6)
        assert reports[0]["accumulate"][1] == reports[0]["ddp"][1], nprocs


def test_bf16_autocast_trains_close_to_fp32(runs) -> None:
    for reports in runs.values():
        bf16, fp32 = torch.tensor(reports[0]["bf16"][0]), torch.tensor(reports[0]["ddp"][0])
        assert not torch.equal(bf16, fp32), "bf16 autocast had no effect"
        assert (bf16 - fp32).abs().max() < 2e-2


@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_gather_for_metrics_returns_exactly_the_dataset_in_order(runs, nprocs) -> None:
    for key, (tensors, objects) in runs[nprocs][0]["metrics"].items():
        size = int(key.split("/")[0])
        assert tensors == list(range(size)), f"{key} on {nprocs} processes"
        assert objects == [f"s{i}" for i in range(size)], f"{key} on {nprocs} processes"
    for report in runs[nprocs][1:]:
        assert report["metrics"] == runs[nprocs][0]["metrics"]


def test_killed_run_resumes_to_the_same_weights_bit_for_bit(workers, launch, tmp_path) -> None:
    (full,) = [workers("resume_worker.py", 2, str(tmp_path / "full"), "full")[0]]
    assert full["steps"] == 15 and full["checkpoints"] == ["checkpoint_13", "checkpoint_14"]

    crashed = launch("resume_worker.py", 2, str(tmp_path), str(tmp_path / "cut"), "crash", "7", check=False)
    assert crashed.returncode != 0
    assert "Signals.SIGKILL" in crashed.stderr or str(signal.SIGKILL.value) in crashed.stderr

    resumed = workers("resume_worker.py", 2, str(tmp_path / "cut"), "resume")
    for rank in resumed:
        assert rank["steps"] == 15
        assert rank["weights"] == full["weights"], "resumed run diverged from the uninterrupted one"
        assert rank["lr"] == full["lr"]
