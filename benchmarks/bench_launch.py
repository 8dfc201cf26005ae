"""Start-up cost of `x-launch` vs `accelerate` vs `import torch`, and launch overhead vs torchrun, one run.

    nox -s bench            # or: python benchmarks/bench_launch.py [--repeat 3] [--quick]

What a user waits for when typing a launcher command, so every command runs as a fresh subprocess
(console scripts resolved next to sys.executable, i.e. from the same environment):

- CLI start-up: `x-launch --help`, `x-launch config show` and `x-launch --num_processes 2 --cpu
  --dry-run barrier.py` vs `accelerate --help`, as ratios to `python -c "import torch"` (the floor
  of any command that imports torch). x-launch should not import torch for these, so its target is
  a small fraction of it; a separate in-process run of x_launch.cli.main per command checks that
  torch stayed out of sys.modules and that the output is right (a fast wrong answer is no answer).
- launch overhead: wall time from starting a 2-process CPU launch of launch_workers/barrier.py
  (gloo init_process_group, one barrier, destroy) to its exit. x-launch vs the very torchrun
  command x-launch runs (read from its --dry-run output, `python -m x_launch.run.torchrun_agent ...`, run as
  `python -m torch.distributed.run` with the same arguments: a static rendezvous on 127.0.0.1) vs `accelerate launch --multi_gpu --num_processes 2`.
  `accelerate launch --cpu --num_processes 2` starts ONE plain process (its simple launcher;
  `--multi_gpu --cpu` is refused), so Accelerate's row uses --multi_gpu, which runs torchrun's
  agent in-process and starts 2 processes on a CPU-only machine too (barrier.py picks gloo). Every
  rank notes itself in a file, and the process counts are checked and reported (the full run also
  shows what `accelerate launch --cpu` starts). Each launch gets a fresh free port. A fourth row
  runs x-launch's command without its `--log-dir DIR --redirects 2` (each rank's stderr written to a
  file, which x-launch copies to the terminal and quotes when a rank fails), so the cost of those
  files shows on its own.

How: HOME, XDG_CONFIG_HOME, XDG_CACHE_HOME and HF_HOME point to an empty temporary folder and x's,
Accelerate's and torchrun's own variables are removed, so no user config changes the runs;
OMP_NUM_THREADS=1. After one untimed warm-up of each command (skipped with --quick), all commands
run once per repetition, round-robin (A B C A B C ...), so drift in machine load hits all alike.
Reported: median wall time of --repeat runs and, for the ratios, the median of per-repetition
ratios. Each x row says whether it meets its target; timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BARRIER = Path(__file__).parent / "launch_workers" / "barrier.py"

TARGET_CLI = 0.1  # x-launch commands that need no torch: at most this many times `import torch`
TARGET_LAUNCH = 1.02  # x-launch 2-process launch: at most this many times the torchrun it runs

# Accelerate, measured when the targets were set: `accelerate --help` 2.8 s wall, 1.6x `import torch`;
# `accelerate launch` 1.19x torchrun.

IMPORT_TORCH = "import torch"
HELP, SHOW, DRY = "x-launch --help", "x-launch config show", "x-launch --num_processes 2 --cpu --dry-run barrier.py"
ACC_HELP = "accelerate --help"
TORCHRUN, X_LAUNCH, ACC_LAUNCH = "torchrun (x-launch's command)", "x-launch", "accelerate launch --multi_gpu"
# x-launch's command without the per-rank stderr files it reads for its failure summary: what they cost.
TORCHRUN_NO_TEE = "torchrun without --log-dir/--redirects"
CLI_ROWS = (HELP, SHOW, DRY, ACC_HELP)
LAUNCH_ROWS = (TORCHRUN_NO_TEE, X_LAUNCH, ACC_LAUNCH)
X_ROWS = {HELP: TARGET_CLI, SHOW: TARGET_CLI, DRY: TARGET_CLI, X_LAUNCH: TARGET_LAUNCH}

# Run inside a fresh interpreter: x-launch's own entry point, with its output captured, then
# whether torch was imported along the way.
NO_TORCH_CHECK = """
import contextlib, io, json, sys
from x_launch.cli import main
out, err = io.StringIO(), io.StringIO()
code = 0
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
        main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
