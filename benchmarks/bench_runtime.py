"""Cost of x-runtime's `Accelerator` vs plain PyTorch vs Accelerate on CPU, measured side by side in one run.

    nox -s bench            # or: python benchmarks/bench_runtime.py [--repeat 3] [--rounds 10] [--setups 8] [--quick]
    python benchmarks/bench_runtime.py --device cuda [--quick]    # the same rows on 1 or 2 GPUs

What a user pays for the convenience of `Accelerator`, beyond the PyTorch code it replaces:

- train step: zero_grad, forward, loss, backward (`accelerator.backward` for the libraries), optimizer
  step, on pre-made batches so data loading is excluded. A micro model (289 parameters), where a
  step is all fixed per-step overhead, and a small MLP (1.6M parameters, batch 32, AdamW), where it
  is arithmetic; plain PyTorch wraps the model in DDP by hand on 2 processes.
- DataLoader: epochs of a prepared loader (map-style TensorDataset, 20k samples, batch 64,
  shuffled, no workers) in samples/s per rank; plain is a DataLoader (with a DistributedSampler
  on 2 processes).
- setup (2 processes): `Accelerator(cpu=True)` + `prepare(model, optimizer, loader)` vs DDP and a
  DistributedSampler loader by hand. The gloo process group exists beforehand in all three, since
  its rendezvous only measures when the other rank started (see runtime_workers/worker.py).
- gather (2 processes): `gather_for_metrics` of a (64, 10) float tensor vs one raw
  `all_gather_into_tensor`. x checks shapes on every call (every rank raises the same error on
  mismatched shapes instead of hanging); after the first gather the shape header travels in the
  same collective as the data, so what is left is the packing around one call.
- import: in a fresh interpreter, the CPU time of `import torch`, then of `import x_runtime` (or
  `import accelerate`) after it; the ratio is (torch + library) / torch within that one process.
  A whole interpreter's CPU time for the same `python -c "import torch"` moves by 20% and more
  between runs here (1.34-1.95 s in one series), which no affordable number of samples narrows to
  the 5% the target leaves; the two parts of one process share its start, its files and its
  moment. `-X importtime` then names what x_runtime loads beyond torch. x's packages are compiled
  to bytecode first (`compileall`, which skips what is up to date), as pip does when it installs
  a wheel: torch and Accelerate come from wheels with their bytecode, while an editable install
  under PYTHONDONTWRITEBYTECODE would compile x's sources on every import (about 120 ms here,
  which is not what an installed x costs).

How, given a small machine that other work shares: every variant runs in its own fresh processes
(runtime_workers/worker.py; for 2 processes `torch.distributed.run --standalone --nproc_per_node 2`
with gloo; OMP_NUM_THREADS=1), so none inherits another's warm state. The variants' jobs are
started together and kept alive; after an untimed warm-up this script has them time one block each
(300 micro steps, 20 MLP steps, 400 gathers, or 3 epochs), round-robin with the order rotated
every round, for --rounds rounds, while the others wait idle on a socket. Load drift thus hits the
three alike within a fraction of a second, and each round is a fair comparison. All of it is done
--repeat times with fresh processes. Two effects that no number of rounds averages out are handled
apart: identical models built one after another in one process train at steadily different
speeds (4 copies of one plain DDP model on 2 processes: up to 25% apart, round after round, and in
another order the next time), so a training block steps 4 copies of its model in turn; and setup,
a one-off per process, gets one sample per set of fresh processes, so --setups sets are started
for it (the repeats count among them). Imports: 4 x --repeat rounds per library, after one
untimed run that warms the file cache.

With --device cuda the same tasks run on GPUs: 1 process on GPU 0 (and its setup: the model moved
to the GPU by hand vs `Accelerator()` + `prepare`), and with 2 GPUs 2 processes over NCCL, one GPU
each; pre-made batches live on the GPU, plain moves each loader batch there by hand as the prepared
loaders do, and every timed block ends with `torch.cuda.synchronize`. A device lent for a few
minutes fits `--device cuda --repeat 1 --rounds 3 --setups 2`.

Reported: the median of all blocks per variant, and for the ratios the median of per-round ratios
(so x/plain need not equal the quotient of the two medians shown). Ratios of time rows: lower is
better; of samples/s rows: higher is better. Each row says whether x meets its target; timings are
reported, never asserted.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from runtime_workers.import_cost import imported_beyond_torch, measure_imports

WORKER = Path(__file__).parent / "runtime_workers" / "worker.py"

# Targets for x/plain (time rows: at most; samples/s rows: at least), as the overhead issue sets them.
# What Accelerate measured when they were set: micro step 1.60-1.88x (1 process) and 1.24-1.50x
# (2), 1.6M MLP 0.97-1.10x, DataLoader 0.97x (1 process) and 0.85-0.88x (2), setup 1.04-1.39x,
# gather_for_metrics 1.22-2.03x, import 1.07x `import torch`.
TARGET_MICRO_STEP = 1.02  # fixed per-step overhead shows here
TARGET_SMALL_STEP = 1.01  # a real model hides most overhead
TARGET_LOADER = 0.99
TARGET_SETUP = 1.05  # DDP wrapping and a sampler are the floor
TARGET_GATHER = 1.10  # one collective: the shape header rides with the data (x_runtime.process.collectives.gathering)
TARGET_IMPORT = 1.05

VARIANTS = ("plain", "accelerate", "x")
TASKS = {1: ("micro", "small", "loader"), 2: ("micro", "small", "loader", "gather")}
CONNECT_TIMEOUT_S = 600  # startup of three jobs on a busy machine
REPLY_TIMEOUT_S = 600  # one block or one warm-up


@dataclass(frozen=True)
class Row:
    label: str
    task: str  # worker task, or "setup" / "import"
    world: int
    unit: str
    scale: float  # worker value (seconds or samples/s) times scale = shown value
    target: float
    higher_is_better: bool = False


ROWS = (
    Row("train step, micro model, 1 proc", "micro", 1, "us", 1e6, TARGET_MICRO_STEP),
    Row("train step, micro model, 2 procs", "micro", 2, "us", 1e6, TARGET_MICRO_STEP),
    Row("train step, 1.6M MLP, 1 proc", "small", 1, "ms", 1e3, TARGET_SMALL_STEP),
    Row("train step, 1.6M MLP, 2 procs", "small", 2, "ms", 1e3, TARGET_SMALL_STEP),
    Row("DataLoader epoch, 1 proc", "loader", 1, "k samples/s", 1e-3, TARGET_LOADER, True),
    Row("DataLoader epoch, 2 procs, per rank", "loader", 2, "k samples/s", 1e-3, TARGET_LOADER, True),
    Row("setup: Accelerator()+prepare vs by hand, 1 proc", "setup", 1, "ms", 1e3, TARGET_SETUP),  # GPUs only
    Row("setup: Accelerator()+prepare vs DDP, 2 procs", "setup", 2, "ms", 1e3, TARGET_SETUP),
    Row("gather_for_metrics (64,10), 2 procs", "gather", 2, "us", 1e6, TARGET_GATHER),
    Row("import, CPU time (plain: torch)", "import", 1, "ms", 1e3, TARGET_IMPORT),
)

# rounds[(task, world)]: one dict per round, variant -> value
Rounds = dict[tuple[str, int], list[dict[str, float]]]


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def worker_env(token: str = "") -> dict[str, str]:
    # One thread per process: 2 processes on 2 cores, and thread pools would only add noise.
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "BENCH_RUNTIME_TOKEN": token}


def rotated(items: list[str], by: int) -> list[str]:
    by %= len(items)
    return items[by:] + items[:by]


LIVE: list[Jobs] = []  # started and not yet closed: a failure stops them all


class Jobs:
    """One job per variant at one world size, started together, driven over local sockets."""

    def __init__(self, variants: list[str], world: int, options: list[str], folder: str) -> None:
        self.variants = variants
        self.world = world
        self.token = secrets.token_hex(16)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(1.0)
        port = self.server.getsockname()[1]
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, IO[str]] = {}
        for variant in variants:
            argv = [str(WORKER), variant, str(port), *options]
            if world > 1:
                argv = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}", *argv]
            log = open(Path(folder) / f"{variant}-{world}.log", "w+")  # noqa: SIM115 (closed in close())
            self.logs[variant] = log
            self.procs[variant] = subprocess.Popen(
                [sys.executable, *argv], stdout=log, stderr=subprocess.STDOUT, env=worker_env(self.token)
            )
        self.channels: dict[tuple[str, int], IO[str]] = {}
        LIVE.append(self)

    def connect(self) -> None:
        """Wait until every rank of every variant has connected (they start meanwhile)."""
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while len(self.channels) < len(self.variants) * self.world:
            if time.monotonic() > deadline:
                self.fail("did not connect in time")
            for variant, proc in self.procs.items():
                if proc.poll() is not None:
                    self.fail(f"{variant} exited {proc.returncode} before connecting", variant)
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            conn.settimeout(REPLY_TIMEOUT_S)
            channel = conn.makefile("rw")
            hello = json.loads(channel.readline() or "{}")
            if hello.get("token") != self.token:
                conn.close()  # not one of ours
                continue
            self.channels[(hello["variant"], int(hello["rank"]))] = channel

    def ask(self, variant: str, command: dict[str, Any]) -> Any:
        """Send ``command`` to every rank of ``variant``; wait for all; rank 0's answer."""
        ranks = range(self.world)
        for rank in ranks:
            self.channels[(variant, rank)].write(json.dumps(command) + "\n")
            self.channels[(variant, rank)].flush()
        replies = []
        for rank in ranks:
            try:
                line = self.channels[(variant, rank)].readline()
            except TimeoutError:
                line = ""
            if not line:
                self.fail(f"{variant} rank {rank} gave no answer to {command}", variant)
            replies.append(json.loads(line))
        return replies[0]

    def fail(self, why: str, variant: str | None = None) -> None:
        logs = []
        for name in [variant] if variant else self.variants:
            self.logs[name].flush()
            self.logs[name].seek(0)
            logs.append(f"--- {name} ---\n{self.logs[name].read()[-4000:]}")
        for jobs in list(LIVE):
            jobs.close(kill=True)
        sys.exit(f"{self.world}-process workers: {why}\n" + "\n".join(logs))

    def close(self, kill: bool = False) -> None:
        if not kill:
            for variant in self.variants:
                threads = self.ask(variant, {"task": "quit"})["threads"]
                if threads != 1:
                    print(f"warning: {variant} ran on {threads} torch threads, not 1")
        for channel in self.channels.values():
            channel.close()
        self.server.close()
        for proc in self.procs.values():
            if kill and proc.poll() is None:
                proc.terminate()  # torchrun passes SIGTERM on to its workers; SIGKILL would orphan them
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        LIVE.remove(self)
        for log in self.logs.values():
            log.close()


