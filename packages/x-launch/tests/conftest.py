"""Every x-launch test runs with its own config homes and no launcher variables from outside."""

from __future__ import annotations

import os

import pytest

from x_common import env


@pytest.fixture(autouse=True)
def _isolated_environment(tmp_path, monkeypatch) -> None:
    for name in list(os.environ):
        if name == env.CONFIG_FILE.name or name.startswith(env.LAUNCH_FLAG_PREFIX):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv(env.XDG_CONFIG_HOME.name, str(tmp_path / "xdg"))
    monkeypatch.setenv(env.HF_HOME.name, str(tmp_path / "hf"))


@pytest.fixture
def migrate_write(capsys):
    """``x-launch migrate --write PATH`` through the CLI; asserts it exits 0 and returns its stderr."""
    from x_launch.cli import main

    def run(path) -> str:
        with pytest.raises(SystemExit) as exc:
            main(["migrate", "--write", str(path)])
        assert exc.value.code in (0, None)
        return capsys.readouterr().err

    return run
