"""Bad input, across every command line and entry point, meets the product's standard.

"Bad input gets one clear line saying what is wrong and how to fix it, a non-zero exit code, no
traceback (unless --debug), and nothing lost: never overwrite or half-write a user's file."

Each row of the tables below is one malformed input. Command lines run as the installed console
scripts in a clean environment (HOME, XDG_* folders, HF_HOME and TMPDIR inside the test's folder,
no X_* variables, offline), and must exit with the code the CLI documents (x-launch: 2 for every
bad input, 1 when a question is declined; x-estimate: 2 for bad options, 1 for a model it cannot
read), print exactly one non-empty line on stderr naming the problem, and leave every file under
the test's folder byte-identical. Python APIs (x-bigmodel, x-runtime) run in one subprocess
(``bad_input/api_driver.py``), each call in its own folder; the exception's type, a one-line
message naming the problem and the unchanged folder are checked the same way.

A row with ``bug=`` is a real defect, kept here as a strict xfail until it is fixed.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from x_common import env

DRIVER = Path(__file__).resolve().parent / "bad_input" / "api_driver.py"

# --- shared inputs ----------------------------------------------------------------------------

# A script that leaves a mark if anything launches it: a refused launch must not run it.
SCRIPT = {"train.py": "from pathlib import Path\nPath('ran.txt').write_text('launched')\n"}

TINY_LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
}
MODEL = {"tiny/config.json": json.dumps(TINY_LLAMA, indent=2)}


def _llama(**changes: Any) -> dict[str, str]:
    return {"tiny/config.json": json.dumps({**TINY_LLAMA, **changes}, indent=2)}


def _yaml(text: str, name: str = "bad.yaml") -> dict[str, str]:
    return {**SCRIPT, name: text}


# --- command lines ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Cli:
    id: str
    argv: tuple[str, ...]  # argv[0]: the console script
    code: int
    words: tuple[str, ...]  # each must appear in the one stderr line (case-insensitive)
    files: Mapping[str, str | bytes] = field(default_factory=dict)  # relative to the test folder
    env: Mapping[str, str] = field(default_factory=dict)
    stdin: str | None = None  # None: no terminal, stdin at end of file
    bug: str | None = None


def launch(case_id: str, *args: str, words: tuple[str, ...], **kw: Any) -> Cli:
    kw.setdefault("files", SCRIPT)
    return Cli(case_id, ("x-launch", *args), kw.pop("code", 2), words, **kw)


def estimate(case_id: str, *args: str, words: tuple[str, ...], code: int, **kw: Any) -> Cli:
    kw.setdefault("files", MODEL)
    return Cli(case_id, ("x-estimate", *args), code, words, **kw)


CLI_CASES = [
    # x-launch flags and X_LAUNCH_* variables
    launch("launch-unknown-flag", "--num_proceses", "2", "train.py", words=("No such option", "--num_proceses")),
    launch("launch-flag-without-value", "--num_processes", words=("--num_processes", "requires an argument")),
    launch("launch-no-target", "--cpu", words=("Missing argument", "TARGET")),
    launch("launch-missing-script", "trian.py", words=("trian.py", "does not exist", "-m trian.py")),
    launch("launch-processes-not-a-number", "--num_processes", "two", "train.py", words=("'two'", "an integer >= 1")),
    launch("launch-processes-zero", "--num_processes", "0", "train.py", words=("--num_processes", "'0'", ">= 1")),
    launch("launch-processes-fraction", "--num_processes", "2.5", "train.py", words=("'2.5'", "integer")),
    launch("launch-port-too-high", "--main_process_port", "70000", "train.py", words=("'70000'", "0 to 65535")),
    launch(
        "launch-port-negative-from-variable",
        "train.py",
        env={"X_LAUNCH_MAIN_PROCESS_PORT": "-1"},
        words=("X_LAUNCH_MAIN_PROCESS_PORT", "'-1'", "0 to 65535"),
    ),
    launch("launch-restarts-negative", "--max_restarts", "-3", "train.py", words=("--max_restarts", "'-3'", ">= 0")),
    launch("launch-precision-unknown", "--mixed_precision", "fp32", "train.py", words=("'fp32'", "no, fp16, bf16")),
    launch(
        "launch-accumulation-zero",
        "--gradient_accumulation_steps",
        "0",
        "train.py",
        words=("--gradient_accumulation_steps", "'0'", ">= 1"),
    ),
    launch("launch-rdzv-unknown", "--rdzv_backend", "etcd", "train.py", words=("'etcd'", "static, c10d")),
    launch(
        "launch-processes-uneven-over-machines",
        *("--num_processes", "3", "--num_machines", "2", "--main_process_ip", "10.0.0.1", "train.py"),
        words=("num_processes 3", "num_machines 2", "multiple"),
    ),
    launch(
        "launch-machine-rank-too-high",
        *("--num_processes", "2", "--num_machines", "2", "--machine_rank", "2", "--main_process_ip", "10.0.0.1"),
        "train.py",
        words=("machine_rank 2", "below num_machines 2"),
    ),
    launch(
        "launch-machines-without-address",
        *("--num_processes", "2", "--num_machines", "2", "train.py"),
        words=("multi-machine", "--main_process_ip"),
    ),
    launch("launch-tee-without-log-dir", "--tee", "train.py", words=("--tee", "--log_dir")),
    launch("launch-tpu-and-cpu", "--tpu", "--cpu", "train.py", words=("--tpu", "--cpu")),
    launch(
        "launch-log-dir-is-a-file",
        *("--num_processes", "2", "--cpu", "--log_dir", "notes.txt", "train.py"),
        files={**SCRIPT, "notes.txt": "my notes\n"},
        words=("--log_dir", "notes.txt"),
    ),
    # x-launch config files (YAML), given by flag, variable or found at a default location
    launch(
        "config-file-missing", "--config_file", "missing.yaml", "train.py", words=("missing.yaml", "config default")
    ),
    launch("config-file-is-a-folder", "--config_file", "tiny", "train.py", files=MODEL, words=("'tiny'", "directory")),
    launch(
        "config-file-from-variable-missing",
        *("config", "show"),
        env={"X_CONFIG_FILE": "missing.yaml"},
        words=("missing.yaml", "does not exist", "config default"),
    ),
    launch(
        "yaml-unclosed-bracket",
        *("--config_file", "bad.yaml", "train.py"),
        files=_yaml("num_processes: [1\n"),
        words=("bad.yaml", "cannot parse", "line 2"),
    ),
    launch(
        "yaml-bad-indentation",
        *("config", "show", "--config_file", "bad.yaml"),
        files=_yaml("num_processes: 2\n  use_cpu: true\n"),
        words=("bad.yaml", "line 2", "mapping values"),
    ),
    launch(
        "yaml-tab-character",
        *("--config_file", "bad.yaml", "train.py"),
        files=_yaml("num_processes: 2\n\tuse_cpu: true\n"),
        words=("bad.yaml", "line 2", "'\\t'"),
    ),
    launch(
        "yaml-not-a-mapping",
        *("--config_file", "bad.yaml", "train.py"),
        files=_yaml("- num_processes: 2\n- use_cpu: true\n"),
        words=("bad.yaml", "key: value", "list"),
    ),
    launch(
        "yaml-not-text",
        *("--config_file", "bad.yaml", "train.py"),
        files={**SCRIPT, "bad.yaml": b"\xff\xfe\x00n\x00u\x00m"},
        words=("cannot read", "bad.yaml"),
    ),
    launch(
        "yaml-unknown-key",
        *("--config_file", "bad.yaml", "train.py"),
        files=_yaml("num_processes: 1\nmixed_precison: bf16\n"),
        words=("bad.yaml, line 2", "'mixed_precison'", "did you mean 'mixed_precision'"),
    ),
    launch(
        "yaml-unknown-section-key",
        *("config", "show", "--config_file", "bad.yaml"),
        files=_yaml("fsdp_config:\n  fsdp_versoin: 2\n"),
        words=("line 2", "'fsdp_versoin'", "did you mean 'fsdp_version'"),
    ),
    launch(
        "yaml-bad-choice",
        *("--config_file", "bad.yaml", "train.py"),
        files=_yaml("num_processes: 1\nmixed_precision: fp32\n"),
        words=("line 2", "'fp32'", "no, fp16, bf16, fp8"),
    ),
    launch(
        "yaml-list-for-a-number",
        *("--config_file", "bad.yaml", "train.py"),
        files=_yaml("num_processes: [1, 2]\n"),
        words=("line 1", "num_processes", "[1, 2]", "an integer"),
    ),
    launch(
        "yaml-boolean-for-a-number",
        *("--config_file", "bad.yaml", "train.py"),
        files=_yaml("num_processes: yes\n"),
        words=("num_processes", "true", "an integer"),
    ),
    launch(
        "yaml-word-for-a-boolean",
        *("--config_file", "bad.yaml", "train.py"),
        files=_yaml("use_cpu: maybe\n"),
        words=("use_cpu", "'maybe'", "true or false"),
    ),
    launch(
        "yaml-port-out-of-range",
        *("--config_file", "bad.yaml", "train.py"),
        files=_yaml("main_process_port: 99999\n"),
        words=("main_process_port", "99999", "0 to 65535"),
    ),
    launch(
        "yaml-section-not-a-mapping",
        *("--config_file", "bad.yaml", "train.py"),
        files=_yaml("deepspeed_config: 3\n"),
        words=("deepspeed_config", "mapping"),
    ),
    launch(
        "yaml-section-value-out-of-range",
        *("--config_file", "bad.yaml", "train.py"),
        files=_yaml("deepspeed_config:\n  zero_stage: 4\n"),
        words=("line 2", "zero_stage", "0 to 3"),
    ),
    launch(
        "yaml-duplicate-key",
        *("config", "show", "--config_file", "bad.yaml"),
        files=_yaml("num_processes: 2\nuse_cpu: true\nnum_processes: 3\n"),
        words=("num_processes", "line 3"),
    ),
    launch(
        "yaml-at-default-location",
        "train.py",
        files={**SCRIPT, "xdg-config/x/launch.yaml": "num_proceses: 2\n"},
        words=("launch.yaml, line 1", "'num_proceses'", "'num_processes'"),
    ),
    launch(
        "yaml-at-accelerate-location-for-test",
        "test",
        files={**SCRIPT, "hf/accelerate/default_config.yaml": "distributed_type: MULTI_TPU\n"},
        words=("default_config.yaml", "'MULTI_TPU'", "MULTI_GPU"),
    ),
    launch(
        "test-processes-zero",
        *("test", "--num_processes", "0"),
        words=("--num_processes", "'0'", ">= 1"),
    ),
    # x-launch config: an existing file is replaced only with consent
    launch(
        "config-default-over-given-file",
        *("config", "default", "--config_file", "mine.yaml"),
        files={"mine.yaml": "num_processes: 4  # my settings\n"},
        words=("mine.yaml", "already exists", "--force"),
    ),
    launch(
        "config-default-over-default-location",
        *("config", "default"),
        files={"xdg-config/x/launch.yaml": "num_processes: 4  # my settings\n"},
        words=("launch.yaml", "already exists", "--force"),
    ),
    launch(
        "config-questions-declined",
        *("config", "--config_file", "mine.yaml"),
        files={"mine.yaml": "num_processes: 4  # my settings\n"},
        stdin="n\n",
        code=1,
        words=("Aborted",),
    ),
    launch(
        "config-questions-without-a-terminal",
        *("config", "--config_file", "mine.yaml"),
        files={"mine.yaml": "num_processes: 4  # my settings\n"},
        stdin="",  # the question is asked (on stdout); stdin ends at once, as in a script
        code=1,
        words=("mine.yaml", "--force"),
    ),
    launch(
        "config-default-parent-is-a-file",
        *("config", "default", "--config_file", "notes.txt/launch.yaml"),
        files={"notes.txt": "my notes\n"},
        words=("notes.txt", "not a directory"),
    ),
    # x-estimate options (usage errors, exit 2)
    estimate("estimate-unknown-dtype", "tiny", "--dtypes", "float64", code=2, words=("'float64'", "'float32'")),
    estimate("estimate-unknown-dtype-in-list", "tiny", "--dtypes=float16,fp8", code=2, words=("'fp8'", "'bfloat16'")),
    # "10Gb" and "10G" are sizes since Accelerate's reading was adopted (gigabits; GiB): 'b' alone is not
    estimate("estimate-size-in-bits", "tiny", "--fits", "8b", code=2, words=("'8b'", "bits", "GB")),
    estimate("estimate-size-unknown-unit", "tiny", "--fits", "10GX", code=2, words=("'10GX'", "unknown unit", "GiB")),
    estimate("estimate-size-negative", "tiny", "--fits", "-5GB", code=2, words=("'-5GB'", "accepted forms")),
    estimate("estimate-gpus-not-a-number", "tiny", "--num-gpus", "two", code=2, words=("--num-gpus", "'two'")),
    estimate("estimate-batch-size-zero", "tiny", "--batch-size", "0", code=2, words=("--batch-size", "x>=1")),
    # --seq_len is Accelerate's spelling and works (as every underscore spelling); a misspelling does not.
    estimate("estimate-unknown-option", "tiny", "--seq-lenn", "8", code=2, words=("--seq-lenn", "'--seq-len'")),
    estimate("estimate-extra-argument", "tiny", "again", code=2, words=("unexpected extra argument", "again")),
    # x-estimate models (exit 1)
    estimate("estimate-path-missing", "./tinny", code=1, words=("./tinny", "no such file or folder")),
    estimate(
        "estimate-folder-without-config",
        "weights",
        files={"weights/model.safetensors": b"\0" * 64},
        code=1,
        words=("weights has no config.json", "save_pretrained"),
    ),
    estimate(
        "estimate-config-malformed-json",
        "tiny",
        files={"tiny/config.json": '{"model_type": "llama", "hidden_size": 64,\n'},
        code=1,
        words=("config.json", "not valid JSON", "line 2"),
    ),
    estimate(
        "estimate-file-not-a-config",
        "notes.txt",
        files={"notes.txt": "my notes\n"},
        code=1,
        words=("notes.txt", "not valid JSON", "model folder"),
    ),
    estimate(
        "estimate-config-without-model-type",
        "tiny",
        files={"tiny/config.json": json.dumps({k: v for k, v in TINY_LLAMA.items() if k != "model_type"})},
        code=1,
        words=("tiny", "model_type"),
    ),
    estimate(
        "estimate-offline-id-not-cached",
        "some-org/some-model",
        files={},
        code=1,
        words=("some-org/some-model", "HF_HUB_OFFLINE", "local folder"),
    ),
    estimate(
        "estimate-config-zero-heads",
        "tiny",
        files=_llama(num_attention_heads=0),
        code=1,
        words=("num_attention_heads",),
    ),
    estimate(
        "estimate-config-heads-do-not-divide",
        "tiny",
        files=_llama(num_attention_heads=5),
        code=1,
        words=("not a multiple", "attention heads"),
    ),
]


def _params(cases: list[Any]) -> list[Any]:
    assert len({c.id for c in cases}) == len(cases), "case ids must be unique"
    return [
        pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=c.bug)] if c.bug else []) for c in cases
    ]


def _snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root``: relative path -> sha256 of its bytes."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() or path.is_symlink()
    }


def _write(root: Path, files: Mapping[str, str | bytes]) -> None:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data)


def _clean_env(root: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """No launcher, rank, SLURM or Hugging Face variables from outside; every home inside ``root``."""
    names = (env.PREFIX, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_", "SLURM_", "HF_", "XDG_")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(names) and k != "HOME"}
    homes = {
        "HOME": "home",
        "XDG_CONFIG_HOME": "xdg-config",
        "XDG_CACHE_HOME": "xdg-cache",
        "XDG_DATA_HOME": "xdg-data",
        "XDG_STATE_HOME": "xdg-state",
        "HF_HOME": "hf",
        "TMPDIR": "tmp",
    }
    for name, folder in homes.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        clean[name] = str(root / folder)
    clean.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    clean.update(extra or {})
    return clean


def _script(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def _nonempty_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("case", _params(CLI_CASES))
def test_cli_bad_input_is_one_clear_line_and_changes_no_file(case: Cli, tmp_path: Path) -> None:
    environ = _clean_env(tmp_path, case.env)
    _write(tmp_path, case.files)
    before = _snapshot(tmp_path)
    out = subprocess.run(
        [_script(case.argv[0]), *case.argv[1:]],
        cwd=tmp_path,
        env=environ,
        input=case.stdin,
        stdin=subprocess.DEVNULL if case.stdin is None else None,
        capture_output=True,
        text=True,
        timeout=180,
    )
    shown = f"exit {out.returncode}\nstdout: {out.stdout[-2000:]}\nstderr: {out.stderr[-3000:]}"
    assert "Traceback" not in out.stderr + out.stdout, shown
    assert out.returncode == case.code, shown
    lines = _nonempty_lines(out.stderr)
    assert len(lines) == 1, shown
    missing = [w for w in case.words if w.lower() not in lines[0].lower()]
    assert not missing, f"{missing} not in {lines[0]!r}"
    if case.stdin is None:  # a question goes to stdout; otherwise nothing but the error is printed
        assert out.stdout == "", shown
    after = _snapshot(tmp_path)
    assert after == before, f"files changed: {sorted(set(after.items()) ^ set(before.items()))}"


def test_x_estimate_debug_shows_the_traceback(tmp_path: Path) -> None:
    environ = _clean_env(tmp_path)
    _write(tmp_path, {"weights/model.safetensors": b"\0" * 64})
    before = _snapshot(tmp_path)
    argv = [_script("x-estimate"), "weights"]
    plain = subprocess.run(argv, cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120)
    debug = subprocess.run([*argv, "--debug"], cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120)
    assert plain.returncode == debug.returncode == 1, (plain.stderr, debug.stderr)
    assert "Traceback" not in plain.stderr
    assert "Traceback (most recent call last)" in debug.stderr
    assert "EstimateError: weights has no config.json" in debug.stderr
    assert _snapshot(tmp_path) == before


# --- Python entry points ----------------------------------------------------------------------

CKPT = 'save(mlp(), "ckpt/model.safetensors")'
MINE = 'write("offload/mine.txt", "my notes")'
SHARDED = """
state = mlp().state_dict()
save_tensors({k: state[k] for k in ("0.weight", "0.bias")}, "ckpt/model-00001-of-00002.safetensors")
names = {k: f"model-0000{1 + k.startswith('2')}-of-00002.safetensors" for k in state}
write("ckpt/model.safetensors.index.json", json.dumps({"metadata": {}, "weight_map": names}))
"""
SAVED_STATE = """
acc = Accelerator(cpu=True)
acc.prepare(nn.Linear(4, 4))
acc.save_state("ckpt")
"""


@dataclass(frozen=True)
class Api:
    id: str
    call: str  # an expression, run in the case's own folder
    types: tuple[str, ...]  # the exception must be (a subclass of) one of these
    words: tuple[str, ...]  # each must appear in its message (case-insensitive)
    setup: str = ""  # statements that build the case's files, run before the folder is snapshot
    env: Mapping[str, str] = field(default_factory=dict)
    bug: str | None = None


LOAD = "load_checkpoint_and_dispatch"
QUIET = "show_progress=False"

API_CASES = [
    # x-bigmodel sizes and dtypes
    Api(
        "bigmodel-max-memory-in-bits",
        'infer_auto_device_map(mlp(), max_memory={"cpu": "8b"})',
        ("ValueError",),
        ("'8b'", "bits", "GiB"),
    ),
    Api(
        "bigmodel-max-memory-unknown-unit",
        f'{LOAD}(empty(), "ckpt", device_map="auto", max_memory={{"cpu": "10GX"}}, {QUIET})',
        ("ValueError",),
        ("'10GX'", "unknown unit", "GiB"),
        setup=CKPT,
    ),
    Api(
        "bigmodel-max-memory-negative",
        'get_max_memory({"cpu": -1})',
        ("ValueError",),
        ("-1", "negative"),
    ),
    Api(
        "bigmodel-max-memory-unknown-device",
        'infer_auto_device_map(mlp(), max_memory={"gpu0": "1GB", "cpu": "1GB"})',
        ("ValueError",),
        ("'gpu0'", "cpu, disk"),
    ),
    Api(
        "bigmodel-dtype-unknown",
        f'{LOAD}(empty(), "ckpt", dtype="float17", {QUIET})',
        ("ValueError",),
        ("'float17'", "bfloat16"),
        setup=CKPT,
    ),
    Api(
        "bigmodel-dtype-unknown-for-planning",
        'infer_auto_device_map(mlp(), max_memory={"cpu": "1GB"}, dtype="fp12")',
        ("ValueError",),
        ("'fp12'", "float16"),
    ),
    # x-bigmodel device maps
    Api(
        "bigmodel-impossible-budget",
        'infer_auto_device_map(mlp(), max_memory={"cpu": "100B"})',
        ("ValueError",),
        ("cannot place", "'0'", "100 B", "'disk' budget"),
    ),
    Api(
        "bigmodel-impossible-budget-with-disk",
        f'{LOAD}(empty(), "ckpt", device_map="auto", max_memory={{"cpu": "100B", "disk": "100B"}}, '
        f'offload_folder="offload", {QUIET})',
        ("ValueError",),
        ("cannot place", "'0'", "100 B"),
        setup=CKPT + "\n" + MINE,
    ),
    Api(
        "bigmodel-strategy-unknown",
        f'{LOAD}(empty(), "ckpt", device_map="fastest", {QUIET})',
        ("ValueError",),
        ("'fastest'", "auto, balanced"),
        setup=CKPT,
    ),
    Api(
        "bigmodel-map-unknown-module",
        'dispatch_model(mlp(), {"0": "cpu", "2": "cpu", "2.wieght": "cpu"})',
        ("ValueError",),
        ("'2.wieght'", "not a module", "did you mean '2.weight'"),
    ),
    Api(
        "bigmodel-map-unknown-module-with-offload",
        f'{LOAD}(empty(), "ckpt", device_map={{"0": "disk", "2": "cpu", "encoder": "cpu"}}, '
        f'offload_folder="offload", {QUIET})',
        ("ValueError",),
        ("'encoder'", "not a module"),
        setup=CKPT + "\n" + MINE,
    ),
    Api(
        "bigmodel-map-leaves-tensors-unplaced",
        'dispatch_model(mlp(), {"0": "cpu"})',
        ("ValueError",),
        ("2.weight", "2.bias", "add them"),
    ),
    Api(
        "bigmodel-map-leaves-tensors-unplaced-when-loading",
        f'{LOAD}(empty(), "ckpt", device_map={{"0": "cpu"}}, {QUIET})',
        ("ValueError",),
        ("2.weight", "2.bias", "add them"),
        setup=CKPT,
    ),
    Api(
        "bigmodel-map-splits-tied-weights",
        f'{LOAD}(empty(Tied), "tied", device_map={{"emb": "cpu", "mid": "cpu", "head": "disk"}}, {QUIET})',
        ("ValueError",),
        ("emb.weight", "head.weight", "one device"),
        setup='save(Tied(), "tied/model.safetensors")',
    ),
    Api(
        "bigmodel-map-unknown-device",
        f'{LOAD}(empty(), "ckpt", device_map={{"": "gpu"}}, {QUIET})',
        ("ValueError",),
        ("'gpu'", "device_map"),
        setup=CKPT,
    ),
    # x-bigmodel checkpoints
    Api(
        "bigmodel-checkpoint-missing",
        f'{LOAD}(empty(), "no-such-checkpoint", {QUIET})',
        ("ValueError",),
        ("'no-such-checkpoint'", "does not exist"),
    ),
    Api(
        "bigmodel-checkpoint-folder-without-weights",
        f'{LOAD}(empty(), "ckpt", {QUIET})',
        ("ValueError",),
        ("'ckpt'", "holds no", ".safetensors"),
        setup='write("ckpt/README.md", "weights go here")',
    ),
    Api(
        "bigmodel-safetensors-truncated",
        f'{LOAD}(empty(), "ckpt", {QUIET})',
        ("ValueError",),
        ("model.safetensors", "truncated", "again"),
        setup=CKPT + '\ntruncate("ckpt/model.safetensors", 20)',
    ),
    Api(
        "bigmodel-safetensors-corrupt-header",
        f'{LOAD}(empty(), "ckpt", {QUIET})',
        ("ValueError",),
        ("model.safetensors", "corrupt"),
        setup='write("ckpt/model.safetensors", b"\\xff" * 8 + b"{}")',
    ),
    Api(
        "bigmodel-index-names-missing-shard",
        f'{LOAD}(empty(), "ckpt", {QUIET})',
        ("ValueError",),
        ("'model-00002-of-00002.safetensors'", "does not exist"),
        setup=SHARDED,
    ),
    Api(
        "bigmodel-index-malformed",
        f'{LOAD}(empty(), "ckpt", {QUIET})',
        ("ValueError",),
        ("model.safetensors.index.json", "weight_map"),
        setup='write("ckpt/model.safetensors.index.json", \'{"weight_map": \')',
    ),
    Api(
        "bigmodel-shape-mismatch",
        f'{LOAD}(empty(), "ckpt", {QUIET})',
        ("ValueError",),
        ("shape mismatch", "2.bias", "(5,)", "(4,)"),
        setup='save(mlp(5), "ckpt/model.safetensors")',
    ),
    Api(
        "bigmodel-checkpoint-lacks-tensors",
        f"{LOAD}(empty(lambda: nn.Sequential(*mlp(), nn.Linear(4, 4))), 'ckpt', {QUIET})",
        ("ValueError",),
        ("3.weight", "allow_missing_keys=True"),
        setup=CKPT,
    ),
    Api(
        "bigmodel-bin-to-disk-without-offload-folder",
        f'{LOAD}(empty(), "ckpt", device_map={{"": "disk"}}, {QUIET})',
        ("ValueError",),
        ("'disk'", "offload_folder"),
        setup='os.makedirs("ckpt")\ntorch.save(mlp().state_dict(), "ckpt/pytorch_model.bin")',
    ),
    Api(
        "bigmodel-bin-with-pickled-object",
        f'{LOAD}(empty(), "ckpt", {QUIET})',
        ("ValueError",),
        ("pytorch_model.bin", "safetensors"),
        setup='import fractions\nos.makedirs("ckpt")\ntorch.save({**mlp().state_dict(), "n": fractions.Fraction(1, 3)}, "ckpt/pytorch_model.bin")',
    ),
    # x-runtime
    Api(
        "runtime-precision-unknown",
        'Accelerator(mixed_precision="fp32", cpu=True)',
        ("ValueError",),
        ("'fp32'", "no, fp16, bf16"),
    ),
    Api(
        "runtime-fsdp-without-process-group",
        "Accelerator(cpu=True)",
        ("ValueError",),
        ("FSDP needs a process group", "x-launch --num_processes N"),
        env={"X_DISTRIBUTED_TYPE": "FSDP"},
    ),
    Api(
        "runtime-plugin-contradicts-launcher",
        "Accelerator(cpu=True, fsdp_plugin=x_runtime.FullyShardedDataParallelPlugin())",
        ("ValueError",),
        ("distributed_type=DEEPSPEED", "fsdp_plugin"),
        env={"X_DISTRIBUTED_TYPE": "DEEPSPEED"},
    ),
    Api(
        "runtime-fsdp-local-state-dict",
        'x_runtime.FullyShardedDataParallelPlugin(state_dict_type="LOCAL_STATE_DICT")',
        ("ValueError",),
        ("LOCAL_STATE_DICT", "SHARDED_STATE_DICT"),
    ),
    Api(
        "runtime-xla-without-torch-xla",
        "Accelerator()",
        ("ValueError",),
        ("distributed_type XLA needs torch_xla", "pip install torch_xla"),
        env={"X_DISTRIBUTED_TYPE": "XLA"},
    ),
    Api(
        "runtime-xla-and-cpu",
        "Accelerator(cpu=True)",
        ("ValueError",),
        ("X_DISTRIBUTED_TYPE=XLA", "cpu=True", "drop one of them"),
        env={"X_DISTRIBUTED_TYPE": "XLA"},
    ),
    Api(
        "runtime-fp8-on-cpu",
        'Accelerator(mixed_precision="fp8", cpu=True)',
        ("ValueError",),
        ("'fp8'", "compute capability", "on cpu", "'bf16'"),
    ),
    Api(
        "runtime-deepspeed-config-not-json",
        'x_runtime.DeepSpeedPlugin(hf_ds_config="ds.json")',
        ("ValueError",),
        ("ds.json", "line 1", "not valid JSON"),
        setup='open("ds.json", "w").write("{zero: 3")',
    ),
    Api(
        "runtime-accumulation-zero",
        "Accelerator(gradient_accumulation_steps=0)",
        ("ValueError",),
        ("gradient_accumulation_steps", ">= 1", "got 0"),
    ),
    Api(
        "runtime-accumulation-from-variable",
        "Accelerator()",
        ("ValueError",),
        ("X_GRADIENT_ACCUMULATION_STEPS", "'0'", ">= 1"),
        env={"X_GRADIENT_ACCUMULATION_STEPS": "0"},
    ),
    Api(
        "runtime-use-cpu-from-variable",
        "Accelerator()",
        ("ValueError",),
        ("X_USE_CPU", "'maybe'", "boolean"),
        env={"X_USE_CPU": "maybe"},
    ),
    Api(
        "runtime-accumulation-string",
        'Accelerator(gradient_accumulation_steps="4")',
        ("TypeError", "ValueError"),
        ("gradient_accumulation_steps", "'4'"),
    ),
    Api(
        "runtime-accumulation-fraction",
        "Accelerator(gradient_accumulation_steps=2.5).gradient_accumulation_steps",
        ("TypeError", "ValueError"),
        ("gradient_accumulation_steps", "2.5"),
    ),
    Api(
        "runtime-rng-type-unknown",
        'Accelerator(rng_types=["numpy"])',
        ("ValueError",),
        ("'numpy'", "torch, cuda"),
    ),
    Api(
        "runtime-save-model-onto-a-file",
        '(lambda a: a.save_model(a.prepare(nn.Linear(2, 2)), "notes.txt"))(Accelerator(cpu=True))',
        ("ValueError",),
        ("notes.txt", "is a file", "directory"),
        setup='write("notes.txt", "my notes")',
    ),
    Api(
        "runtime-save-model-shard-size-in-bits",
        '(lambda a: a.save_model(a.prepare(nn.Linear(2, 2)), "out", max_shard_size="8b"))(Accelerator(cpu=True))',
        ("ValueError",),
        ("'8b'", "bits"),
    ),
    Api(
        "runtime-save-state-onto-a-file",
        'Accelerator(cpu=True).save_state("notes.txt")',
        ("ValueError",),
        ("notes.txt", "file"),
        setup='write("notes.txt", "my notes")',
    ),
    Api(
        "runtime-load-state-not-a-checkpoint",
        'Accelerator(cpu=True).load_state("ckpt")',
        ("FileNotFoundError", "ValueError"),
        ("ckpt", "x_checkpoint.json"),
        setup='write("ckpt/notes.txt", "my notes")',
    ),
    Api(
        "runtime-load-state-truncated-weights",
        '(lambda a: (a.prepare(nn.Linear(4, 4)), a.load_state("ckpt")))(Accelerator(cpu=True))',
        ("ValueError",),
        ("model.safetensors", "truncated"),
        setup=SAVED_STATE + 'truncate("ckpt/model.safetensors", 10)',
    ),
    Api(
        "runtime-load-state-shape-mismatch",
        '(lambda a: (a.prepare(nn.Linear(4, 3)), a.load_state("ckpt")))(Accelerator(cpu=True))',
        ("ValueError", "RuntimeError"),
        ("weight", "[3, 4]", "[4, 4]"),
        setup=SAVED_STATE,
    ),
]


@pytest.fixture(scope="module")
def api_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, Any], dict, dict]]:
    """Every API case run once: {id: (result, files before, files after)}."""
    base = tmp_path_factory.mktemp("bad-input-api")
    root = base / "cases"
    spec = {
        "root": str(root),
        "cases": {c.id: {"setup": c.setup, "call": c.call, "env": dict(c.env)} for c in API_CASES},
    }
    cases_file = base / "cases.json"
    cases_file.write_text(json.dumps(spec, indent=1))
    environ = _clean_env(base / "env")
    setup = subprocess.run(
        [sys.executable, str(DRIVER), "setup", str(cases_file)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert setup.returncode == 0, setup.stderr[-3000:]
    before = {c.id: _snapshot(root / c.id) for c in API_CASES}
    results_file = base / "results.json"
    run = subprocess.run(
        [sys.executable, str(DRIVER), "run", str(cases_file), str(results_file)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(results_file.read_text())
    return {c.id: (results[c.id], before[c.id], _snapshot(root / c.id)) for c in API_CASES}


@pytest.mark.parametrize("case", _params(API_CASES))
def test_api_bad_input_raises_one_clear_line_and_changes_no_file(
    case: Api, api_runs: dict[str, tuple[dict[str, Any], dict, dict]]
) -> None:
    result, before, after = api_runs[case.id]
    assert after == before, f"files changed: {sorted(set(after.items()) ^ set(before.items()))}"
    assert "returned" not in result, f"accepted: returned {result.get('returned')}"
    assert set(case.types) & set(result["mro"]), f"{result['type']} is none of {case.types}: {result['message']}"
    message = result["message"]
    assert len(_nonempty_lines(message)) == 1 and "\n" not in message.strip(), f"not one line: {message!r}"
    missing = [w for w in case.words if w.lower() not in message.lower()]
    assert not missing, f"{missing} not in {result['type']}: {message!r}"
