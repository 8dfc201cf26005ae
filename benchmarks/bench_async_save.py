"""The training stall of ``save_state``: synchronous against ``async_save=True``, 2 processes on CPU.

    python benchmarks/bench_async_save.py [--gb 1.2] [--repeats 3] [--dir DIR]

Launches itself under ``torch.distributed.run`` (2 processes, gloo). Each rank prepares a model
of plain linear layers with Adam (one step, so the moments exist): weights plus optimizer state
about ``--gb`` GB. It then times ``save_state`` from call to return on every rank, the stall a
training loop sees, ``--repeats`` times each way, and reports the median of the slowest rank's.
For the asynchronous saves it also times the background write (``wait_for_checkpoint``, not part
of the stall), and reports the first one alone: it allocates the host copy that later saves reuse. A save's folder is replaced by the next one, so the disk holds about two
checkpoints at most. The checkpoint goes under ``--dir`` (default: a temporary folder).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WIDTH = 4096


def _worker(gb: float, repeats: int, folder: Path, out: Path) -> None:
    import torch

    from x_runtime import Accelerator

    accelerator = Accelerator()
    layers = max(1, round(gb * 1e9 / (3 * 4 * WIDTH * (WIDTH + 1))))  # weights + Adam's two moments, fp32
    model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    for parameter in model.parameters():  # the moments, without a 2-process backward of this size
        parameter.grad = torch.full_like(parameter, 1e-3)
    optimizer.step()
    state_bytes = 3 * sum(p.numel() * p.element_size() for p in model.parameters())
    timings: dict[str, list[float]] = {"sync": [], "async": [], "background_write": []}
    for _ in range(repeats):
        for mode in ("sync", "async"):
            accelerator.wait_for_everyone()
            start = time.perf_counter()
            accelerator.save_state(folder / "ckpt", async_save=mode == "async")
            timings[mode].append(time.perf_counter() - start)
            if mode == "async":
                accelerator.wait_for_checkpoint()
                timings["background_write"].append(time.perf_counter() - start)
    rank = accelerator.process_index
    (out / f"rank{rank}.json").write_text(json.dumps({"state_bytes": state_bytes, **timings}))
    accelerator.end_training()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.2, help="weights + optimizer state, GB (default 1.2)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where the checkpoint is written")
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 0.05 GB, 2 repeats")
    args = parser.parse_args()
    if args.quick:
        args.gb, args.repeats = 0.05, 2
    if args.worker is not None:
        _worker(args.gb, args.repeats, args.dir, args.worker)
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        folder, out = Path(scratch) / "ckpt-root", Path(scratch) / "out"
        folder.mkdir()
        out.mkdir()
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__]
        command += ["--gb", str(args.gb), "--repeats", str(args.repeats), "--dir", str(folder), "--worker", str(out)]
        subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        ranks = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]
    # Per repeat, the slowest rank is the stall (the next collective waits for it); then the median.
    stall = {
        mode: statistics.median(max(r[mode][i] for r in ranks) for i in range(args.repeats))
        for mode in ("sync", "async", "background_write")
    }
    print(f"state per rank: {ranks[0]['state_bytes'] / 1e9:.2f} GB (weights + Adam), 2 processes, CPU, gloo")
    print(f"sync save_state stall:            {stall['sync']:.3f} s (median of {args.repeats})")
    print(f"async save_state stall:           {stall['async']:.3f} s")
    first = max(r["async"][0] for r in ranks)  # its copy's host memory is fresh; later saves reuse it
    print(f"  first async save (fresh memory): {first:.3f} s")
    print(f"async background write, to done:  {stall['background_write']:.3f} s")
    print(f"async / sync stall:               {stall['async'] / stall['sync']:.3f}x")


if __name__ == "__main__":
    main()
