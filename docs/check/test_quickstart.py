"""The quickstart's commands, run as the page shows them, print what the page says they print.

Each ```python block the page introduces with "Save this as `NAME`" is written to a temporary
folder; each ```console block's "$ command" then runs there (x-estimate from the repository root,
where its example config lives) and its output is compared with the page's, numbers within 2 %
(losses move in the last digit between CPUs). A command whose packages are not installed here is
skipped with the reason (`nox -s docs` installs all five packages, so there none is skipped).
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "quickstart.md"
NUMBER = re.compile(r"-?\d+(?:[.,]\d+)*")
# What each command needs installed, beyond Python.
NEEDS = {
    "train.py": ("x_runtime",),
    "x-launch": ("x_launch", "x_runtime"),
    "big.py": ("x_bigmodel", "transformers"),
    "x-estimate": ("x_estimate",),
}


def saved_files(text: str) -> dict[str, str]:
    return dict(re.findall(r"Save this as `([\w.]+)`.*?```python\n(.*?)```", text, re.S))


def console_blocks(text: str) -> list[tuple[str, str]]:
    """(command, expected output) of every ```console block starting with a "$ " line."""
    return re.findall(r"```console\n\$ ([^\n]+)\n(.*?)```", text, re.S)


def same_modulo_numbers(got: str, want: str) -> bool:
    if NUMBER.sub("#", got) != NUMBER.sub("#", want):
        return False
    pairs = zip(NUMBER.findall(got), NUMBER.findall(want), strict=True)
    return all(math.isclose(float(a.replace(",", "")), float(b.replace(",", "")), rel_tol=0.02) for a, b in pairs)


TEXT = PAGE.read_text(encoding="utf-8")
FILES = saved_files(TEXT)
COMMANDS = console_blocks(TEXT)


def test_the_page_shows_each_step() -> None:
    assert set(FILES) == {"train.py", "big.py", "tune.py"}
    assert [command.split()[0] for command, _ in COMMANDS] == ["python", "x-launch", "x-estimate", "python"]


def test_same_modulo_numbers_tells_a_changed_word_or_value() -> None:
    assert same_modulo_numbers("loss 0.4974, 8 batches", "loss 0.4975, 8 batches")
    assert not same_modulo_numbers("loss 0.6000, 8 batches", "loss 0.4974, 8 batches")
    assert not same_modulo_numbers("loss 0.4974, 8 batch", "loss 0.4974, 8 batches")


@pytest.mark.parametrize(("command", "expected"), COMMANDS, ids=[c for c, _ in COMMANDS])
def test_command_prints_what_the_page_shows(command: str, expected: str, tmp_path: Path) -> None:
    argv = shlex.split(command)
    key = argv[1] if argv[0] == "python" else argv[0]
    missing = [m for m in NEEDS[key] if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed here")
    for name, code in FILES.items():
        (tmp_path / name).write_text(code, encoding="utf-8")
    bin_dir = Path(sys.executable).parent  # the venv's console scripts, as after `. .venv/bin/activate`
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "XDG_CACHE_HOME": str(tmp_path)}
    if argv[0] == "python":
        argv[0] = sys.executable
    cwd = ROOT if key == "x-estimate" else tmp_path
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert same_modulo_numbers(done.stdout, expected), f"page shows:\n{expected}\nthe command printed:\n{done.stdout}"


def test_tune_prints_the_guard_lines_the_page_shows(tmp_path: Path) -> None:
    """The memory guard's section: ``tune.py`` under the page's budget says the page's two lines.

    The warning is compared as the commands' output is. The memory line is the first step after
    the simulation's answer, which moves with the machine's load (on a busy machine it comes after
    the longer batches began, and measures one of them): it must have the page's form and hold the
    plan within x-estimate's 3%, whichever step it measured.
    """
    missing = [m for m in ("x_runtime", "x_estimate", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed here")
    shown = re.search(r"```text\n\$ X_MEMORY_BUDGET=2GiB python tune\.py\n(.*?)```", TEXT, re.S)
    assert shown, "the page's guard section lost its run"
    (tmp_path / "tune.py").write_text(FILES["tune.py"], encoding="utf-8")
    env = {**os.environ, "X_MEMORY_BUDGET": "2GiB", "XDG_CACHE_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "tune.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("x: ")]
    page = shown.group(1).splitlines()
    warnings = [line for line in said if line.startswith("x: warning:")]
    assert len(warnings) == 1 and same_modulo_numbers(warnings[0], page[1]), f"the run said:\n{said}"
    memory = [line for line in said if line.startswith("x: memory of step ")]
    form = re.compile(
        r"x: memory of step \d+: peak ([\d.]+ \w+) allocated \(process resident [\d.]+ \w+\), "
        r"planned ([\d.]+ \w+) \(\+0\.0%\), within x-estimate's 3%"
    )
    assert len(memory) == 1 and form.fullmatch(memory[0]) and form.fullmatch(page[0]), f"the run said:\n{said}"
    assert memory[0].split(": peak ")[1].split(" allocated")[0] in ("809.88 MiB", "2.51 GiB")  # 8 x 128 or 8 x 512