def measure_setups(
    variants: list[str], count: int, options: list[str], gpus: int, folder: str, results: Rounds
) -> None:
    """``count`` more setup samples in jobs started for nothing else (setup is a one-off per process)."""
    worlds = (1, 2) if gpus > 1 else (1,) if gpus else (2,)
    if count:
        print(f"setup: {count} more sets of fresh processes ", end="", flush=True)
    start = time.perf_counter()
    for rep in range(count):
        sets = {world: Jobs(variants, world, options, folder) for world in worlds}
        for world, jobs in sets.items():
            jobs.connect()
            results.setdefault(("setup", world), []).append(
                {v: jobs.ask(v, {"task": "setup"}) for v in rotated(variants, rep + 1)}
            )
            jobs.close()
    if count:
        print(f"in {time.perf_counter() - start:.0f} s", flush=True)


def measure_workers(
    variants: list[str], repeat: int, rounds: int, options: list[str], gpus: int = 0, setups: int = 0
) -> Rounds:
    """Every task's rounds; ``gpus``: on that many GPUs (1: one process), else on CPU (1 and 2 processes);
    the setup rows get ``setups`` samples (at least one per repeat)."""
    worlds = (1, 2) if gpus != 1 else (1,)
    results: Rounds = {}
    with tempfile.TemporaryDirectory() as folder:
        measure_setups(variants, max(0, setups - repeat), options, gpus, folder, results)
        for rep in range(repeat):
            print(f"repeat {rep + 1}/{repeat}: ", end="", flush=True)
            start = time.perf_counter()
            # Both sets start together: startup is not timed, and idle workers wait without using the CPU.
            sets = {world: Jobs(variants, world, options, folder) for world in worlds}
            for jobs in sets.values():
                jobs.connect()
            print(f"workers started in {time.perf_counter() - start:.0f} s", end="", flush=True)
            for world, jobs in sets.items():
                start = time.perf_counter()
                if world > 1 or gpus:  # on CPU a 1-process setup is the import and nothing else
                    results.setdefault(("setup", world), []).append(
                        {v: jobs.ask(v, {"task": "setup"}) for v in rotated(variants, rep)}
                    )
                for task in TASKS[world]:
                    for variant in variants:
                        jobs.ask(variant, {"task": task, "warmup": True})
                    for r in range(rounds):
                        order = rotated(variants, r)
                        results.setdefault((task, world), []).append({v: jobs.ask(v, {"task": task}) for v in order})
                jobs.close()
                print(f", {world} process(es) measured in {time.perf_counter() - start:.0f} s", end="", flush=True)
            print(flush=True)
    return results


