"""``x-launch migrate``: Accelerate imports rewritten to x, everything else left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from x_launch.cli import main
from x_launch.migrate.rewrite import migrate_source

BEFORE = """\
# train.py: a comment that stays
import os
import accelerate, sys
from accelerate import Accelerator, init_empty_weights  # setup
from accelerate.utils import set_seed, get_max_memory as gmm
from accelerate.hooks import add_hook_to_module
from accelerate.commands.merge import merge_command, merge_command_parser
from torch import nn


def build():
    import accelerate.utils as au  # inside a function
    x = {"a": 1,   "b": 2}   # odd spacing survives
    return au, x
"""

AFTER = """\
# train.py: a comment that stays
import os
import x_runtime as accelerate
import sys
from x_runtime import Accelerator, set_seed
from x_bigmodel import init_empty_weights, get_max_memory as gmm, add_hook_to_module  # setup
from x_launch import merge_command, merge_command_parser
from torch import nn


def build():
    import x_runtime as au  # inside a function
    x = {"a": 1,   "b": 2}   # odd spacing survives
    return au, x
"""


def run(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err


def test_the_rule() -> None:
    assert migrate_source(BEFORE) == AFTER


def test_code_after_the_import_on_one_line_stays_one_line() -> None:
    text = "from accelerate import Accelerator, dispatch_model; x = 1\n"
    assert migrate_source(text) == "from x_runtime import Accelerator; from x_bigmodel import dispatch_model; x = 1\n"


def test_relative_and_other_imports_are_untouched() -> None:
    text = "from .accelerate import thing\nimport accelerated\nfrom accelerator import x\n"
    assert migrate_source(text) == text


def test_cli_prints_the_diff_and_writes_only_with_write(capsys, tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(BEFORE)
    code, out, _ = run(capsys, "migrate", str(path))
    assert code == 0 and path.read_text() == BEFORE
    assert out.startswith(f"--- a/{path}\n+++ b/{path}\n")
    assert "-from accelerate import Accelerator, init_empty_weights  # setup\n" in out
    assert "+from x_bigmodel import init_empty_weights, get_max_memory as gmm, add_hook_to_module  # setup\n" in out
    code, _, _ = run(capsys, "migrate", "--write", str(path))
    assert code == 0 and path.read_text() == AFTER
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind
    code, out, _ = run(capsys, "migrate", str(path))
    assert code == 0 and out == ""  # nothing left to change


def test_a_file_that_does_not_parse_is_one_line_exit_2_and_nothing_is_written(capsys, tmp_path: Path) -> None:
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text(BEFORE)
    bad.write_text("import accelerate\ndef (:\n")
    code, out, err = run(capsys, "migrate", "--write", str(good), str(bad))
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [f"Error: {bad}:2: does not parse: invalid syntax"]
    assert good.read_text() == BEFORE  # every file is checked before any is written


def test_each_name_goes_to_the_package_that_exports_it_and_one_x_lacks_stays(capsys, tmp_path: Path) -> None:
    text = (
        "from accelerate.utils import set_module_tensor_to_device, set_seed, x_lacks_this_name\n"
        "from accelerate.hooks import CpuOffload, attach_execution_device_hook as attach\n"
        "from accelerate.utils import some_helper_x_lacks\n"
    )
    assert migrate_source(text) == (
        "from x_bigmodel import set_module_tensor_to_device, CpuOffload\n"  # the hooks' line joined it
        "from x_runtime import set_seed\n"
        "from accelerate.utils import x_lacks_this_name\n"
        "from accelerate.hooks import attach_execution_device_hook as attach\n"
        "from accelerate.utils import some_helper_x_lacks\n"  # nothing to change: the line stays whole
    )
    path = tmp_path / "train.py"
    path.write_text(text)
    code, out, err = run(capsys, "migrate", str(path))
    assert code == 0 and "+from x_bigmodel import set_module_tensor_to_device, CpuOffload\n" in out
    assert err.splitlines() == [
        f"x-launch migrate: {path}:1: x has no accelerate.utils.x_lacks_this_name; its import from Accelerate stays",
        f"x-launch migrate: {path}:2: x has no accelerate.hooks.attach_execution_device_hook; its import from Accelerate stays",
        f"x-launch migrate: {path}:3: x has no accelerate.utils.some_helper_x_lacks; its import from Accelerate stays",
    ]
