"""``save_state(async_save=True)``: the write runs in the background, with a synchronous save's guarantees.

Real processes (2 ranks, gloo; ``workers/async_save_worker.py``): a run that saved asynchronously
and went on training resumes to the uninterrupted run's exact weights; the checkpoint holds the
state at the call, not the weights training changed meanwhile; a SIGKILL during the background
write leaves the previous checkpoint whole; a background failure raises on every rank at the
next call. No timings here: the stall is measured by ``benchmarks/bench_async_save.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from x_runtime import Accelerator

WORKERS = Path(__file__).parent / "workers"


def _ranks(out: Path, n: int = 2) -> list[dict]:
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(n)]


def test_async_save_resumes_to_the_uninterrupted_weights(tmp_path, launch) -> None:
    found = []
    for mode in ("full", "resume"):
        out = tmp_path / mode
        out.mkdir()
        launch("async_save_worker.py", 2, str(out), str(tmp_path / "root"), mode)
        found.append(_ranks(out))
    full, resumed = found
    for rank in range(2):
        # save_state returned before the folder existed: the write was still running as training went on.
        assert full[rank]["returned_before_written"], f"rank {rank}: save_state waited for the write"
        # What was written is the state at the call, not the weights the next steps changed.
        assert full[rank]["written_is_snapshot"] and not full[rank]["written_is_final"]
        assert resumed[rank]["final"] == full[rank]["final"], f"rank {rank}: resumed weights differ"
    assert not list((tmp_path / "root").glob(".*")), "staging or markers left behind"


def test_sigkill_during_background_write_keeps_previous_checkpoint(tmp_path) -> None:
    out, root = tmp_path / "out", tmp_path / "root"
    out.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    script = [str(WORKERS / "async_save_worker.py"), str(out), str(root), "kill"]
    # The conftest fixture already cleared launcher variables from this environment.
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(WORKERS), os.environ.get("PYTHONPATH", "")]),
    }
    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(
        [*command, *script], env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 120
        while not all((out / f"returned{rank}").exists() for rank in range(2)):
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "the worker never reached its asynchronous save"
            time.sleep(0.002)
    finally:
        for rank in range(2):  # the ranks first: torchrun starts them in sessions of their own
            if (out / f"returned{rank}").exists():
                os.kill(int((out / f"returned{rank}").read_text()), signal.SIGKILL)
        os.killpg(worker.pid, signal.SIGKILL)  # torchrun
        worker.wait()
        log.close()
    ckpt = root / "ckpt"
    assert (root / ".ckpt.partial").is_dir(), "the kill came after the write ended: the test proves nothing"
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == ["ckpt"]
    accelerator = Accelerator()
    model = torch.nn.Sequential(*(torch.nn.Linear(1536, 1536) for _ in range(4)))
    optimizer = torch.optim.Adam(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.load_state(ckpt)  # the first save, whole
    first = torch.load(out / "first.pt")
    assert all(torch.equal(first[k], v) for k, v in model.state_dict().items())
    accelerator.save_state(ckpt)  # a later save clears the killed one's staging folder
    assert not (root / ".ckpt.partial").exists()


def test_background_failure_raises_on_every_rank_at_the_next_call(tmp_path, launch) -> None:
    out = tmp_path / "out"
    out.mkdir()
    launch("async_save_worker.py", 2, str(out), str(tmp_path / "root"), "error")
    for rank, found in enumerate(_ranks(out)):
        assert found["returned"]
        assert "save_state failed on rank 0" in found.get("raised", ""), f"rank {rank}: {found}"
        assert "PicklingError" in found["raised"] or "pickle" in found["raised"], found["raised"]
        assert not found["other_exists"], f"rank {rank}: the next save ran despite the failure"
        assert found["ckpt_is_first"], f"rank {rank}: the failed save touched the previous checkpoint"
    assert not (tmp_path / "root" / ".ckpt.partial").exists()


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """An empty 1 MiB tmpfs (as test_checkpoint_disk_full's: root needed, else skipped)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if not sys.platform.startswith("linux") or os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a full disk needs a small tmpfs: mounting one needs Linux and root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=1777", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def test_disk_full_in_background_write_raises_on_every_rank(small_disk, tmp_path, launch) -> None:
    out = tmp_path / "out"
    out.mkdir()
    launch("async_save_worker.py", 2, str(out), str(small_disk), "disk_full")
    for rank, found in enumerate(_ranks(out)):
        assert found["returned"], f"rank {rank}: the free-space check refused what fits"
        raised = found.get("raised", {})
        # Rank 0 fills the disk; rank 1, writing beside it, may too. Never an error of a folder
        # removed under a rank still writing into it.
        message = raised.get("message", "")
        assert "save_state failed on rank" in message and "rank 0: DiskFullError" in message, f"rank {rank}: {found}"
        assert "FileNotFoundError" not in message, message
        assert found["ckpt_is_first"], f"rank {rank}: the previous checkpoint did not load back"
        assert found["leftovers"] == [], f"rank {rank}: {found['leftovers']}"


def test_wait_for_checkpoint_without_pending_save_returns_none(tmp_path) -> None:
    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(3, 2))
    assert accelerator.wait_for_checkpoint() is None
    before = model.weight.detach().clone()
    accelerator.save_state(tmp_path / "c", async_save=True)
    with torch.no_grad():
        model.weight.add_(1)  # after save_state returned: not in the checkpoint
    assert accelerator.wait_for_checkpoint() == str(tmp_path / "c")
    accelerator.load_state(tmp_path / "c")
    assert torch.equal(model.weight, before)
