"""Each package installs from the built wheels alone, the way the README says, and its main command works.

Run by ``nox -s installs`` (in CI's ``nox -t ci``): see conftest.py for the venvs.
"""

from __future__ import annotations

import json
import re
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Venv

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("x-common", "x-launch", "x-runtime", "x-bigmodel", "x-estimate")
SCRIPTS = Path(__file__).parent / "scripts"
URL_LABELS = ("Homepage", "Documentation", "Source", "Issues")
# The lines the READMEs show, run here word for word (from the folder holding dist/).
INSTALL = {
    "x-launch": "pip install --find-links dist x-launch",
    "x-estimate": "pip install --find-links dist x-estimate",
    "x-bigmodel": "pip install --find-links dist x-bigmodel",
    "x-runtime": "pip install --find-links dist x-launch x-runtime",
}
# Packages a user installs without any other x package but x-common: their package README shows these.
ALONE = {
    "x-runtime": "pip install --find-links dist x-runtime",
    "x-common": "pip install --find-links dist x-common",
}


def module_of(dist: str) -> str:
    return dist.replace("-", "_")


def artifacts(dist: Path, package: str) -> tuple[Path, Path]:
    wheels = sorted(dist.glob(f"{module_of(package)}-*-py3-none-any.whl"))
    sdists = sorted(dist.glob(f"{module_of(package)}-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, f"expected one wheel and one sdist of {package} in {dist}"
    return wheels[0], sdists[0]


def warning_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if re.search(r"warn", line, re.I)]


def install(venv: Venv, package: str, dist: Path, *, line: str | None = None) -> None:
    line = line or INSTALL[package]
    out = venv.run_readme_line(line, cwd=dist.parent)
    assert out.returncode == 0, f"`{line}` failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    wanted = {"x-common", *line.split("dist ", 1)[1].split()}
    assert venv.x_distributions() == wanted


@pytest.mark.parametrize("package", sorted(INSTALL))
def test_readmes_show_the_tested_install_line(package: str) -> None:
    line = INSTALL[package]
    assert line in (ROOT / "README.md").read_text(), f"README.md does not show `{line}`"
    assert line in (ROOT / "packages" / package / "README.md").read_text()


@pytest.mark.parametrize("package", sorted(ALONE))
def test_package_readmes_show_the_alone_install_line(package: str) -> None:
    assert ALONE[package] in (ROOT / "packages" / package / "README.md").read_text()


@pytest.mark.parametrize("package", PACKAGES)
def test_wheel_and_sdist_carry_license_urls_and_declared_dependencies(dist: Path, package: str) -> None:
    wheel, sdist = artifacts(dist, package)
    license_text = (ROOT / "LICENSE").read_bytes()
    stem = wheel.name.split("-py3")[0]
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert archive.read(f"{stem}.dist-info/licenses/LICENSE") == license_text
        metadata = Parser().parsestr(archive.read(f"{stem}.dist-info/METADATA").decode())
        assert f"{module_of(package)}/py.typed" in names
        assert not [n for n in names if "/tests/" in n or n.startswith("tests/")], "tests shipped in the wheel"
        if package in ("x-launch", "x-estimate"):
            assert f"{module_of(package)}/__main__.py" in names
    with tarfile.open(sdist) as archive:
        member = archive.extractfile(f"{sdist.name.removesuffix('.tar.gz')}/LICENSE")
        assert member is not None and member.read() == license_text
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]
    urls = dict(entry.split(", ", 1) for entry in metadata.get_all("Project-URL"))
    assert set(URL_LABELS) <= set(urls), urls
    requires = [r.split(";")[0] for r in metadata.get_all("Requires-Dist") or [] if "extra ==" not in r]
    names = {re.split(r"[<>=!\[ ]", r, maxsplit=1)[0].lower() for r in requires}
    if "torch" in names:  # torch without numpy warns on every import, and object collectives fail
        assert "numpy" in names, f"{package} requires torch but not numpy: {requires}"
    if package == "x-bigmodel":
        assert "tqdm" in names
        assert "progress" in metadata.get_all("Provides-Extra"), "x-bigmodel[progress] must still install"


