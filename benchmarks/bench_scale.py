"""How x's multi-machine launch scales: 1, 2, 4 and 8 hosts, one x-launch and one process on each.

    sudo python benchmarks/bench_scale.py [--repeat 3] [--quick]    # nox -s bench runs it too

Each host is a network namespace with its own address (``integration-tests/netns.py``), so the
launches are real multi-machine ones: ``x-launch --num_machines N --machine_rank i
--main_process_ip <host 1> --num_processes N --cpu scale_workers/scale_step.py`` on every host at
once, torchrun's static rendezvous (its TCPStore on host 1), gloo between the hosts' addresses.
N=1 is one x-launch of one process, which runs the script directly (no torchrun agent).

Measured, per N (median of --repeat runs, the N values round-robin within each repetition):
- launch to first step: from starting the N x-launch processes until the last rank began its
  first training step (each rank stamps time.time(); the hosts share this machine's clock);
  launch to exit: until the last x-launch exited;
- where the time goes: each milestone at the moment the LAST host passed it (agent and worker
  creation read from /proc, torchrun's agent log (LOGLEVEL=INFO, kept by --log_dir), the
  worker's own stamps), so the phases add up to launch-to-first-step;
- per-step all-reduce of 4 B and 1 MiB (float32) inside the ranks: the median of --iterations
  calls, each after a barrier, on the slowest rank;
- what x does per node: the collectives the runtime makes in Accelerator() and prepare() (counted
  by wrapping torch.distributed's functions in the worker), the CPU seconds x-launch and the agent
  used by the first step, and the time of x-launch --dry-run (its whole plan) for 2 vs 1024 machines, from flags and
  inside a (simulated) SLURM step of one task per node.

Every host runs 3 processes (x-launch, the agent, the worker), so 8 hosts put 24 processes, 16 of
them importing torch, on this machine's cores: with fewer cores than hosts the timings measure
CPU contention as much as the launch, and the output says so. Needs root (namespaces); without it
the benchmark says why and exits 0. Timings are reported, never asserted. --quick, a smoke, runs
1 and 2 hosts once, 10 all-reduces of each size: 10-15 s on 2 cores at load average 1-3.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration-tests"))
from netns import Host, netns_hosts, netns_problem

WORKER = Path(__file__).resolve().parent / "scale_workers" / "scale_step.py"
PREFIX, SUBNET, PORT = "xbs", "203.0.113", "29500"  # TEST-NET-3: the integration tests use 198.51.100
TIMEOUT = 300
DROP_PREFIXES = ("X_", "ACCELERATE_", "PET_", "TORCHELASTIC_", "MASTER_", "SLURM_")
DROP = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"}
# torchrun's agent logs (LOGLEVEL=INFO) as "I1202 00:34:42.482000 7233 path:line] message".
AGENT_LINE = re.compile(r"^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6}) \d+ \S+\] (.*)$")
AGENT_EVENTS = {"agent_up": "Starting elastic_operator", "rendezvous_done": "Rendezvous complete for workers"}
# Milestones in order, each with the phase that ends at it.
PHASES = (
    ("agent_created", "x-launch: interpreter, import x_launch, plan, start torchrun"),
    ("agent_up", "torchrun agent: interpreter, import torch"),
    ("rendezvous_done", "rendezvous (static, TCPStore on host 1)"),
    ("worker_created", "agent starts the worker"),
    ("imported", "worker: interpreter, import torch + x_runtime"),
    ("process_group_ready", "Accelerator(): process group (gloo)"),
    ("model_built", "script: model + optimizer (torch.optim's first use)"),
    ("prepared", "prepare(): DDP wrap"),
    ("first_step", "first batch to the first step"),
)


def isolated_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROP_PREFIXES) and k not in DROP}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / "cfg"), XDG_CACHE_HOME=str(home / "cache"))
    env.update(HF_HOME=str(home / "hf"), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", LOGLEVEL="INFO")
    return env


def x_launch() -> str:
    return str(Path(sys.executable).with_name("x-launch"))


def agent_stamps(log: Path) -> dict[str, float]:
    """When the agent came up and finished the rendezvous, from its log (local time, to the ms)."""
    found: dict[str, float] = {}
    year = datetime.date.today().year
    for line in log.read_text(errors="replace").splitlines() if log.is_file() else []:
        match = AGENT_LINE.match(line)
        if match is None:
            continue
        month, day, hour, minute, second, micro = (int(g) for g in match.groups()[:6])
        for name, text in AGENT_EVENTS.items():
            if name not in found and text in match[7]:
                found[name] = datetime.datetime(year, month, day, hour, minute, second, micro).timestamp()
    return found


def run_once(n: int, folder: Path, env: dict[str, str], iterations: int) -> dict:
    """All N launches once; times relative to the start of the first launch."""
    folder.mkdir(parents=True)
    with netns_hosts(n, prefix=PREFIX, subnet=SUBNET) as hosts:
        procs: list[subprocess.Popen] = []
        started = time.time()
        for rank, host in enumerate(hosts):
            argv = [x_launch(), "--num_machines", str(n), "--machine_rank", str(rank), "--num_processes", str(n)]
            argv += ["--main_process_ip", hosts[0].ip, "--main_process_port", PORT, "--cpu"]
            argv += [
                "--log_dir",
                str(folder / f"host{rank}"),
                str(WORKER),
                str(folder),
                "--iterations",
                str(iterations),
            ]
            with open(folder / f"host{rank}.out", "w") as out:
                procs.append(host.popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=folder))
        exited = wait_all(procs, hosts, folder)
    ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(n)]
    for rank, result in enumerate(ranks):
        result["stamps"].update(agent_stamps(folder / f"host{rank}" / "torchrun.log"))
    milestones = {}
    for name, _ in PHASES:
        seen = [r["stamps"][name] for r in ranks if name in r["stamps"]]
        if len(seen) == n:  # N=1 has no agent: its milestones are absent
            milestones[name] = max(seen) - started
    return {
        "milestones": milestones,
        "exit": exited - started,
        "done": max(r["stamps"]["done"] for r in ranks) - started,
        "all_reduce": {size: max(r["all_reduce_s"][size] for r in ranks) for size in ranks[0]["all_reduce_s"]},
        "collectives": {calls(r["collectives"]) for r in ranks},
        "cpu": {what: max(r["cpu_seconds"].get(what, 0.0) for r in ranks) for what in ("x_launch", "agent")},
    }


def calls(collectives: dict[str, dict[str, int]]) -> str:
    """``{"Accelerator()": {"init_process_group": 1}, ...}`` as "Accelerator(): init_process_group 1; ..."."""
    parts = []
    for where, counted in collectives.items():
        parts.append(f"{where}: " + (", ".join(f"{k} {v}" for k, v in sorted(counted.items())) or "none"))
    return "; ".join(parts)


def wait_all(procs: list[subprocess.Popen], hosts: list[Host], folder: Path) -> float:
    """When the last x-launch exited; exits with their output if one failed or all ran too long."""
    deadline = time.monotonic() + TIMEOUT
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.01)
    exited = time.time()
    codes = [p.poll() for p in procs]
    if codes != [0] * len(procs):
        outputs = "\n".join(
            f"--- {h.name}\n{(folder / f'host{i}.out').read_text()[-2000:]}" for i, h in enumerate(hosts)
        )
        sys.exit(f"{len(hosts)} hosts: exit codes {codes} (None: still running after {TIMEOUT} s)\n{outputs}")
    return exited


def slurm_step(nodes: int) -> dict[str, str]:
    """SLURM's variables in the last task of ``srun --nodes N --ntasks-per-node 1 x-launch ...``."""
    nodelist = f"n[0001-{nodes:04d}]"
    last = str(nodes - 1)
    return {
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_NNODES": str(nodes),
        "SLURM_NTASKS": str(nodes),
        "SLURM_TASKS_PER_NODE": f"1(x{nodes})",
        "SLURM_NODEID": last,
        "SLURM_PROCID": last,
        "SLURM_LOCALID": "0",
    }


