"""The summary cache under $XDG_CACHE_HOME/x-estimate: hits, --no-cache, corruption, remote code."""

from __future__ import annotations

import json
import textwrap

import pytest

from x_estimate.model.summary import SUMMARY_FORMAT

# Runs x_estimate.cli.main in a fresh interpreter, then reports which heavy modules it imported.
PROBE = textwrap.dedent(
    """
    import sys
    from x_estimate.cli import main
    try:
        main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code or 0
    heavy = sorted(m for m in ("torch", "transformers", "timm") if m in sys.modules)
    print("HEAVY=" + ",".join(heavy), file=sys.stderr)
    print("RAN=" + str("x_estimate.report.table" in sys.modules), file=sys.stderr)
    sys.exit(code)
    """
)


def _entries(summary_cache):
    return sorted(summary_cache.glob("*.json")) if summary_cache.exists() else []


def test_second_run_hits_the_cache_with_identical_output(model_dir, configs, cli, summary_cache) -> None:
    folder = model_dir(configs.gpt2())
    assert _entries(summary_cache) == []
    first = cli(folder, "--seq-len", "32")
    assert first.code == 0, first.err
    [entry] = _entries(summary_cache)
    assert len(entry.stem) == 64  # a sha256 hex digest
    saved = json.loads(entry.read_text())
    assert saved["class_name"] == "GPT2LMHeadModel"
    assert saved["format"] == SUMMARY_FORMAT
    second = cli(folder, "--seq-len", "32")
    assert second.out == first.out
    assert _entries(summary_cache) == [entry]


def test_cache_is_read_and_no_cache_rebuilds(model_dir, configs, cli, summary_cache) -> None:
    folder = model_dir(configs.gpt2())
    cli(folder, "--dtypes", "float32")
    [entry] = _entries(summary_cache)
    # Mark the cached summary: a run that reads the cache prints the mark, a rebuild does not.
    saved = json.loads(entry.read_text())
    saved["class_name"] = "FromTheCache"
    entry.write_text(json.dumps(saved))

    assert "FromTheCache (transformers" in cli(folder, "--dtypes", "float32").out
    rebuilt = cli(folder, "--dtypes", "float32", "--no-cache")
    assert rebuilt.code == 0
    assert "GPT2LMHeadModel (transformers" in rebuilt.out
    assert "FromTheCache" not in rebuilt.out


def test_same_config_in_another_folder_shares_the_entry(model_dir, configs, cli, summary_cache) -> None:
    one = cli(model_dir(configs.gpt2(), name="one"), "--json").json
    two = cli(model_dir(configs.gpt2(), name="two"), "--json").json
    assert len(_entries(summary_cache)) == 1
    assert one["rows"] == two["rows"]
    # A different config, or --base-model, is another entry.
    cli(model_dir(configs.gpt2(n_layer=1), name="three"), "--json")
    cli(model_dir(configs.gpt2(), name="four"), "--json", "--base-model")
    assert len(_entries(summary_cache)) == 3


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b'{"library": "transformers", "class_name": "GPT2',
        b"\xff\xfe\x00garbage\x81",
        b'{"format": 999, "library": "transformers"}',
        b'{"format": 1}',
        b"[]",
        b"null",
        b'"just a string"',
    ],
    ids=["empty", "truncated", "binary", "other-format", "missing-fields", "list", "null", "string"],
)
def test_corrupt_cache_entry_is_ignored(content, model_dir, configs, cli, summary_cache) -> None:
    folder = model_dir(configs.gpt2())
    reference = cli(folder, "--json")
    [entry] = _entries(summary_cache)
    entry.write_bytes(content)
    again = cli(folder, "--json")
    assert again.code == 0, again.err
    assert again.out == reference.out
    # The rebuilt summary replaces the corrupt one.
    assert json.loads(entry.read_text())["class_name"] == "GPT2LMHeadModel"


def test_unwritable_cache_is_not_an_error(model_dir, configs, cli, isolated_caches) -> None:
    blocker = isolated_caches["XDG_CACHE_HOME"]
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("a file where the cache folder should be")
    result = cli(model_dir(configs.gpt2()), "--dtypes", "float32")
    assert result.code == 0, result.err
    assert "GPT2LMHeadModel" in result.out


