"""A disk that fills during save_state, and checkpoint files load_state refuses: on real files.

The full disk is a real 1 MiB tmpfs (mounted as root, or through passwordless sudo; skipped with
the reason otherwise), filled with a file so that a save runs out of space at a known point.
Multi-process cases run under torchrun (``workers/checkpoint_disk_full_worker.py``).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from x_runtime import Accelerator
from x_runtime.checkpoint import DiskFullError, save_state_dict_files, save_tensors_file, torch_save
from x_runtime.io.disk_space import out_of_space_errno

KiB = 1024


def _privileged() -> list[str] | None:
    if not sys.platform.startswith("linux") or shutil.which("mount") is None:
        return None
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        return ["sudo", "-n"]
    return None


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """An empty 1 MiB tmpfs, unmounted after the test."""
    prefix = _privileged()
    if prefix is None:
        pytest.skip("a full disk needs a small tmpfs: mounting one needs Linux and root (or passwordless sudo)")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        [*prefix, "mount", "-t", "tmpfs", "-o", "size=1m,mode=1777", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for the full-disk tests: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        if subprocess.run([*prefix, "umount", str(disk)], capture_output=True).returncode != 0:
            subprocess.run([*prefix, "umount", "-l", str(disk)], check=True)


def _free(disk: Path) -> int:
    return shutil.disk_usage(disk).free


def _fill(disk: Path, leave: int) -> None:
    """Leave ``leave`` bytes free on ``disk`` (tmpfs counts whole 4 KiB pages)."""
    with open(disk / "filler", "ab") as handle:
        handle.write(b"\0" * (_free(disk) - leave))
    assert abs(_free(disk) - leave) < 4 * KiB


class Blob:
    """Registered state whose bytes are known only once written: no free-space check foresees them."""

    def __init__(self, nbytes: int = 64 * KiB) -> None:
        self.data = torch.zeros(nbytes // 4)

    def state_dict(self) -> dict:
        return {"data": self.data}

    def load_state_dict(self, state: dict) -> None:
        self.data = state["data"]


def _setup(*registered):
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)  # 16.25 KiB of weights, twice that of Adam state
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.register_for_checkpointing(*registered)
    return accelerator, model, optimizer


def _step(accelerator, model, optimizer) -> None:
    accelerator.backward(model(torch.ones(2, 64)).sum())
    optimizer.step()
    optimizer.zero_grad()


def _leftovers(disk: Path) -> list[str]:
    return sorted(p.name for p in disk.rglob("*") if "partial" in p.name)


def _amounts(message: str) -> tuple[int, int]:
    found = re.search(
        r"needs at least [\d.]+ [KMG]?i?B \((\d+) bytes\), [\d.]+ [KMG]?i?B \((\d+) bytes\) free", message
    )
    assert found, message
    return int(found.group(1)), int(found.group(2))


def test_disk_full_mid_save_is_one_line_and_keeps_the_previous_checkpoint(small_disk) -> None:
    accelerator, model, optimizer = _setup(Blob())
    _step(accelerator, model, optimizer)
    ckpt = small_disk / "ckpt"
    accelerator.save_state(ckpt)
    saved = [p.detach().clone() for p in model.parameters()]
    _step(accelerator, model, optimizer)
    # Room for the weights and Adam state (what the check can foresee), not for the 64 KiB blob too.
    _fill(small_disk, 96 * KiB)
    with pytest.raises(DiskFullError) as raised:
        accelerator.save_state(ckpt)
    error = raised.value
    message = str(error)
    assert isinstance(error, OSError) and error.errno == errno.ENOSPC
    assert "\n" not in message and error.__suppress_context__  # one line, not torch's chain
    assert message.startswith(f"no space left on device while saving the checkpoint to {ckpt} (at custom_checkpoint_0")
    assert message.endswith(
        f"free on {small_disk}; the partial save is removed, the previous checkpoint there is unchanged"
    )
    needed, free = _amounts(message)
    assert (error.needed, error.free) == (needed, free)
    assert needed > free and abs(free - _free(small_disk)) <= 4 * KiB  # what is free now, staging removed
    assert _leftovers(small_disk) == []
    assert json.loads((ckpt / "x_checkpoint.json").read_text())["custom_objects"] == 1

    fresh, model2, _ = _setup(Blob())
    fresh.load_state(ckpt)
    assert all(torch.equal(a, b) for a, b in zip(model2.parameters(), saved, strict=True))
    assert not torch.equal(model.weight, model2.weight)  # the failed save's weights never landed
    (small_disk / "filler").unlink()
    accelerator.save_state(ckpt)  # the disk freed, the same folder saves again
    fresh.load_state(ckpt)
    assert torch.equal(model2.weight, model.weight)


@pytest.mark.parametrize("previous", [True, False], ids=["over-a-checkpoint", "new-folder"])
def test_a_save_that_cannot_fit_is_refused_before_writing(small_disk, previous) -> None:
    accelerator, model, optimizer = _setup()
    ckpt = small_disk / "ckpt"
    if previous:
        accelerator.save_state(ckpt)
    saved = model.weight.detach().clone()
    _step(accelerator, model, optimizer)
    _fill(small_disk, 16 * KiB)  # the weights alone are 16.25 KiB
    before = _free(small_disk)
    with pytest.raises(DiskFullError) as raised:
        accelerator.save_state(ckpt)
    message = str(raised.value)
    tail = ", the previous checkpoint there is unchanged" if previous else ""
    assert message.startswith(f"not enough disk space to save the checkpoint to {ckpt}: it needs at least ")
    assert message.endswith(f"free on {small_disk}; nothing was written{tail}")
    needed, free = _amounts(message)
    assert needed >= 3 * 64 * 65 * 4 and free == before  # weights + two Adam moments
    assert _free(small_disk) == before and _leftovers(small_disk) == []
    if previous:
        fresh, model2, _ = _setup()
        fresh.load_state(ckpt)
        assert torch.equal(model2.weight, saved)
    else:
        assert not ckpt.exists()


def _torch_save(path: Path) -> None:
    torch_save({"w": torch.zeros(16 * KiB)}, path)


def _safetensors(path: Path) -> None:
    save_tensors_file({"w": torch.zeros(16 * KiB)}, path)


def _save_model(path: Path) -> None:
    save_state_dict_files({"w": torch.zeros(16 * KiB)}, path.parent)


@pytest.mark.parametrize("write", [_torch_save, _safetensors, _save_model], ids=["torch.save", "safetensors", "model"])
def test_every_writer_reports_a_full_disk_naming_its_file(small_disk, write) -> None:
    _fill(small_disk, 12 * KiB)
    path = small_disk / ("model.safetensors" if write is _save_model else "file.bin")
    with pytest.raises(DiskFullError) as raised:
        write(path)
    message = str(raised.value)
    assert message.startswith(f"no space left on device writing {path}: it needs at least "), message
    assert message.endswith(f"free on {small_disk}") and "\n" not in message
    assert not path.exists() and _leftovers(small_disk) == []


def test_torch_own_file_writer_short_write_counts_as_a_full_disk_only_when_it_is(small_disk, tmp_path) -> None:
    _fill(small_disk, 12 * KiB)
    with pytest.raises(RuntimeError) as raised:
        torch.save({"w": torch.zeros(16 * KiB)}, str(small_disk / "raw.bin"))  # torch's writer: no errno
    assert "unexpected pos" in str(raised.value) or "file write failed" in str(raised.value)
    assert out_of_space_errno(raised.value, small_disk) == errno.ENOSPC
    assert out_of_space_errno(raised.value, tmp_path) is None  # a disk with room: some other failure


@dataclasses.dataclass
class Settings:
    lr: float = 0.1


class Configured:
    """A registered object whose state holds a class instance: torch.save writes it, the safe loader refuses it."""

    def state_dict(self) -> dict:
        return {"settings": Settings()}

    def load_state_dict(self, state: dict) -> None:
        pass


def test_load_state_names_the_refused_file_and_why(tmp_path) -> None:
    accelerator, *_ = _setup(Configured())
    accelerator.save_state(tmp_path / "ckpt")
    fresh, *_ = _setup(Configured())
    with pytest.raises(pickle.UnpicklingError) as raised:
        fresh.load_state(tmp_path / "ckpt")
    message = str(raised.value)
    assert message.startswith(f"cannot load {tmp_path / 'ckpt' / 'custom_checkpoint_0.pkl'}: it holds a pickled ")
    assert f"{__name__}.Settings" in message and "weights_only=True" in message and "state_dict()" in message
    assert "weights_only=False" not in message and "weights_only` set to `False" not in message
    assert "\n" not in message and raised.value.__suppress_context__


def test_load_state_names_a_truncated_file(tmp_path) -> None:
    accelerator, *_ = _setup(Blob(4 * KiB))
    accelerator.save_state(tmp_path / "ckpt")
    blob = tmp_path / "ckpt" / "custom_checkpoint_0.pkl"
    blob.write_bytes(blob.read_bytes()[:100])
    fresh, *_ = _setup(Blob(4 * KiB))
    with pytest.raises(RuntimeError, match=rf"^cannot read {re.escape(str(blob))}: .*corrupt or truncated"):
        fresh.load_state(tmp_path / "ckpt")


def _disk_full(seen: dict, start: str) -> tuple[int, int]:
    """A rank's report of a DiskFullError whose message starts with ``start``: (needed, free)."""
    assert (seen["type"], seen["errno"]) == ("DiskFullError", errno.ENOSPC), seen
    assert seen["message"].startswith(start), seen
    return _amounts(seen["message"])


