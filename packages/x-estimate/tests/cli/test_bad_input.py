"""Bad input through the installed console script: one line on stderr, the right exit code,
no traceback, and nothing written into the model folder."""

from __future__ import annotations

import json
import textwrap

import pytest

ARGUMENT_ERRORS = [
    # (extra args, fragment of the one stderr line)
    (
        ["--dtypes", "float64"],
        "Invalid value for '--dtypes': 'float64' is not one of 'float32', 'float16', 'bfloat16', 'int8', 'int4'.",
    ),
    (
        ["--optimizer", "adam"],
        "Invalid value for '--optimizer': 'adam' is not one of 'adamw', 'adamw8bit', 'sgd', 'adafactor'.",
    ),
    (
        ["--precision", "fp8"],
        "Invalid value for '--precision': 'fp8' is not one of 'auto', 'fp32', 'mixed-bf16', 'mixed-fp16', 'bf16'.",
    ),
    (
        ["--shard", "zero4"],
        "Invalid value for '--shard': 'zero4' is not one of 'none', 'zero1', 'zero2', 'zero3', 'fsdp'.",
    ),
    (["--int4", "q4"], "Invalid value for '--int4': 'q4' is not one of 'nf4', 'nf4-dq', 'gptq', 'awq'."),
    (["--library_name", "keras"], "'keras' is not one of 'transformers', 'timm'."),
    (["--fits", "lots"], "Invalid value for '--fits': invalid size 'lots': accepted forms:"),
    (["--fits", "8b"], "'b' alone is bits, not a memory size"),
    (["--num-gpus", "0"], "Invalid value for '--num-gpus' / '--gpus': 0 is not in the range x>=1."),
    (["--seq-len", "0"], "Invalid value for '--seq-len': 0 is not in the range x>=1."),
    (["--frobnicate"], "--frobnicate"),
]


@pytest.fixture
def good_folder(model_dir, configs):
    return model_dir(configs.gpt2(), name="good")


def _assert_one_line_error(out, code: int, fragment: str) -> str:
    assert out.returncode == code, (out.stdout, out.stderr)
    assert out.stdout == ""
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("Error: ")
    assert fragment in lines[0]
    return lines[0]


@pytest.mark.parametrize(("args", "fragment"), ARGUMENT_ERRORS, ids=[a[0] for a, _ in ARGUMENT_ERRORS])
def test_bad_option_value_exits_2_with_the_valid_choices(
    args, fragment, good_folder, run_script, snapshot_tree
) -> None:
    before = snapshot_tree(good_folder)
    line = _assert_one_line_error(run_script(good_folder, *args), 2, fragment)
    assert line.endswith("(see x-estimate --help)")
    assert snapshot_tree(good_folder) == before


def _no_config(tmp_path):
    folder = tmp_path / "no-config"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"\0" * 64)
    return folder, [folder], f"{folder} has no config.json; pass the folder a model was saved to (save_pretrained)"


def _invalid_json(tmp_path):
    folder = tmp_path / "invalid-json"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "gpt2",')
    return folder, [folder], f"{folder / 'config.json'} is not valid JSON ("


def _json_list(tmp_path):
    folder = tmp_path / "json-list"
    folder.mkdir()
    (folder / "config.json").write_text("[1, 2]")
    return folder, [folder], "holds a JSON list, not a model config object"


def _remote_code(tmp_path):
    folder = tmp_path / "remote-code"
    folder.mkdir()
    config = {"model_type": "custom-thing", "auto_map": {"AutoConfig": "configuration_x.XConfig"}}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "configuration_x.py").write_text("raise SystemExit('this code must not run')\n")
    return folder, [folder], "read that code, then pass --trust_remote_code to run it"


def _unknown_model_type(tmp_path):
    folder = tmp_path / "unknown-type"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "no-such-model-type"}))
    return folder, [folder], f"{folder}: transformers cannot read its config:"


def _binary_config(tmp_path):
    folder = tmp_path / "binary"
    folder.mkdir()
    (folder / "config.json").write_bytes(b"\xff\xfe\x81\x00")
    return folder, [folder / "config.json"], f"cannot read {folder / 'config.json'}"


def _nonexistent(tmp_path):
    return tmp_path, [tmp_path / "does-not-exist"], "does-not-exist: no such file or folder"


def _hub_not_cached(tmp_path):
    return tmp_path, ["acme/not-cached"], "HF_HUB_OFFLINE is set: download its config once"


