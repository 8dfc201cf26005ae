"""Every x-launch command and every option of it says what it does in ``--help``."""

from __future__ import annotations

import subprocess

import click
import pytest

from x_launch.cli import command_line as cli
from x_launch.cli.options import option_help
from x_launch.config.launch_config import TABLE


def walk(command: click.Command, path: str) -> list[tuple[str, click.Command]]:
    """``(command path, command)`` for ``command`` and, recursively, its subcommands."""
    found = [(path, command)]
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            found += walk(sub, f"{path} {name}")
    return found


def own_gaps(command: click.Command, path: str) -> list[str]:
    """What ``command``'s own ``--help`` leaves unexplained: no description, options without help."""
    gaps = [] if (command.help or command.short_help or "").strip() else [f"{path}: no description"]
    for param in command.params:
        if isinstance(param, click.Option) and not (param.help or "").strip():
            gaps.append(f"{path} {'/'.join(param.opts)}: no help")
    return gaps


def missing_help(command: click.Command, path: str) -> list[str]:
    """``own_gaps`` of ``command`` and of every subcommand under it."""
    return [gap for where, each in walk(command, path) for gap in own_gaps(each, where)]


COMMANDS = walk(cli._cli, "x-launch")


def test_the_walk_finds_every_command() -> None:
    names = {path for path, _ in COMMANDS}
    expected = {"x-launch", "x-launch launch", "x-launch config", "x-launch env", "x-launch test"}
    expected |= {"x-launch config default", "x-launch config show", "x-launch migrate", "x-launch merge-weights"}
    assert expected <= names
    # Options of launch the table does not declare are found too (--dry-run, --log_dir, -m).
    assert {"--dry_run", "--log_dir", "--module", "--num_processes"} <= {
        opt for param in cli.launch.params for opt in param.opts
    }


@pytest.mark.parametrize("path", [path for path, _ in COMMANDS])
def test_every_option_has_help(path: str) -> None:
    assert own_gaps(dict(COMMANDS)[path], path) == []


def test_the_checker_finds_an_option_without_help() -> None:
    @click.group(help="A group.")
    def group() -> None: ...

    @group.command(help="A command.")
    @click.option("--told", help="Said.")
    @click.option("--untold")
    def sub(told: str, untold: str) -> None: ...

    @group.command()
    def bare() -> None: ...

    assert sorted(missing_help(group, "g")) == ["g bare: no description", "g sub --untold: no help"]


def test_table_options_say_their_meaning_kind_default_and_key() -> None:
    rows = {row.flag: row for row in TABLE}
    assert option_help(rows["num_processes"]) == (
        "Processes in the whole job. Takes an integer >= 1; default 1. Config key: num_processes."
    )
    assert option_help(rows["fsdp_version"]) == (
        "1: FullyShardedDataParallel, 2: fully_shard. Takes an integer from 1 to 2; default 2. "
        "Config key: fsdp_version in fsdp_config."
    )
    assert option_help(rows["dynamo_use_fullgraph"]) == (
        "torch.compile(fullgraph=True). Config key: dynamo_use_fullgraph in dynamo_config."
    )
    assert option_help(rows["use_cpu"]) == rows["use_cpu"].cli_help  # a row's own text wins


def test_the_command_list_names_launch(console_script) -> None:
    out = subprocess.run([console_script("x-launch"), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line.split(maxsplit=1) for line in out.stdout.partition("Commands:")[2].splitlines() if line.strip()]
    listed = {row[0]: row[1] for row in rows}
    assert listed["launch"].startswith("Run TARGET")


def test_launch_help_in_the_terminal_explains_every_option(console_script) -> None:
    out = subprocess.run([console_script("x-launch"), "launch", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # click wraps at spaces and after hyphens: compare without the white space.
    text = "".join(out.stdout.split())
    for row in TABLE:
        if row.cli:
            assert "".join(option_help(row).split()) in text, row.flag
    assert "Processesinthewholejob" in text and "Sameasdistributed_typeFSDP." in text