torch = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
print(json.dumps({"code": code, "torch": torch, "stdout": out.getvalue(), "stderr": err.getvalue()}))
"""

# Variables that would change what the launchers do: x's contract and flags, Accelerate's,
# torchrun's (PET_*) and a distributed environment this script might itself run in.
DROP_PREFIXES = ("X_", "ACCELERATE_", "PET_", "TORCHELASTIC_")
DROP = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"}


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def script(name: str) -> str | None:
    return shutil.which(name, path=str(Path(sys.executable).parent))


def isolated_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROP_PREFIXES) and k not in DROP}
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_CACHE_HOME=str(home / ".cache"),
        HF_HOME=str(home / "hf"),
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
    )
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(name: str, argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{name} exited {proc.returncode}:\n{shlex.join(argv)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return elapsed, proc.stdout


class Launches:
    """The 2-process launches: a fresh port and a fresh rank file per run; counts what started."""

    def __init__(self, commands: dict[str, list[str]], env: dict[str, str], cwd: Path, folder: Path) -> None:
        self.commands = commands  # "{port}" stands for the port of one run
        self.env = env
        self.cwd = cwd
        self.folder = folder
        self.runs = 0
        self.started: dict[str, list[list[str]]] = {name: [] for name in commands}

    def run(self, name: str) -> float:
        self.runs += 1
        ranks = self.folder / f"ranks-{self.runs}.txt"
        port = str(free_port())
        argv = [port if arg == "{port}" else arg for arg in self.commands[name]]
        seconds, _ = run(name, argv, {**self.env, "BENCH_LAUNCH_RANKS": str(ranks)}, self.cwd)
        self.started[name].append(sorted(ranks.read_text().split()) if ranks.exists() else [])
        return seconds

    def counts(self, name: str) -> str:
        seen = sorted({" ".join(ranks) for ranks in self.started[name]})
        return "; ".join(f"{len(s.split())} process(es), ranks {s.replace(' ', ',') or 'none'}" for s in seen)


def check_no_torch(args: list[str], env: dict[str, str], cwd: Path) -> dict:
    """x_launch.cli.main(args) in a fresh interpreter: exit code, output, torch modules it left loaded."""
    proc = subprocess.run(
        [sys.executable, "-c", NO_TORCH_CHECK, *args], capture_output=True, text=True, env=env, cwd=cwd
    )
    if proc.returncode != 0:
        sys.exit(f"check of x-launch {shlex.join(args)} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.splitlines()[-1])
    if result["code"] not in (0, None):
        sys.exit(f"x-launch {shlex.join(args)} exited {result['code']}:\n{result['stdout']}\n{result['stderr']}")
    return result


def torchrun_of(dry_run_output: str) -> list[str]:
    """The engine command x-launch prints in --dry-run, a master port in it replaced by "{port}"."""
    line = next((x for x in dry_run_output.splitlines() if x.startswith("command: ")), None)
    if line is None or "engine: torchrun" not in dry_run_output:
        sys.exit(f"x-launch --dry-run shows no torchrun command:\n{dry_run_output}")
    argv = shlex.split(line.removeprefix("command: "))
    if "x_launch.run.torchrun_agent" not in argv:
        sys.exit(f"unexpected engine command, update this benchmark: {line}")
    # x-launch runs torchrun through x_launch.run.torchrun_agent (its failures read typed); the reference is torchrun.
    argv[argv.index("x_launch.run.torchrun_agent")] = "torch.distributed.run"
    if "--master-port" in argv:
        argv[argv.index("--master-port") + 1] = "{port}"
    elif "--standalone" not in argv:  # standalone: torchrun binds a free port itself
        sys.exit(f"unexpected engine command, update this benchmark: {line}")
    return argv


def without_tee(argv: list[str]) -> list[str]:
    """``argv`` less torchrun's ``--log-dir DIR``, ``--redirects STREAMS`` and ``--tee STREAMS``."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--log-dir", "--redirects", "--tee"):
            skip = True
        else:
            out.append(arg)
    return out


def load_average(when: str) -> str:
    # Other work on the machine moves every figure: the table is read with this beside it.
    return f"load average {when}: " + " ".join(f"{value:.2f}" for value in os.getloadavg())


def fmt_ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def paired_ratio(times: dict[str, list[float]], top: str, bottom: str) -> float | None:
    if not times.get(top) or not times.get(bottom):
        return None
    return statistics.median(t / b for t, b in zip(times[top], times[bottom], strict=True))


def verdict(name: str, ratio: float | None) -> tuple[str, str]:
    if name not in X_ROWS:
        return "—", "reference"
    if ratio is None:
        return f"≤ {X_ROWS[name]:.2f}", "not measured"
    return f"≤ {X_ROWS[name]:.2f}", "meets target" if ratio <= X_ROWS[name] else "misses target"


