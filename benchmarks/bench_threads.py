"""CPU threads per process: what x-launch's default gives a training step, against plain python and Accelerate.

    nox -s bench            # or: python benchmarks/bench_threads.py [--repeat 3] [--quick]

x-launch sets OMP_NUM_THREADS for each process (``--num_cpu_threads_per_process``; unset: physical
cores / processes on this machine, unless OMP_NUM_THREADS is already set). Two rows, each timing
training steps of a 1.6M-parameter MLP (plain PyTorch: the launcher is the only variable):

- 1 process: ``x-launch --cpu mlp_steps.py`` vs ``python mlp_steps.py`` with OMP_NUM_THREADS equal
  to what x-launch chose (threads equal: the launcher itself must cost nothing per step);
- 2 processes: x-launch's default threads vs ``accelerate launch --multi_gpu --num_processes 2``
  with Accelerate's default (it sets OMP_NUM_THREADS=1 unless ``--cpu``; on a CPU-only machine
  ``--multi_gpu`` is what starts 2 processes, see bench_launch.py).

Each rank reports torch's thread count and its median step time after a warm-up; a row's figure is
the slowest rank's. Runs alternate (A B A B ...), the ratio is the median of per-repetition ratios.
Timings are reported, never asserted; OMP_NUM_THREADS and x's and Accelerate's variables are
removed from the environment first, so each launcher's default is what is measured. --quick, a
smoke, runs each command once with 10 steps (the run that learns x-launch's threads is the first
row's x-launch): 21-32 s on 2 cores at load average 1-3.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = Path(__file__).parent / "threads_workers" / "mlp_steps.py"
TARGET_SAME_THREADS = 1.02  # x-launch / plain python, threads equal


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _clean_env(home: str) -> dict[str, str]:
    drop = ("X_", "ACCELERATE_", "OMP_NUM_THREADS", "RANK", "WORLD_SIZE", "MASTER_", "LOCAL_")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    environ.update(HOME=home, XDG_CONFIG_HOME=home, XDG_CACHE_HOME=home, HF_HOME=home)
    return environ


def _run(argv: list[str], environ: dict[str, str], out: Path, processes: int) -> dict:
    out.unlink(missing_ok=True)
    done = subprocess.run(argv, env={**environ, "BENCH_THREADS_OUT": str(out)}, capture_output=True, text=True)
    reports = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if done.returncode != 0 or len(reports) != processes:
        raise SystemExit(f"{' '.join(argv)}: exit {done.returncode}, {len(reports)} reports\n{done.stderr[-2000:]}")
    return {"step": max(r["step"] for r in reports), "threads": sorted({r["threads"] for r in reports})}


def _script(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        raise SystemExit(f"{name} is not installed next to {sys.executable}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 repetition of short runs")
    args, _ = parser.parse_known_args()  # nox -s bench passes every benchmark the same arguments
    repeat, steps = (1, "10") if args.quick else (args.repeat, "40")
    x_launch = _script("x-launch")
    with tempfile.TemporaryDirectory() as home:
        environ = _clean_env(home)
        out = Path(home) / "steps.jsonl"
        single = [x_launch, "--cpu", str(WORKER), steps]
        probe = _run(single, environ, out, 1)
        chosen = probe["threads"][0]
        # --quick runs each command once, and the probe already ran the first row's x-launch.
        spare = {tuple(single): probe} if args.quick else {}
        rows: dict[str, list[tuple[str, list[str], dict[str, str], int]]] = {
            "1 process, threads equal": [
                ("x-launch", single, environ, 1),
                ("python", [sys.executable, str(WORKER), steps], {**environ, "OMP_NUM_THREADS": str(chosen)}, 1),
            ],
        }
        accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent))
        two = [("x-launch", [x_launch, "--cpu", "--num_processes", "2", str(WORKER), steps], environ, 2)]
        if accelerate is not None:
            acc = [accelerate, "launch", "--multi_gpu", "--num_processes", "2"]
            two.append(("accelerate launch", [*acc, "--main_process_port", "{port}", str(WORKER), steps], environ, 2))
        rows["2 processes, each launcher's default threads"] = two
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} logical cores; medians of {repeat}; slowest rank")
        for title, variants in rows.items():
            results: dict[str, list[dict]] = {name: [] for name, *_ in variants}
            for _ in range(repeat):
                for name, argv, env, processes in variants:
                    argv = [part.replace("{port}", str(_free_port())) for part in argv]
                    results[name].append(spare.pop(tuple(argv), None) or _run(argv, env, out, processes))
            base = variants[-1][0]
            print(f"\n{title}")
            for name, *_ in variants:
                step = statistics.median(r["step"] for r in results[name])
                ratio = statistics.median(
                    a["step"] / b["step"] for a, b in zip(results[name], results[base], strict=True)
                )
                threads = results[name][0]["threads"]
                mark = (
                    f" (target <= {TARGET_SAME_THREADS})"
                    if title.startswith("1 process") and name == "x-launch"
                    else ""
                )
                print(f"  {name:<18} {step * 1e3:7.2f} ms/step  threads {threads}  ratio to {base} {ratio:.3f}{mark}")
    if accelerate is None:
        print("\naccelerate is not installed: its row is left out (nox -s bench installs it)")


if __name__ == "__main__":
    main()
