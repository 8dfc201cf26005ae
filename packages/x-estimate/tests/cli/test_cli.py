"""The installed ``x-estimate`` console script."""

from __future__ import annotations

import importlib.metadata
import subprocess

import pytest

import x_estimate


@pytest.fixture(scope="module")
def exe(console_script) -> str:
    return console_script("x-estimate")


def test_version_matches_distribution_metadata(exe: str) -> None:
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"x-estimate, version {importlib.metadata.version('x-estimate')}"
    assert x_estimate.__version__ == importlib.metadata.version("x-estimate")


def test_no_arguments_prints_help_instead_of_doing_nothing(exe: str) -> None:
    out = subprocess.run([exe], capture_output=True, text=True)
    assert out.returncode in (0, 2)  # click >= 8.2 exits 2 for no_args_is_help
    assert "Usage: x-estimate" in out.stdout + out.stderr


def test_declared_dependencies_import_in_this_venv() -> None:
    # The estimator builds skeletons with transformers (and timm when the extra is installed)
    # on the meta device: prove the pinned set installs and imports together.
    import huggingface_hub
    import timm
    import torch
    import transformers

    with torch.device("meta"):
        model = timm.create_model("resnet18", pretrained=False)
    assert sum(p.numel() for p in model.parameters()) == 11_689_512
    assert transformers.__version__ and huggingface_hub.__version__


def test_help_lists_the_options(exe: str) -> None:
    out = subprocess.run([exe, "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for option in ("--library_name", "--dtypes", "--base-model", "--optimizer", "--precision", "--shard"):
        assert option in out.stdout
    assert "x-estimate resnet50 --library_name timm" in out.stdout


def test_dtypes_values_before_the_model(model_dir, configs, cli) -> None:
    # Accelerate's multi-value spelling placed before MODEL: the first word after the dtypes
    # that is no dtype is the model, not one more (invalid) dtype.
    folder = model_dir(configs.gpt2())
    result = cli("--dtypes", "float32", "float16", folder, "--json")
    assert result.code == 0, result.err
    assert [r["dtype"] for r in result.json["rows"]] == ["float32", "float16"]
    assert result.json["model"] == str(folder)
    # A first word that is no dtype is still the option's value, and refused as such.
    bad = cli("--dtypes", "float64", folder)
    assert bad.code == 2
    assert "Invalid value for '--dtypes': 'float64' is not one of" in bad.err


def test_x_launchs_short_dtype_names_are_the_long_ones(model_dir, configs, cli) -> None:
    folder = model_dir(configs.gpt2())
    long = cli(folder, "--dtypes", "bfloat16", "float16", "float32", "--json")
    short = cli("--dtypes", "bf16", "fp16", "fp32", folder, "--json")
    assert short.code == 0, short.err
    assert short.json["rows"] == long.json["rows"]
    assert [r["dtype"] for r in short.json["rows"]] == ["bfloat16", "float16", "float32"]
