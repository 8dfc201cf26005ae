"""Fixtures shared by the x-estimate tests.

Every test runs with its own summary cache (``$XDG_CACHE_HOME``) and its own, offline Hugging
Face cache, so no test reads what another wrote and nothing reaches the Hub. The estimator is
driven through its real entry point (``x_estimate.cli.main``), in this process for speed or as
the installed console script in a subprocess where the process boundary matters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "coverage: a pass over every model type (slow); runs only with -m coverage")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The coverage passes build every model type twice: deselected unless -m asks for them.
    if "coverage" in (config.getoption("-m") or ""):
        return
    slow = [item for item in items if item.get_closest_marker("coverage") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("coverage") is None]


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    @property
    def json(self) -> Any:
        assert self.code == 0, self.err
        return json.loads(self.out)


@pytest.fixture(autouse=True)
def isolated_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A private summary cache and an empty, offline Hugging Face cache for each test."""
    paths = {
        "XDG_CACHE_HOME": tmp_path / "xdg-cache",
        "HF_HUB_CACHE": tmp_path / "hf-hub-cache",
        "HF_HOME": tmp_path / "hf-home",
    }
    for name, path in paths.items():
        monkeypatch.setenv(name, str(path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    # huggingface_hub reads its environment once, at import: point the already imported
    # module at the same places the environment names (subprocesses read the environment).
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(paths["HF_HUB_CACHE"]))
    return paths


@pytest.fixture
def summary_cache(isolated_caches: dict[str, Path]) -> Path:
    """The folder x-estimate keeps its summaries in for this test."""
    return isolated_caches["XDG_CACHE_HOME"] / "x-estimate"


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """Run ``x-estimate ARGS`` in this process; returns exit code, stdout and stderr."""
    from x_estimate.cli import main

    def run(*args: Any) -> CliResult:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            main([str(a) for a in args])
        captured = capsys.readouterr()
        code = exc.value.code
        return CliResult(0 if code is None else int(code), captured.out, captured.err)

    return run


@pytest.fixture(scope="session")
def exe(console_script: Callable[[str], str]) -> str:
    return console_script("x-estimate")


@pytest.fixture
def script_env(isolated_caches: dict[str, Path]) -> dict[str, str]:
    """Environment for a subprocess: the test's caches, offline, no token."""
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    env.update({name: str(path) for name, path in isolated_caches.items()})
    env["HF_HUB_OFFLINE"] = "1"
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    return env


@pytest.fixture
def run_script(exe: str, script_env: dict[str, str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the installed console script in a subprocess."""

    def run(*args: Any, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [exe, *map(str, args)], capture_output=True, text=True, env=script_env, timeout=timeout, cwd="/"
        )

    return run


@pytest.fixture
def run_python(script_env: dict[str, str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``python -c CODE ARGS`` with this interpreter and the test's environment."""

    def run(code: str, *args: Any, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", code, *map(str, args)],
            capture_output=True,
            text=True,
            env=script_env,
            timeout=timeout,
            cwd="/",
        )

    return run


@pytest.fixture
def model_dir(tmp_path: Path) -> Callable[..., Path]:
    """Save a transformers config (or write a dict as config.json) to a fresh folder."""

    def make(config: Any, name: str = "model") -> Path:
        folder = tmp_path / name
        folder.mkdir(parents=True)
        if isinstance(config, dict):
            (folder / "config.json").write_text(json.dumps(config))
        else:
            config.save_pretrained(folder)
        return folder

    return make


@pytest.fixture
def hub_cache(isolated_caches: dict[str, Path]) -> Callable[[str, dict[str, Any]], Path]:
    """Put ``config`` in the offline Hugging Face cache as repo ``org/name``'s config.json."""

    def put(repo_id: str, config: dict[str, Any]) -> Path:
        org, name = repo_id.split("/")
        repo = isolated_caches["HF_HUB_CACHE"] / f"models--{org}--{name}"
        snapshot = repo / "snapshots" / HUB_COMMIT
        snapshot.mkdir(parents=True)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(HUB_COMMIT)
        (snapshot / "config.json").write_text(json.dumps(config))
        return snapshot

    return put


def _table(text: str) -> dict[str, list[str]]:
    """The markdown table of a text report as {dtype: [cells after the dtype]}; "dtype" row is the header."""
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("| "):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


@pytest.fixture
def parse_table() -> Callable[[str], dict[str, list[str]]]:
    return _table


def tiny_gpt2_config(**overrides: Any) -> Any:
    from transformers import GPT2Config

    values = {
        "n_layer": 2,
        "n_embd": 64,
        "n_head": 4,
        "vocab_size": 1000,
        "n_positions": 128,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "architectures": ["GPT2LMHeadModel"],
    }
    return GPT2Config(**{**values, **overrides})


def tiny_bert_config(**overrides: Any) -> Any:
    from transformers import BertConfig

    values = {
        "vocab_size": 1000,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "max_position_embeddings": 128,
        "architectures": ["BertForMaskedLM"],
    }
    return BertConfig(**{**values, **overrides})


def tiny_llama_config(**overrides: Any) -> Any:
    from transformers import LlamaConfig

    values = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 1000,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "architectures": ["LlamaForCausalLM"],
    }
    return LlamaConfig(**{**values, **overrides})


@pytest.fixture(scope="session")
def configs() -> Any:
    """Factories of small transformers configs: configs.gpt2(), configs.bert(), configs.llama()."""

    class Configs:
        gpt2 = staticmethod(tiny_gpt2_config)
        bert = staticmethod(tiny_bert_config)
        llama = staticmethod(tiny_llama_config)

    return Configs()


def _storage_bytes(tensors: Any) -> int:
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def measured_step_peak(
    model: Any,
    batch: dict[str, Any],
    loss_of: Callable[[Any], Any],
    *,
    keep_outputs: bool = True,
    precision: str = "fp32",
    optimizer: str = "adamw",
) -> int:
    """Peak live tensor bytes of one real training step of ``model`` on CPU.

    Measured without any of the simulation's code: torch.profiler's allocation events
    (``profile_memory=True``) give the live-bytes curve of everything the step allocates; the
    weights, optimizer state and batch that exist before it are counted from their storages. The
    optimizer state is created first (zeros, as a first step creates it), so the step measured is
    any later step of training. The loop is ``outputs = model(**batch); loss = loss_of(outputs)``
    (under CPU autocast to bfloat16 for ``precision="mixed-bf16"``), ``outputs`` kept through the
    step or dropped before backward, then ``loss.backward(); opt.step(); opt.zero_grad()``.
    """
    import contextlib

    import torch
    from torch.profiler import ProfilerActivity, profile

    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt: Any
    if optimizer == "adamw":
        opt = torch.optim.AdamW(params, lr=1e-4)
        for p in params:
            opt.state[p] = {
                "step": torch.tensor(0.0),
                "exp_avg": torch.zeros_like(p),
                "exp_avg_sq": torch.zeros_like(p),
            }
    elif optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=1e-4, momentum=0.9)
        for p in params:
            opt.state[p] = {"momentum_buffer": torch.zeros_like(p)}
    else:
        raise ValueError(f"no measured step for the {optimizer} optimizer")
    state = [v for s in opt.state.values() for v in s.values()]
    before = _storage_bytes([*model.parameters(), *model.buffers(), *state, *batch.values()])
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "mixed-bf16" else contextlib.nullcontext()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with cast:
            outputs = model(**batch)
            loss = loss_of(outputs)
        if not keep_outputs:
            del outputs
            outputs = None
        loss.backward()
        del loss
        opt.step()
        opt.zero_grad(set_to_none=True)
        del outputs
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()
        peak = max(peak, live)
    assert live <= 0.01 * peak  # the step gave back what it took: the curve is whole
    return before + peak


@pytest.fixture(scope="session")
def measured_peak() -> Callable[..., int]:
    """``measured_step_peak``: the peak of one real CPU training step, from the allocator's events."""
    return measured_step_peak


def unique_bytes(module: Any) -> int:
    """Bytes of the distinct storages behind a real module's parameters and buffers."""
    seen: dict[int, int] = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


@pytest.fixture(scope="session")
def storage_bytes() -> Callable[[Any], int]:
    return unique_bytes


@pytest.fixture
def snapshot_tree() -> Callable[[Path], dict[str, tuple[bytes, int]]]:
    """Every file under a folder with its content and mtime, to prove nothing was written."""

    def snap(root: Path) -> dict[str, tuple[bytes, int]]:
        return {
            str(p.relative_to(root)): (p.read_bytes() if p.is_file() else b"", p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*"))
        }

    return snap