def load_average(when: str) -> str:
    # Other work on the machine moves every figure: the table is read with this beside it.
    return f"load average {when}: " + " ".join(f"{value:.2f}" for value in os.getloadavg())


def fmt(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.3g}" if value < 1000 else f"{value:.0f}"


def paired_ratio(rounds: list[dict[str, float]], top: str, bottom: str) -> float | None:
    ratios = [r[top] / r[bottom] for r in rounds if top in r and bottom in r]
    return statistics.median(ratios) if ratios else None


def print_table(results: Rounds, repeat: int, rounds: int, setups: int, imports: int) -> None:
    print(
        f"\nmedians over {repeat} repeat(s) of fresh processes, {rounds} interleaved round(s) each "
        f"(setup: one sample in each of {setups} set(s) of fresh processes; import: {imports} per library); "
        "ratios: median of per-round ratios"
    )
    print("| measure | plain | accelerate | x | x/plain | accelerate/plain | x/accelerate | target | verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in ROWS:
        data = results.get((row.task, row.world), [])
        if not data:
            continue
        shown = {}
        for variant in VARIANTS:
            values = [r[variant] for r in data if variant in r]
            shown[variant] = statistics.median(values) * row.scale if values else None
        x_plain = paired_ratio(data, "x", "plain")
        ratios = [x_plain, paired_ratio(data, "accelerate", "plain"), paired_ratio(data, "x", "accelerate")]
        if x_plain is None:
            verdict = "not measured"
        else:
            met = x_plain >= row.target if row.higher_is_better else x_plain <= row.target
            verdict = "meets target" if met else "misses target"
        target = f"{'≥' if row.higher_is_better else '≤'} {row.target:.2f}"
        cells = [fmt(shown[v]) for v in VARIANTS] + ["—" if r is None else f"{r:.2f}" for r in ratios]
        print(f"| {row.label} ({row.unit}) | {' | '.join(cells)} | {target} | {verdict} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3, help="times everything runs in fresh processes")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved blocks per task and repeat")
    parser.add_argument("--setups", type=int, default=8, help="setup samples, each in fresh processes")
    parser.add_argument("--quick", action="store_true", help="a smoke run (<60 s): 1 repeat, 2 short rounds")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: GPU rows (1 or 2 GPUs)")
    # nox -s bench passes the same arguments to every benchmark; ignore the ones meant for others.
    args, _ = parser.parse_known_args()

    print(f"python {platform.python_version()}")
    for dist in ("torch", "accelerate", "x-runtime"):
        print(f"{dist} {version(dist)}")
    print(f"CPUs: {os.cpu_count()} ({len(os.sched_getaffinity(0))} usable)")
    print(load_average("before"))
    variants = list(VARIANTS)
    if version("accelerate") == "not installed":
        print("accelerate is not installed: its column is left out (nox -s bench installs it)")
        variants.remove("accelerate")

    if args.quick:
        repeat, rounds, setups = 1, 2, 1
        options = ["--micro-steps", "10", "--small-steps", "1", "--gather-calls", "10"]
    else:
        repeat, rounds, setups = max(1, args.repeat), max(1, args.rounds), max(args.setups, args.repeat)
        blocks = {"micro-steps": 300, "small-steps": 20, "gather-calls": 400, "models": 4, "loader-epochs": 3}
        options = [arg for name, value in blocks.items() for arg in (f"--{name}", str(value))]

    gpus = 0
    if args.device == "cuda":
        import torch

        gpus = min(torch.cuda.device_count(), 2)
        if not gpus:
            sys.exit("--device cuda: no CUDA device here")
        print(f"device: {torch.cuda.get_device_name(0)} x {gpus} (NCCL between 2)")
        options += ["--device", "cuda"]
    started = time.perf_counter()
    results = measure_workers(variants, repeat, rounds, options, gpus, setups)
    env, count, beyond = worker_env(), repeat if args.quick else 4 * repeat, []
    # The import row is the CPU run's: on the first GPU machine lent (16 cores, a CUDA torch) its
    # dozen fresh interpreters outran the device check's limit before the GPU rows were printed.
    if args.device == "cpu":
        print("imports ...", flush=True)
        results[("import", 1)] = measure_imports(variants, count, warm=not args.quick, env=env, order=rotated)
        beyond = [] if args.quick else imported_beyond_torch(env)
    print(f"({time.perf_counter() - started:.0f} s)")

    print(load_average("after"))
    print_table(results, repeat, rounds, setups, count)
    if beyond:
        listed = ", ".join(f"{name} {seconds * 1e3:.0f} ms" for name, seconds in beyond[:6])
        print(f"\n`import x_runtime` after `import torch` loads (self time by top-level package): {listed}")


if __name__ == "__main__":
    main()
