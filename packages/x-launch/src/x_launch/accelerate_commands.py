"""Accelerate's command entry points that libraries call in-process, backed by x-launch.

The ``trl`` CLI parses its launch arguments with ``launch_command_parser()`` and starts the run with
``launch_command(args)``; ``trl env`` and ``transformers env`` print the default config through
``load_config_from_file(default_config_file).to_dict()``. Served as ``accelerate.commands.launch``
and ``accelerate.commands.config`` while x serves accelerate, these run x-launch: the same
options (Accelerate's spellings, as ``x-launch`` takes them), the same config files, and x's
launch (torchrun, SLURM, TPU) underneath.

Examples:
    >>> args = launch_command_parser().parse_args(["--num_processes", "2", "--cpu", "train.py", "--lr", "1e-3"])
    >>> args.training_script, args.training_script_args, args.num_processes, args.use_cpu
    ('train.py', ['--lr', '1e-3'], '2', True)
"""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path
from typing import Any

import click

from x_launch.config_file import ConfigError, accelerate_config_path, as_yaml_document, load_config

__all__ = [
    "LaunchConfigFile",
    "default_config_file",
    "launch_command",
    "launch_command_parser",
    "load_config_from_file",
]

# Accelerate's default config file ($HF_HOME, else $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface),
# as Accelerate computes it once, at import.
default_config_file = str(accelerate_config_path())


class LaunchConfigFile:
    """A launch config file as read: its settings as attributes (top-level keys) and ``to_dict()``."""

    def __init__(self, path: Path, values: dict[str, Any]) -> None:
        self.path = path
        self._values = as_yaml_document(values)
        for key, value in self._values.items():
            setattr(self, key, value)

    def to_dict(self) -> dict[str, Any]:
        """The settings, sections nested, as Accelerate's ``ClusterConfig.to_dict()`` gives them."""
        return dict(self._values)


def load_config_from_file(config_file: str | os.PathLike[str] | None) -> LaunchConfigFile:
    """Read a launch config file (``None``: Accelerate's default one), checked as x-launch checks it.

    Raises:
        FileNotFoundError: an explicit ``config_file`` that does not exist (as Accelerate raises).
        ConfigError: the file is malformed or holds an unknown key (one line naming it).
    """
    if config_file is not None and not Path(config_file).is_file():
        raise FileNotFoundError(
            f"The passed configuration file `{config_file}` does not exist: pass an existing file, or run "
            "`x-launch config` to write the default one"
        )
    path = Path(config_file if config_file is not None else default_config_file)
    return LaunchConfigFile(path, load_config(path).values)


def _launch() -> click.Command:
    from x_launch.cli import launch

    return launch


def launch_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """An ``argparse`` parser for ``accelerate launch``'s arguments: x-launch's options, then the
    script and its own arguments (``training_script``, ``training_script_args``)."""
    description = "Launch a script as x-launch does (Accelerate's `accelerate launch` arguments)."
    if subparsers is not None:
        parser = subparsers.add_parser("launch", description=description, allow_abbrev=False)
    else:
        parser = argparse.ArgumentParser(prog="x-launch", description=description, allow_abbrev=False)
    for param in _launch().params:
        if not isinstance(param, click.Option) or param.name is None:
            continue
        names = [name for name in (*param.opts, *param.secondary_opts) if name.startswith("-")]
        if param.is_flag:
            parser.add_argument(*names, dest=param.name, action="store_true", default=None, help=param.help)
        else:
            parser.add_argument(*names, dest=param.name, default=None, help=param.help)
    parser.add_argument("training_script", help="The script (or, with -m, the module) to launch.")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="Arguments of the script.")
    if subparsers is not None:
        parser.set_defaults(func=launch_command)
    return parser


def launch_argv(args: argparse.Namespace) -> list[str]:
    """The ``x-launch`` command line for ``args`` (from ``launch_command_parser``)."""
    argv: list[str] = []
    for param in _launch().params:
        if not isinstance(param, click.Option) or param.name is None:
            continue
        value = getattr(args, param.name, None)
        if value is None or value is False:
            continue
        argv.extend([param.opts[0]] if param.is_flag else [param.opts[0], str(value)])
    return [*argv, args.training_script, *args.training_script_args]


def launch_command(args: argparse.Namespace) -> None:
    """Launch as ``args`` say and wait; return when every rank succeeded.

    Raises:
        subprocess.CalledProcessError: the launch failed (its exit code), as Accelerate's launcher raises.
    """
    from x_launch.cli import main

    argv = launch_argv(args)
    try:
        main(["launch", *argv])
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if code != 0:
            raise subprocess.CalledProcessError(code, ["x-launch", *argv]) from None
    except ConfigError as exc:
        raise subprocess.CalledProcessError(exc.exit_code, ["x-launch", *argv]) from exc