def plan_seconds(machines: int, slurm: bool, repeat: int, env: dict[str, str], cwd: Path) -> float:
    """x-launch --dry-run on the last of ``machines``: everything x-launch decides on a node."""
    argv = [x_launch(), "--cpu", "--dry-run"]
    if slurm:  # machines, ranks, address and port from SLURM's variables
        env = {**env, **slurm_step(machines)}
    else:
        argv += ["--num_machines", str(machines), "--machine_rank", str(machines - 1)]
        argv += ["--num_processes", str(machines), "--main_process_ip", f"{SUBNET}.1", "--main_process_port", PORT]
    argv += [str(WORKER), "results"]
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        out = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
        times.append(time.perf_counter() - start)
        if out.returncode != 0 or f"--nnodes {machines} " not in out.stdout:
            sys.exit(f"{shlex.join(argv)} exited {out.returncode}:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return statistics.median(times)


def median_of(runs: list[dict], key) -> float | None:
    values = [key(run) for run in runs]
    return None if any(v is None for v in values) else statistics.median(values)


def fmt(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def scaling_table(title: str, results: dict[int, list[dict]], key) -> None:
    print(f"\n{title}")
    print("| hosts | median s | ratio to 1 host | s per added host (from the row above) |")
    print("|---|---|---|---|")
    previous = None
    base = median_of(results[min(results)], key)
    for n, runs in sorted(results.items()):
        value = median_of(runs, key)
        step = "—" if previous is None else fmt((value - previous[1]) / (n - previous[0]))
        print(f"| {n} | {fmt(value)} | {fmt(value / base)} | {step} |")
        previous = (n, value)


def breakdown_table(results: dict[int, list[dict]]) -> None:
    print("\nwhere launch-to-first-step goes: s from the launch until the last host passed each milestone,")
    print("(phase length = the difference to the milestone above; N=1 runs the script without torchrun)")
    ns = sorted(results)
    print("| phase ends when the last host ... | " + " | ".join(f"{n} host(s)" for n in ns) + " |")
    print("|---|" + "---|" * len(ns))
    for name, phase in PHASES:
        cells = [fmt(median_of(results[n], lambda r, name=name: r["milestones"].get(name))) for n in ns]
        print(f"| {phase} | " + " | ".join(cells) + " |")
    cells = [fmt(median_of(results[n], lambda r: r["exit"] - r["done"])) for n in ns]
    print("| shut-down: last rank done to last x-launch exit (s, not cumulative) | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3, help="runs of every host count, interleaved")
    parser.add_argument("--iterations", type=int, default=50, help="all-reduces timed per size in each rank")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 and 2 hosts once")
    args, _ = parser.parse_known_args()  # nox -s bench passes the same arguments to every benchmark
    problem = netns_problem()
    if problem is not None:
        print(f"bench_scale: skipped: {problem}")
        return
    # 1 host runs the script without torchrun, 2 the whole multi-machine path: more hosts add no code, only time.
    counts = (1, 2) if args.quick else (1, 2, 4, 8)
    repeat = 1 if args.quick else max(1, args.repeat)
    iterations = 10 if args.quick else args.iterations
    cores = len(os.sched_getaffinity(0))
    print(f"python {sys.version.split()[0]}, CPUs: {os.cpu_count()} ({cores} usable), date {datetime.date.today()}")
    if max(counts) * 3 > cores:
        print(
            f"NOTE: CPU-oversubscribed: {max(counts)} hosts run {3 * max(counts)} processes ({2 * max(counts)} "
            f"import torch) on {cores} core(s); one process per host, the times include waiting for a core."
        )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "home").mkdir()
        env = isolated_env(root / "home")
        results: dict[int, list[dict]] = {n: [] for n in counts}
        for rep in range(repeat):
            for n in counts:  # round-robin, so drift in machine load hits every N alike
                print(f"repetition {rep + 1}/{repeat}: {n} host(s) ...", flush=True)
                results[n].append(run_once(n, root / f"r{rep}-n{n}", env, iterations))
        plans = {(m, slurm): plan_seconds(m, slurm, repeat, env, root) for slurm in (False, True) for m in (2, 1024)}
    print(f"({time.perf_counter() - started:.0f} s; median of {repeat} run(s) per host count)")

    scaling_table(
        "launch to first step (every rank in its first step)", results, lambda r: r["milestones"]["first_step"]
    )
    scaling_table("launch to exit (3 steps, the all-reduce timings, shut-down)", results, lambda r: r["exit"])
    breakdown_table(results)
    print(f"\nall-reduce per call, slowest rank's median of {iterations} (ms)")
    print("| hosts | 4 B | 1 MiB |")
    print("|---|---|---|")
    for n in counts:
        sizes = [
            median_of(results[n], lambda r, s=s: 1e3 * r["all_reduce"][s] if s in r["all_reduce"] else None)
            for s in ("4", "1048576")
        ]
        print(f"| {n} | {fmt(sizes[0], 3)} | {fmt(sizes[1], 3)} |")
    print("\nwhat each node does at start-up (max over the ranks; median over the runs)")
    print("| hosts | collectives in Accelerator() / prepare(), per rank | CPU s x-launch | CPU s agent |")
    print("|---|---|---|---|")
    for n in counts:
        seen = set().union(*(r["collectives"] for r in results[n]))
        made = " OR ".join(sorted(seen))  # one entry when every rank made the same calls
        cpu = [median_of(results[n], lambda r, w=w: r["cpu"][w]) for w in ("x_launch", "agent")]
        print(f"| {n} | {made} | {fmt(cpu[0])} | {fmt(cpu[1]) if n > 1 else '— (no agent)'} |")
    print(f"\nx-launch --dry-run on the last machine (its whole per-node plan), median of {repeat} (s)")
    print("| machines | flags (--num_machines M --machine_rank M-1) | SLURM step, one task per node (srun) |")
    print("|---|---|---|")
    for m in (2, 1024):
        print(f"| {m} | {plans[m, False]:.2f} | {plans[m, True]:.2f} |")


if __name__ == "__main__":
    main()
