"""Command-line options derived from the settings table: every row with ``cli`` spellings.

Values stay strings here: ``resolve()`` checks them with the config file's rules and names the
flag in the error, so ``--num_processes 0`` and ``num_processes: 0`` are refused alike.
Options that steer the launch itself rather than the job (``--dry-run``, ``--log_dir``) are
not settings and stay in ``x_launch.cli.command_line``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import click

from x_launch.config.launch_config import TABLE
from x_launch.config.option import Option, flag_spellings

__all__ = ["option_help", "setting_options"]

F = TypeVar("F", bound=Callable[..., Any])


def _alias_options(row: Option) -> list[Callable[[F], F]]:
    """``--use_fsdp`` and the like: switches that set ``row`` to one value."""
    return [
        click.option(*flag_spellings(flag), flag, is_flag=True, default=None, help=f"Same as {row.key} {value}.")
        for flag, value in row.aliases
    ]


def option_help(row: Option) -> str:
    """``--help`` text of ``row``'s option: its own, else its meaning, what it takes, its default and key.

    Written from the row so that the text cannot drift from what the config file accepts.

    Examples:
        >>> from x_launch.config.launch_config import TABLE
        >>> option_help(next(row for row in TABLE if row.flag == "num_processes"))
        'Processes in the whole job. Takes an integer >= 1; default 1. Config key: num_processes.'
    """
    if row.cli_help:
        return row.cli_help
    first = row.doc.split(" ", 1)[0]
    # "torch.compile backend" and "FSDP1 ..." keep their spelling; a plain word starts a sentence.
    doc = row.doc[:1].upper() + row.doc[1:] if first.isalpha() and first.islower() else row.doc
    sub = row.key.rpartition(".")[2]
    key = f"{sub} in {row.section}" if row.section else row.key  # wraps at a space, not inside the key
    if row.switch:
        return f"{doc}. Config key: {key}."
    default = "" if row.default is None else f"; default {_shown(row.default)}"
    return f"{doc}. Takes {row.describe()}{default}. Config key: {key}."


def _shown(value: object) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _click_option(row: Option) -> Callable[[F], F]:
    if row.switch:
        # default None, not False: an absent --cpu must not override the config file's use_cpu.
        return click.option(*row.cli, row.flag, is_flag=True, default=None, help=option_help(row))
    return click.option(*row.cli, row.flag, default=None, metavar="VALUE", help=option_help(row))


def setting_options(flags: Iterable[str] | None = None) -> Callable[[F], F]:
    """A decorator adding the table's command-line options, value options first, then switches.

    Args:
        flags: only these flag names (e.g. ``("num_processes", "use_cpu")``); default all.

    Examples:
        >>> @click.command()
        ... @setting_options(["num_processes"])
        ... def run(num_processes): ...
        >>> [param.opts for param in run.params]
        [['--num_processes', '--num-processes']]
    """
    wanted = None if flags is None else set(flags)
    rows = [row for row in TABLE if row.cli and (wanted is None or row.flag in wanted)]
    rows.sort(key=lambda row: row.switch)  # stable: table order within each group
    options = [_click_option(row) for row in rows]
    options += [alias for row in TABLE if wanted is None for alias in _alias_options(row)]

    def decorate(func: F) -> F:
        for add in reversed(options):  # click lists options in the order the decorators read, top down
            func = add(func)
        return func

    return decorate
