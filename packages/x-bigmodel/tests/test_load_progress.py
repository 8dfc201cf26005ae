"""The loading progress bar counts bytes, moves as tensors are read, and shows only on a terminal.

Each case is a real load of a real safetensors file in a child process whose stderr is a
pseudo-terminal (``os.openpty``) or a pipe; the bar's threshold is lowered in the child so that a
few MiB count as a long load.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import save_file
from tqdm import tqdm

from x_bigmodel.loading.progress import PROGRESS_MIN_BYTES, byte_progress

fcntl = pytest.importorskip("fcntl", reason="pseudo-terminals need a POSIX system")
termios = pytest.importorskip("termios", reason="pseudo-terminals need a POSIX system")

LOAD = textwrap.dedent(
    """
    import sys, torch
    from torch import nn
    import x_bigmodel.loading.progress as progress
    from x_bigmodel.loading.checkpoint import load_checkpoint_in_model

    threshold, count, width, mmap, show = sys.argv[1:6]
    if threshold != "default":
        progress.PROGRESS_MIN_BYTES = int(threshold)
    with torch.device("meta"):
        model = nn.Sequential(*(nn.Linear(int(width), int(width), bias=False) for _ in range(int(count))))
    load_checkpoint_in_model(model, sys.argv[6], mmap=mmap == "1", show_progress=show == "1")
    assert all(p.device.type == "cpu" and p.sum() == 0 for p in model.parameters())
    print("loaded")
    """
)


def checkpoint(tmp_path, count: int, width: int):
    """``count`` float32 ``width`` x ``width`` weights of zeros in one file; its tensor bytes."""
    path = tmp_path / "model.safetensors"
    save_file({f"{i}.weight": torch.zeros(width, width) for i in range(count)}, str(path))
    return path, count * width * width * 4


def run_load(path, count, width, *, terminal=True, threshold="1", mmap=True, show=True, env=None):
    """Load in a child; returns (its stderr as text, its stdout)."""
    child_env = {**os.environ, "TQDM_MININTERVAL": "0", **(env or {})}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "TQDM_DISABLE"):
        if env is None or name not in env:
            child_env.pop(name, None)
    args = [sys.executable, "-c", LOAD, threshold, str(count), str(width), str(int(mmap)), str(int(show)), str(path)]
    return run_child(args, child_env, terminal=terminal)


def run_child(args: list[str], child_env: dict[str, str], *, terminal: bool = True) -> tuple[str, str]:
    """Run ``args``; returns (its stderr as text, its stdout), stderr a pseudo-terminal when ``terminal``."""
    if not terminal:
        done = subprocess.run(args, capture_output=True, text=True, env=child_env, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stderr, done.stdout
    leader, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=follower, env=child_env)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    out = child.stdout.read().decode()
    assert child.wait(timeout=120) == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode(errors="replace"), out


def shown_counts(err: str, total: int) -> list[str]:
    """The "done/total" byte counts the bar printed, in order."""
    return re.findall(rf"([0-9.]+[kMGT]?)/{re.escape(tqdm.format_sizeof(total))} ", err)


def test_the_bar_counts_bytes_and_moves_with_each_tensor_of_one_file(tmp_path) -> None:
    path, total = checkpoint(tmp_path, count=8, width=256)  # 8 tensors of 256 KiB, one file
    err, out = run_load(path, 8, 256, mmap=False)
    assert out.strip() == "loaded"
    counts = shown_counts(err, total)
    assert counts and counts[-1] == tqdm.format_sizeof(total), err
    assert "100%" in err and "Loading weights" in err
    # One step per tensor read (not one per file): 0, then 8 distinct counts on the way to the total.
    assert len(dict.fromkeys(counts)) >= 9, counts
    assert re.search(r"B/s\]", err), err  # the rate, with the time left beside it


def test_a_mapped_load_moves_within_the_file_too(tmp_path) -> None:
    path, total = checkpoint(tmp_path, count=3, width=4096)  # 3 x 64 MiB, read in place by memory map
    err, _ = run_load(path, 3, 4096, mmap=True)
    counts = shown_counts(err, total)
    assert counts[-1] == tqdm.format_sizeof(total), err
    assert len(dict.fromkeys(counts)) >= 4, counts


def test_no_bar_when_stderr_is_not_a_terminal(tmp_path) -> None:
    path, _ = checkpoint(tmp_path, count=4, width=256)
    err, out = run_load(path, 4, 256, terminal=False)
    assert (err, out.strip()) == ("", "loaded")


@pytest.mark.parametrize(
    "how",
    ["show_progress=False", "TQDM_DISABLE=1", "rank 1", "below the threshold"],
)
def test_no_bar_when_asked_or_not_worth_it(tmp_path, how) -> None:
    path, _ = checkpoint(tmp_path, count=4, width=256)
    kwargs: dict = {}
    if how == "show_progress=False":
        kwargs["show"] = False
    elif how == "TQDM_DISABLE=1":
        kwargs["env"] = {"TQDM_DISABLE": "1"}
    elif how == "rank 1":
        kwargs["env"] = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}
    else:
        kwargs["threshold"] = "default"  # 1 MiB to read, far below 1 GiB
    err, out = run_load(path, 4, 256, **kwargs)
    assert (err, out.strip()) == ("", "loaded")


def test_the_threshold_is_where_waiting_is_felt() -> None:
    assert PROGRESS_MIN_BYTES == 2**30
    with byte_progress(PROGRESS_MIN_BYTES - 1) as advance:
        assert not advance.shown


LAZY = textwrap.dedent(
    """
    import sys, torch
    from torch import nn
    import x_bigmodel.loading.progress as progress
    from x_bigmodel.loading.checkpoint import load_planned, resolve_checkpoint_files

    progress.PROGRESS_MIN_BYTES = 1
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(512, 512, bias=False), nn.Linear(512, 512, bias=False))
    load_planned(model, resolve_checkpoint_files(sys.argv[1]), None, populate=False, dtype=torch.float16)
    print("loaded")
    """
)


@pytest.mark.parametrize("convert", [False, True])
def test_pages_left_to_first_use_are_not_counted(tmp_path, convert) -> None:
    """from_pretrained's load (``populate=False``) reads nothing for mapped tensors: no bar for them."""
    path = tmp_path / "model.safetensors"
    save_file({"0.weight": torch.zeros(512, 512), "1.weight": torch.zeros(512, 512)}, str(path))
    script = LAZY if convert else LAZY.replace("dtype=torch.float16", "dtype=None")
    env = {k: v for k, v in os.environ.items() if k not in ("TQDM_DISABLE", "RANK", "LOCAL_RANK", "SLURM_PROCID")}
    err, out = run_child([sys.executable, "-c", script, str(path)], {**env, "TQDM_MININTERVAL": "0"})
    assert out.strip() == "loaded"
    if convert:  # float16 copies are read from the file: the bar counts those bytes
        assert shown_counts(err, 2 * 512 * 512 * 4)[-1] == tqdm.format_sizeof(2 * 512 * 512 * 4), err
    else:
        assert err == ""
