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
import sys
from pathlib import Path
from typing import Any

import click

from x_launch.cli.accelerate_flags import answered, target_index
from x_launch.config.bounded_yaml import decode, parse
from x_launch.config.file import ConfigError, accelerate_config_path, load_config

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
    """A launch config file as read: its keys as attributes and ``to_dict()``, the values as the file writes them."""

    def __init__(self, path: Path, document: dict[str, Any]) -> None:
        self.path = path
        self._document = document
        for key, value in document.items():
            setattr(self, str(key), value)

    def to_dict(self) -> dict[str, Any]:
        """The file's settings, as Accelerate's ``ClusterConfig.to_dict()`` gives them."""
        return dict(self._document)


def load_config_from_file(config_file: str | os.PathLike[str] | None) -> LaunchConfigFile:
    """Read a launch config file (``None``: Accelerate's default one), checked as x-launch checks it.

    Raises:
        FileNotFoundError: the file does not exist (as Accelerate raises).
        ConfigError: the file is malformed or holds an unknown key (one line naming it).
    """
    path = Path(config_file if config_file is not None else default_config_file)
    if not path.is_file():
        raise FileNotFoundError(
            f"The passed configuration file `{path}` does not exist: pass an existing file, or run "
            "`x-launch config` to write the default one"
        )
    load_config(path)  # every key and value checked, one line naming the first problem
    document = parse(decode(path.read_bytes())).data
    return LaunchConfigFile(path, dict(document) if isinstance(document, dict) else {})


def _launch() -> click.Command:
    from x_launch.cli.command_line import launch

    return launch


class _LaunchParser(argparse.ArgumentParser):
    """Accelerate's launch parser: the launcher's options, then the script and everything after it.

    Where the script starts is x-launch's own rule (``target_index``), so a flag x-launch accepts or
    refuses with a reason reaches ``launch_command`` as given, and is accepted or refused there.
    """

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        argv = [str(a) for a in (sys.argv[1:] if args is None else args)]
        split = target_index(argv, _value_options())
        if split >= len(argv):
            self.error("the following arguments are required: training_script")
        parsed, extra = self.parse_known_args(argv[:split], namespace)
        unknown = [token for token in extra if token.startswith("-") and not answered(token)]
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        parsed.training_script = argv[split]
        rest = argv[split + 1 :]
        parsed.training_script_args = rest[1:] if rest[:1] == ["--"] else rest  # as argparse's REMAINDER
        parsed.launcher_extras = extra  # flags x-launch reads itself (Accelerate's, with their values)
        return parsed


def _value_options() -> set[str]:
    return {
        name
        for param in _launch().params
        if isinstance(param, click.Option) and not param.is_flag
        for name in (*param.opts, *param.secondary_opts)
    }


def launch_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """An ``argparse`` parser for ``accelerate launch``'s arguments: x-launch's options, then the
    script and its own arguments (``training_script``, ``training_script_args``)."""
    description = "Launch a script as x-launch does (Accelerate's `accelerate launch` arguments)."
    if subparsers is not None:  # the parent parser parses: the script and its arguments are positionals there
        parser = subparsers.add_parser("launch", description=description, allow_abbrev=False)
        parser.add_argument("training_script", help="The script (or, with -m, the module) to launch.")
        parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="Arguments of the script.")
    else:
        parser = _LaunchParser(prog="x-launch", description=description, allow_abbrev=False)
    for param in _launch().params:
        if not isinstance(param, click.Option) or param.name is None:
            continue
        names = [name for name in (*param.opts, *param.secondary_opts) if name.startswith("-")]
        if param.is_flag:
            parser.add_argument(*names, dest=param.name, action="store_true", default=None, help=param.help)
        else:
            parser.add_argument(*names, dest=param.name, default=None, help=param.help)
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
    extras = list(getattr(args, "launcher_extras", []))
    return [*argv, *extras, args.training_script, *args.training_script_args]


def launch_command(args: argparse.Namespace) -> None:
    """Launch as ``args`` say and wait; return when every rank succeeded.

    Raises:
        subprocess.CalledProcessError: the launch failed (its exit code), as Accelerate's launcher raises.
    """
    from x_launch.cli.command_line import main

    argv = launch_argv(args)
    try:
        main(["launch", *argv])
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if code != 0:
            raise subprocess.CalledProcessError(code, ["x-launch", *argv]) from None
    except ConfigError as exc:
        raise subprocess.CalledProcessError(exc.exit_code, ["x-launch", *argv]) from exc


def accelerate_main() -> None:
    """The ``accelerate`` command while x serves accelerate: ``accelerate launch/config/env/test/merge-weights``
    run x-launch's commands of the same name (Accelerate's console script imports this ``main``).

    ``accelerate estimate-memory`` is x-estimate's (``x-estimate MODEL --dtypes ...``), which x-launch
    does not bring: one line says so, exit code 2.
    """
    from x_launch.cli.command_line import main

    args = sys.argv[1:]
    if args[:1] == ["estimate-memory"]:
        print(
            "Error: with x serving accelerate, estimate memory with x-estimate: pip install x-estimate, then "
            f"x-estimate {' '.join(args[1:]) or 'MODEL'}",
            file=sys.stderr,
        )
        raise SystemExit(2)
    main(args)