def test_x_launch_alone_runs_its_self_check_without_warnings(dist: Path, fresh_venv: Venv, tmp_path: Path) -> None:
    install(fresh_venv, "x-launch", dist)
    out = fresh_venv.run("x-launch", "test", "--num_processes", "2", "--cpu", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ok   rank layout: 2 ranks" in out.stdout
    assert "x-launch test: all 6 checks passed on 2 process(es)" in out.stdout
    assert warning_lines(out.stderr) == []
    module = fresh_venv.run("python", "-m", "x_launch", "--version", cwd=tmp_path)
    script = fresh_venv.run("x-launch", "--version", cwd=tmp_path)
    assert (module.returncode, module.stdout) == (script.returncode, script.stdout)
    assert script.returncode == 0 and script.stdout.startswith("x-launch, version ")


def test_x_estimate_alone_sizes_a_local_config_without_warnings(dist: Path, fresh_venv: Venv, tmp_path: Path) -> None:
    install(fresh_venv, "x-estimate", dist)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "tie_word_embeddings": False,
    }
    (tmp_path / "tiny-llama").mkdir()
    (tmp_path / "tiny-llama" / "config.json").write_text(json.dumps(config))
    hidden, kv = 64, 64 * 2 // 4
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * 128 + 2 * hidden
    parameters = 2 * 1000 * hidden + 2 * per_layer + hidden
    offline = {"HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    for command in (["x-estimate"], ["python", "-m", "x_estimate"]):
        out = fresh_venv.run(*command, "./tiny-llama", "--dtypes", "float32", "--json", cwd=tmp_path, **offline)
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        assert report["parameters"] == parameters == 202048
        # Parameters in float32, plus the rotary embedding's small buffer.
        assert 0 <= report["rows"][0]["total_bytes"] - 4 * parameters < 1024
        assert warning_lines(out.stderr) == []
    bad = fresh_venv.run("python", "-m", "x_estimate", "./missing", cwd=tmp_path, **offline)
    assert bad.returncode == fresh_venv.run("x-estimate", "./missing", cwd=tmp_path, **offline).returncode != 0
    assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_x_bigmodel_alone_dispatches_a_safetensors_checkpoint_without_warnings(
    dist: Path, fresh_venv: Venv, tmp_path: Path
) -> None:
    install(fresh_venv, "x-bigmodel", dist)
    out = fresh_venv.run("python", str(SCRIPTS / "dispatch_checkpoint.py"), str(tmp_path), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["device_map"] == {"0": "cpu", "1": "disk", "2": "disk", "3": "disk"}
    assert result["max_abs_difference"] == 0.0
    assert warning_lines(out.stderr) == []


def test_x_launch_and_x_runtime_train_on_two_processes_without_warnings(
    dist: Path, fresh_venv: Venv, tmp_path: Path
) -> None:
    install(fresh_venv, "x-runtime", dist)
    script = str(SCRIPTS / "train_two_processes.py")
    out = fresh_venv.run("x-launch", "--num_processes", "2", "--cpu", script, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    reports = [json.loads((tmp_path / f"report-{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["rank"] for r in reports] == [0, 1]
    assert {r["world_size"] for r in reports} == {2}
    # 256 samples in batches of 16, split over two ranks.
    assert {r["batches_per_epoch"] for r in reports} == {8}
    losses = reports[0]["losses"]
    assert losses == reports[1]["losses"] and losses[-1] < losses[0] / 10
    assert reports[0]["weight_sum"] == reports[1]["weight_sum"]
    assert warning_lines(out.stderr) == []


def test_x_runtime_alone_trains_on_two_processes_under_torchrun_without_warnings(
    dist: Path, fresh_venv: Venv, tmp_path: Path
) -> None:
    install(fresh_venv, "x-runtime", dist, line=ALONE["x-runtime"])
    script = str(SCRIPTS / "train_two_processes.py")
    run = ("python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", script)
    out = fresh_venv.run(*run, cwd=tmp_path, OMP_NUM_THREADS="1")
    assert out.returncode == 0, out.stdout + out.stderr
    reports = [json.loads((tmp_path / f"report-{rank}.json").read_text()) for rank in (0, 1)]
    assert [(r["rank"], r["world_size"], r["batches_per_epoch"]) for r in reports] == [(0, 2, 8), (1, 2, 8)]
    assert reports[0]["losses"] == reports[1]["losses"] and reports[0]["losses"][-1] < reports[0]["losses"][0] / 10
    assert warning_lines(out.stderr) == []


def test_x_common_alone_parses_sizes_and_reads_the_host_without_importing_torch(
    dist: Path, fresh_venv: Venv, tmp_path: Path
) -> None:
    install(fresh_venv, "x-common", dist, line=ALONE["x-common"])
    code = (
        "import json, sys\n"
        "import x_common\n"
        "from x_common.sizes import format_size, parse_size\n"
        "print(json.dumps({'size': parse_size('80GiB'), 'text': format_size(3 * 2**30),"
        " 'memory': x_common.host_memory().total, 'torch': 'torch' in sys.modules}))\n"
    )
    out = fresh_venv.run("python", "-c", code, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert (result["size"], result["text"], result["torch"]) == (80 * 2**30, "3.00 GiB", False)
    assert result["memory"] > 2**30
    assert warning_lines(out.stderr) == []
