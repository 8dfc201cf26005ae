"""x-bigmodel installs alone with what it declares, and says which version it is."""

from __future__ import annotations

import importlib.metadata
import importlib.resources

import x_bigmodel


def test_version_matches_distribution_metadata() -> None:
    assert x_bigmodel.__version__ == importlib.metadata.version("x-bigmodel")


def test_ships_typed_marker() -> None:
    assert importlib.resources.files("x_bigmodel").joinpath("py.typed").is_file()


def test_declared_dependencies_work_in_this_venv(tmp_path) -> None:
    # torch and safetensors are the whole runtime footprint: round-trip a tensor through both.
    import torch
    from safetensors.torch import load_file, save_file

    path = tmp_path / "t.safetensors"
    save_file({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}, str(path))
    assert torch.equal(load_file(str(path))["w"], torch.arange(6.0).reshape(2, 3))