def test_timm_registry_name_is_cached(cli, summary_cache) -> None:
    first = cli("resnet18", "--dtypes", "float32")
    assert len(_entries(summary_cache)) == 1
    assert cli("resnet18", "--dtypes", "float32").out == first.out
    assert "from timm registry" in first.out


def test_warm_run_of_a_local_folder_imports_neither_torch_nor_transformers(
    model_dir, configs, cli, run_python, summary_cache
) -> None:
    folder = model_dir(configs.gpt2())
    cold = cli(folder, "--seq-len", "16")
    assert len(_entries(summary_cache)) == 1
    warm = run_python(PROBE, folder, "--seq-len", "16")
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout == cold.out
    assert "RAN=True" in warm.stderr
    assert "HEAVY=\n" in warm.stderr


def test_warm_run_of_a_timm_name_imports_no_torch_or_timm(cli, run_python, summary_cache) -> None:
    cold = cli("resnet18", "--dtypes", "float32", "float16")
    warm = run_python(PROBE, "resnet18", "--dtypes", "float32", "float16")
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout == cold.out
    assert "HEAVY=\n" in warm.stderr


REMOTE_CONFIG = """
from transformers import PretrainedConfig


class TinyRemoteConfig(PretrainedConfig):
    model_type = "tiny-remote"

    def __init__(self, width=16, **kwargs):
        self.width = width
        super().__init__(**kwargs)
"""

REMOTE_MODEL = """
import torch
from transformers import PreTrainedModel

from .configuration_tiny import TinyRemoteConfig


class TinyRemoteModel(PreTrainedModel):
    config_class = TinyRemoteConfig

    def __init__(self, config):
        super().__init__(config)
        self.fc = torch.nn.Linear(config.width, config.width)
        self.post_init()

    def forward(self, x):
        return self.fc(x)
"""


@pytest.mark.parametrize("where", ["local folder", "Hugging Face cache"])
def test_trust_remote_code_runs_the_code_and_never_caches(
    where, tmp_path, hub_cache, run_script, summary_cache
) -> None:
    config = {
        "model_type": "tiny-remote",
        "width": 16,
        "architectures": ["TinyRemoteModel"],
        "auto_map": {
            "AutoConfig": "configuration_tiny.TinyRemoteConfig",
            "AutoModel": "modeling_tiny.TinyRemoteModel",
        },
    }
    if where == "local folder":
        model = tmp_path / "remote"
        model.mkdir()
        folder = model
        (folder / "config.json").write_text(json.dumps(config))
    else:
        model = "acme/tiny-remote"
        folder = hub_cache(model, config)
    (folder / "configuration_tiny.py").write_text(REMOTE_CONFIG)
    (folder / "modeling_tiny.py").write_text(REMOTE_MODEL)
    # One run in a fresh interpreter (remote code is imported from a modules cache under $HF_HOME).
    out = run_script(model, "--trust_remote_code", "--dtypes", "float32", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert (data["class"], data["source"]) == ("TinyRemoteModel", where)
    assert data["parameters"] == 16 * 16 + 16
    assert data["rows"][0]["total_bytes"] == 4 * (16 * 16 + 16)
    assert _entries(summary_cache) == []


def test_kv_cache_is_measured_only_once_a_run_asks_for_seq_len(model_dir, configs, cli, summary_cache) -> None:
    # The meta prefill that measures the cache costs up to seconds: a first estimate without
    # --seq-len skips it, and the first run with --seq-len measures and replaces the entry.
    folder = model_dir(configs.gpt2())
    assert cli(folder, "--json").code == 0
    [entry] = _entries(summary_cache)
    saved = json.loads(entry.read_text())
    assert saved["kv_measured"] is False and saved["attention"]["kv"] is None
    with_seq = cli(folder, "--seq-len", "32", "--json").json
    saved = json.loads(entry.read_text())
    assert saved["kv_measured"] is True and saved["attention"]["kv"] is not None
    fresh = cli(folder, "--seq-len", "32", "--json", "--no-cache").json
    assert with_seq["rows"] == fresh["rows"]
    assert with_seq["rows"][0]["kv_cache_bytes"] > 0