FOLDER_ERRORS = [
    _nonexistent,
    _no_config,
    _invalid_json,
    _json_list,
    _binary_config,
    _remote_code,
    _unknown_model_type,
    _hub_not_cached,
]


@pytest.mark.parametrize("case", FOLDER_ERRORS, ids=[f.__name__.strip("_") for f in FOLDER_ERRORS])
def test_bad_model_exits_1_with_one_line(case, tmp_path, run_script, snapshot_tree) -> None:
    root = tmp_path / "models"
    root.mkdir()
    folder, args, fragment = case(root)
    before = snapshot_tree(folder)
    line = _assert_one_line_error(run_script(*args), 1, fragment)
    if case is _hub_not_cached:
        assert "download" in line and "local folder" in line
    assert snapshot_tree(folder) == before


def test_bad_size_in_config_is_named_and_debug_shows_the_traceback(model_dir, run_script, snapshot_tree) -> None:
    # transformers would fail deep inside the model's constructor; the size is checked first, by name.
    folder = model_dir({"model_type": "bert", "num_hidden_layers": "two"})
    before = snapshot_tree(folder)
    plain = run_script(folder)
    line = _assert_one_line_error(plain, 1, "num_hidden_layers")
    assert line.endswith("sets num_hidden_layers to 'two'; it must be a positive integer")

    debug = run_script(folder, "--debug")
    assert debug.returncode == 1
    assert debug.stdout == ""
    assert "Traceback (most recent call last)" in debug.stderr
    assert "num_hidden_layers" in debug.stderr
    assert snapshot_tree(folder) == before


def test_debug_also_shows_the_traceback_of_a_user_error(tmp_path, run_script) -> None:
    out = run_script(tmp_path / "nothing-here", "--debug")
    assert out.returncode == 1
    assert "Traceback (most recent call last)" in out.stderr
    assert "x_estimate.model.errors.EstimateError" in out.stderr


# Make timm look uninstalled exactly as x-estimate looks for it: importlib.util.find_spec("timm")
# answers None (every meta path finder is wrapped to not find it), so `import timm` fails too.
WITHOUT_TIMM = textwrap.dedent(
    """
    import importlib.util, sys

    class WithoutTimm:
        def __init__(self, inner):
            self.inner = inner

        def find_spec(self, name, path=None, target=None):
            if name == "timm" or name.startswith("timm."):
                return None
            find = getattr(self.inner, "find_spec", None)
            return None if find is None else find(name, path, target)

        def __getattr__(self, attr):
            return getattr(self.inner, attr)

    sys.meta_path[:] = [WithoutTimm(finder) for finder in sys.meta_path]
    assert importlib.util.find_spec("timm") is None
    try:
        import timm
    except ImportError:
        pass
    else:
        raise AssertionError("timm still imports")

    from x_estimate.cli import main
    main(sys.argv[1:])
    """
)


@pytest.mark.parametrize(
    "args",
    [["timm/resnet18"], ["resnet18", "--library_name", "timm"], ["LOCAL_TIMM_FOLDER"]],
    ids=["timm-prefix", "library-name-timm", "local-timm-folder"],
)
def test_timm_not_installed_says_how_to_install_it(args, model_dir, run_python, snapshot_tree) -> None:
    folder = model_dir({"architecture": "resnet18", "num_classes": 10})
    before = snapshot_tree(folder)
    args = [str(folder) if a == "LOCAL_TIMM_FOLDER" else a for a in args]
    out = run_python(WITHOUT_TIMM, *args)
    line = _assert_one_line_error(out, 1, 'pip install "x-estimate[timm]"')
    assert line == 'Error: timm is not installed: pip install "x-estimate[timm]"'
    assert snapshot_tree(folder) == before


def test_bare_name_without_timm_mentions_the_timm_extra(run_python) -> None:
    out = run_python(WITHOUT_TIMM, "resnet50")
    line = _assert_one_line_error(out, 1, "is not in the Hugging Face cache")
    assert line.endswith('(if resnet50 is a timm model: pip install "x-estimate[timm]")')


def test_no_model_argument_prints_usage(run_script) -> None:
    out = run_script()
    assert out.returncode == 2
    assert "Usage: x-estimate [OPTIONS] MODEL" in out.stdout + out.stderr
    assert "Traceback" not in out.stderr