def print_table(title: str, rows: tuple[str, ...], base: str, times: dict[str, list[float]]) -> None:
    print(f"\n{title}")
    print(f"| command | median wall s | ratio to {base} | target | verdict |")
    print("|---|---|---|---|---|")
    print(f"| {base} | {statistics.median(times[base]):.2f} | 1.00 | | |")
    for name in rows:
        if name not in times:
            continue
        ratio = paired_ratio(times, name, base)
        target, result = verdict(name, ratio)
        print(f"| {name} | {statistics.median(times[name]):.2f} | {fmt_ratio(ratio)} | {target} | {result} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of every command, interleaved")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run (<45 s on an idle machine): 1 run, no warm-up"
    )
    # nox -s bench passes the same arguments to every benchmark; ignore the ones meant for others.
    args, _ = parser.parse_known_args()
    repeat = 1 if args.quick else max(1, args.repeat)

    print(f"python {platform.python_version()}")
    for dist in ("torch", "accelerate", "x-launch"):
        print(f"{dist} {version(dist)}")
    print(f"CPUs: {os.cpu_count()} ({len(os.sched_getaffinity(0))} usable)")
    print(load_average("before"))
    x_launch = script("x-launch")
    if x_launch is None:
        sys.exit(f"x-launch is not installed next to {sys.executable}")
    accelerate = script("accelerate") if version("accelerate") != "not installed" else None
    if accelerate is None:
        print("accelerate is not installed: its rows are left out (nox -s bench installs it)")

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "home").mkdir()
        env = isolated_env(folder / "home")
        work = folder / "work"  # the launchers run here, on a copy of barrier.py, so that relative paths are short
        work.mkdir()
        shutil.copy(BARRIER, work / "barrier.py")

        x_args = {
            HELP: ["--help"],
            SHOW: ["config", "show"],
            DRY: ["--num_processes", "2", "--cpu", "--dry-run", "barrier.py"],
        }
        print("\nx-launch in-process (x_launch.cli.main), torch modules loaded afterwards:")
        outputs = {}
        for name, argv in x_args.items():
            result = check_no_torch(argv, env, work)
            outputs[name] = result["stdout"]
            found = (
                f"torch IMPORTED ({len(result['torch'])} torch modules)" if result["torch"] else "torch not imported"
            )
            print(f"  x-launch {shlex.join(argv)}: {found}")
        expected = {HELP: "Usage: x-launch", SHOW: "config file: none", DRY: "num_processes: 2  [--num_processes]"}
        for name, text in expected.items():
            if text not in outputs[name]:
                sys.exit(f"{name}: expected {text!r} in its output:\n{outputs[name]}")
        torchrun = torchrun_of(outputs[DRY])
        print(f"x-launch's engine command (timed as {TORCHRUN!r}, with a fresh port each run):")
        print(f"  {shlex.join(torchrun).replace(shlex.quote('{port}'), 'PORT')}")

        cli = {IMPORT_TORCH: [sys.executable, "-c", "import torch"]}
        cli.update({name: [x_launch, *argv] for name, argv in x_args.items()})
        launch_commands = {
            TORCHRUN: torchrun,
            TORCHRUN_NO_TEE: without_tee(torchrun),
            X_LAUNCH: [x_launch, "--num_processes", "2", "--cpu", "barrier.py"],  # a free port, as by default
        }
        if accelerate is not None:
            cli[ACC_HELP] = [accelerate, "--help"]
            # The values Accelerate would otherwise warn about defaulting are given, as a user would.
            acc = [accelerate, "launch", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
            launch_commands[ACC_LAUNCH] = [*acc, "--multi_gpu", "--num_processes", "2", "--main_process_port", "{port}"]
            launch_commands[ACC_LAUNCH].append("barrier.py")
            if not args.quick:
                launch_commands["accelerate launch --cpu (not timed)"] = [
                    *acc,
                    "--cpu",
                    "--num_processes",
                    "2",
                    "barrier.py",
                ]
        launches = Launches(launch_commands, env, work, folder)

        def run_all(names: list[str]) -> dict[str, float]:
            return {
                name: launches.run(name) if name in launch_commands else run(name, cli[name], env, work)[0]
                for name in names
            }

        timed = [*cli, *(n for n in launch_commands if "not timed" not in n)]
        if not args.quick:
            print("warm-up (untimed) ...", flush=True)
            run_all([*cli, *launch_commands])
        times: dict[str, list[float]] = {name: [] for name in timed}
        # Round-robin rather than one command after another, so drift in machine load hits all alike.
        for rep in range(repeat):
            print(f"repetition {rep + 1}/{repeat} ...", flush=True)
            for name, seconds in run_all(timed).items():
                times[name].append(seconds)

        print(f"({time.perf_counter() - started:.0f} s)")
        print("\nprocesses started per launch (every rank notes itself; '-' = started without RANK):")
        for name in launch_commands:
            print(f"  {name}: {launches.counts(name)}")
        for name in (TORCHRUN, TORCHRUN_NO_TEE, X_LAUNCH, ACC_LAUNCH):
            if name in launch_commands and any(ranks != ["0", "1"] for ranks in launches.started[name]):
                sys.exit(f"{name} did not start ranks 0 and 1 in every run: {launches.counts(name)}")

    print(load_average("after"))
    print_table(f"CLI start-up, fresh processes; median of {repeat} run(s)", CLI_ROWS, IMPORT_TORCH, times)
    print_table(
        f"2-process CPU launch of barrier.py (gloo init, barrier, destroy), start to exit; median of {repeat} run(s)",
        LAUNCH_ROWS,
        TORCHRUN,
        times,
    )
    print("ratios: median of per-repetition ratios")


if __name__ == "__main__":
    main()
