"""An elastic job loses a machine: ``x-launch --num_machines 2:3`` on three network-namespace hosts.

Each host (``netns.py``) runs one ``x-launch --num_machines 2:3 --num_processes 3 --cpu`` of
``workers/train_elastic.py``, which checkpoints after every step. Mid-epoch, every process on one
host is killed with SIGKILL (the machine is gone). The other two machines' workers fail in their
next collective, torchrun's agents meet again in a smaller world (c10d rendezvous, one restart),
the script loads the latest checkpoint and finishes at world size 2. What must hold: both
remaining launchers exit 0; the history kept in the checkpoints uses every sample once per epoch
(steps at world 3, then at world 2); the final checkpoint loads in a one-process run with the
weights the job ended with; nothing is left running inside the hosts.

The machine killed is not the one at ``--main_process_ip``: it holds the rendezvous store, and
losing it ends the job (docs/clusters.md says so).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netns import Host, netns_hosts, requires_netns

pytestmark = requires_netns

WORKER = Path(__file__).resolve().parent / "workers" / "train_elastic.py"
SUBNET = "192.0.2"  # TEST-NET-1; the multi-host tests use 198.51.100, the benchmarks 203.0.113
PORT = "29400"
SAMPLES = 96
TIMEOUT = 300


def _launch(host: Host, main_ip: str, out: Path, project: Path) -> subprocess.Popen:
    argv = [
        str(Path(sys.executable).with_name("x-launch")),
        *("--num_machines", "2:3", "--num_processes", "3", "--cpu"),
        *("--main_process_ip", main_ip, "--main_process_port", PORT),
        # the rendezvous closes 2 s after the smallest world has met, not torch's 30 s
        *("--rdzv_conf", "last_call_timeout=2", "--monitor_interval", "0.5"),
        *(str(WORKER), str(out), str(project), "--pace", "0.5"),
    ]
    log = (out / f"launcher-{host.name}.log").open("w")
    environ = {**_clean_env(), "X_TEST_HOST": host.ip, "OMP_NUM_THREADS": "1"}
    return host.popen(argv, env=environ, stdout=log, stderr=subprocess.STDOUT)


def _clean_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("X_", "ACCELERATE_", "RANK", "WORLD_SIZE"))}


def _wait(predicate, timeout: float, what: str, launchers: dict[str, subprocess.Popen], out: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        ended = {name: proc.returncode for name, proc in launchers.items() if proc.poll() is not None}
        if ended:
            raise AssertionError(f"x-launch ended early {ended} waiting for {what}:\n{_logs(out)}")
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}:\n{_logs(out)}")


def _logs(out: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(out.glob("launcher-*.log")))


def _attempts(out: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(out.glob("attempt-*.json"))]


def _progress(out: Path) -> int:
    try:
        return int((out / "progress").read_text())
    except (FileNotFoundError, ValueError):
        return 0


def test_a_lost_machine_leaves_a_smaller_world_that_finishes_every_sample_once(tmp_path) -> None:
    out, project = tmp_path / "out", tmp_path / "project"
    out.mkdir()
    with netns_hosts(3, prefix="xel", subnet=SUBNET) as hosts:
        main_ip = hosts[0].ip
        launchers = {host.name: _launch(host, main_ip, out, project) for host in hosts}
        try:
            _wait(lambda: _progress(out) >= 3, TIMEOUT, "three steps at world size 3", launchers, out)
            first = _attempts(out)
            assert sorted(a["world"] for a in first) == [3, 3, 3], first
            victim = hosts[-1]
            victim.kill()
            killed = time.time()
            launchers.pop(victim.name).wait(timeout=30)
            codes = {name: proc.wait(timeout=TIMEOUT) for name, proc in launchers.items()}
        finally:
            for proc in launchers.values():
                if proc.poll() is None:
                    proc.kill()
        assert codes == dict.fromkeys(codes, 0), _logs(out)
        assert all(not host.pids() for host in hosts if host is not victim), "processes left inside the hosts"
    final = json.loads((out / "final.json").read_text())
    worlds = [world for _epoch, world, _ids in final["steps"]]
    assert worlds[0] == 3 and worlds[-1] == 2 and worlds == sorted(worlds, reverse=True), worlds
    restarted = [a for a in _attempts(out) if a["world"] == 2]
    assert sorted(a["rank"] for a in restarted) == [0, 1], restarted
    assert victim.ip not in {a["address"] for a in restarted}
    # For docs/clusters.md: from the kill to the smaller world's workers starting (rendezvous included).
    print(f"restart after the loss: {min(a['started'] for a in restarted) - killed:.1f} s")
    for epoch in range(2):
        used = [i for at, _world, ids in final["steps"] if at == epoch for i in ids]
        assert sorted(used) == list(range(SAMPLES)), f"epoch {epoch}: {len(used)} indices, {len(set(used))} distinct"
    # The final checkpoint loads: a one-process run that only loads it holds the same weights.
    check = subprocess.run(
        [sys.executable, "-c", _LOAD_ONLY, str(project), str(out / "loaded.json")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**_clean_env(), "PYTHONPATH": str(WORKER.parent)},
    )
    assert check.returncode == 0, check.stderr[-3000:]
    assert json.loads((out / "loaded.json").read_text()) == pytest.approx(final["weights"], abs=0)


_LOAD_ONLY = """
import json, sys, torch
from torch.utils.data import DataLoader, TensorDataset
from x_runtime import Accelerator, DataLoaderConfiguration, ProjectConfiguration
from train_elastic import History
acc = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=sys.argv[1], automatic_checkpoint_naming=True),
                  dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Dropout(0.1), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
data = TensorDataset(torch.zeros(96, 6), torch.zeros(96, 1), torch.arange(96))
net, opt, loader = acc.prepare(net, opt, DataLoader(data, batch_size=4, shuffle=True))
acc.register_for_checkpointing(History())
acc.load_state()
weights = torch.cat([p.detach().flatten() for p in acc.unwrap_model(net).parameters()])
json.dump(weights.tolist(), open(sys.argv[2], "w"))
"""