def test_two_processes_agree_on_a_full_disk(small_disk, tmp_path, launch) -> None:
    out = tmp_path / "out"
    out.mkdir()
    launch("checkpoint_disk_full_worker.py", 2, str(out), str(small_disk), timeout=240)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    shared = small_disk / "shared" / "ckpt"
    for report in ranks:
        rank0 = (
            f"DiskFullError: no space left on device while saving the checkpoint to {shared} (at custom_checkpoint_0"
        )
        seen = report["mid_write"]
        if seen["message"].startswith("save_state failed on ranks 0, 1: "):
            # Rank 1 wrote its RNG state after rank 0's partial file took the last bytes: the order of
            # two processes' writes is not fixed, and both ranks then name both full-disk failures.
            assert "; rank 1: DiskFullError: no space left on device" in seen["message"], seen
            needed, free = _disk_full(seen, f"save_state failed on ranks 0, 1: rank 0: {rank0}")
        else:
            needed, free = _disk_full(seen, f"save_state failed on rank 0: {rank0}")
        assert needed > free
        assert report["leftovers_mid_write"] == [] and report["free_after"] >= report["free_before"] - 4 * KiB
        assert report["load"] == {"ok": True} and report["restored"]

        needed, free = _disk_full(
            report["together"],
            f"not enough disk space to save the checkpoint to {small_disk / 'rank0' / 'ckpt'}, "
            f"{small_disk / 'rank1' / 'ckpt'} (ranks 0, 1): it needs at least ",
        )
        assert free == report["together_free"] and needed > free > needed // 2  # either rank alone would fit
        assert report["together_free_after"] == report["together_free"] and report["leftovers_together"] == []
