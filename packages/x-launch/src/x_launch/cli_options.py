"""Command-line options derived from the settings table: every row with ``cli`` spellings.

Values stay strings here: ``resolve()`` checks them with the config file's rules and names the
flag in the error, so ``--num_processes 0`` and ``num_processes: 0`` are refused alike.
Options that steer the launch itself rather than the job (``--dry-run``, ``--log_dir``) are
not settings and stay in ``cli``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import click

from x_launch.launch_config import TABLE
from x_launch.option import Option, flag_spellings

__all__ = ["setting_options"]

F = TypeVar("F", bound=Callable[..., Any])


def _alias_options(row: Option) -> list[Callable[[F], F]]:
    """``--use_fsdp`` and the like: switches that set ``row`` to one value."""
    return [
        click.option(*flag_spellings(flag), flag, is_flag=True, default=None, help=f"Same as {row.key} {value}.")
        for flag, value in row.aliases
    ]


def _click_option(row: Option) -> Callable[[F], F]:
    if row.switch:
        # default None, not False: an absent --cpu must not override the config file's use_cpu.
        return click.option(*row.cli, row.flag, is_flag=True, default=None, help=row.cli_help)
    return click.option(*row.cli, row.flag, default=None, metavar="VALUE", help=row.cli_help)


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
