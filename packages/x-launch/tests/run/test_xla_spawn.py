"""The TPU runner: which function it calls, with which argv, and its errors (torch_xla faked)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from x_launch.run import xla_spawn as xla_run

SCRIPT = """
import sys
CALLS = []
def main():
    CALLS.append(list(sys.argv))
def train():
    CALLS.append(["train", *sys.argv[1:]])
if __name__ == "__main__":
    raise SystemExit("the script body must not run under the TPU runner")
"""


@pytest.fixture
def fake_xla(monkeypatch):
    spawned = []

    def spawn(fn, args=(), nprocs=None, **kwargs):
        spawned.append(nprocs)
        for index in range(2):  # two "devices", in this process
            fn(index, *args)

    xmp = types.ModuleType("torch_xla.distributed.xla_multiprocessing")
    xmp.spawn = spawn
    for name, module in {
        "torch_xla": types.ModuleType("torch_xla"),
        "torch_xla.distributed": types.ModuleType("torch_xla.distributed"),
        "torch_xla.distributed.xla_multiprocessing": xmp,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    sys.modules["torch_xla.distributed"].xla_multiprocessing = xmp
    sys.modules["torch_xla"].distributed = sys.modules["torch_xla.distributed"]
    return spawned


@pytest.fixture
def script(tmp_path: Path, monkeypatch):
    path = tmp_path / "tpu_train_script.py"
    path.write_text(SCRIPT)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    yield path
    sys.modules.pop("tpu_train_script", None)


def test_every_process_calls_main_with_the_scripts_argv(fake_xla, script) -> None:
    assert xla_run.main([str(script), "--epochs", "2"]) == 0
    calls = sys.modules["tpu_train_script"].CALLS
    assert calls == [[str(script), "--epochs", "2"]] * 2
    assert fake_xla == [None]  # every device


def test_a_named_function_and_one_process(fake_xla, script) -> None:
    assert xla_run.main(["--main_training_function", "train", "--nprocs", "1", str(script), "x"]) == 0
    assert sys.modules["tpu_train_script"].CALLS == [["train", "x"]] * 2
    assert fake_xla == [1]


def test_a_missing_function_is_one_line_with_the_fix(fake_xla, script, capsys) -> None:
    assert xla_run.main(["--main_training_function", "fit", str(script)]) == 2
    assert capsys.readouterr().err.strip() == (
        "Error: tpu_train_script.py has no function fit(); on TPU every process calls a function of the script: "
        "define fit() or pass --main_training_function"
    )
    assert fake_xla == []


def test_without_torch_xla_the_install_command_is_named(script, capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_xla", None)  # import fails
    assert xla_run.main([str(script)]) == 2
    assert capsys.readouterr().err.strip() == "Error: x-launch --tpu needs torch_xla: pip install 'torch_xla[tpu]'"


@pytest.fixture
def dry_run(tmp_path: Path, monkeypatch, capsys):
    from x_launch.cli import main

    for name in list(__import__("os").environ):
        if name.startswith(("SLURM_", "PJRT_", "MASTER_")):
            monkeypatch.delenv(name)
    script = tmp_path / "train.py"
    script.write_text("def main():\n    pass\n")

    def run(*flags: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as exited:
            main([*flags, "--dry-run", str(script), "--epochs", "1"])
        out = capsys.readouterr()
        return exited.value.code, out.out, out.err

    return run, script


def test_tpu_dry_run_shows_torch_xlas_launcher_and_its_environment(dry_run) -> None:
    run, script = dry_run
    code, out, _ = run("--tpu")
    assert code == 0
    assert "engine: torch_xla" in out
    assert f"-m x_launch.run.xla_spawn --main_training_function main {script} --epochs 1" in out  # every device
    assert "  PJRT_DEVICE=TPU" in out and "  X_DISTRIBUTED_TYPE=XLA" in out
    assert "  MASTER_PORT=29500" in out  # torch_xla's rendezvous port follows --main_process_port
    code, out, _ = run("--tpu", "--num_processes", "1", "--main_training_function", "fit")
    assert f"--main_training_function fit --nprocs 1 {script}" in out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tpu", "--cpu"], "Error: --tpu and --cpu contradict each other: pick one"),
        (
            ["--tpu", "--num_machines", "2", "--num_processes", "2", "--main_process_ip", "10.0.0.1"],
            "Error: --tpu with --num_machines 2: on a TPU pod, run x-launch --tpu on every host",
        ),
        (["--tpu", "--log_dir", "logs"], "Error: --log_dir needs torchrun's per-rank logs"),
    ],
)
def test_tpu_conflicts_are_one_line_and_exit_2(dry_run, flags, message) -> None:
    run, _ = dry_run
    code, out, err = run(*flags)
    assert code == 2 and out == ""
    assert err.startswith(message) and len(err.strip().splitlines()) == 1


@pytest.mark.requires_tpu
def test_x_launch_tpu_runs_main_on_every_device(console_script, tmp_path: Path) -> None:
    import json
    import subprocess

    script = tmp_path / "tpu_main.py"
    script.write_text(
        "import json, sys\n"
        "from pathlib import Path\n"
        "def main():\n"
        "    import torch_xla.runtime as xr\n"
        "    Path(sys.argv[1], f'rank{xr.global_ordinal()}.json').write_text(json.dumps(\n"
        "        {'world': xr.world_size(), 'argv': sys.argv[2:]}))\n"
    )
    result = subprocess.run(
        [console_script("x-launch"), "--tpu", str(script), str(tmp_path), "--flag"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reports = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert reports and all(r == {"world": len(reports), "argv": ["--flag"]} for r in reports)
