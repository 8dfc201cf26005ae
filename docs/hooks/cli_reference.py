"""mkdocs hook: the command-line reference, rendered from the click commands at build time.

A page line such as

    <!-- cli-reference x_launch.cli.command_line:_cli prog=x-launch level=4 skip=launch -->

is replaced by the ``--help`` text of that click command, exactly as the terminal prints it,
followed by every subcommand (recursively, hidden ones left out) under a heading of its full
command path, starting at heading ``level``. The help comes from click itself, so the page
cannot drift from the code; a marker that cannot be read or imported fails the build.

mkdocs-click renders help text as Markdown, which drops placeholders such as ``X_LAUNCH_<KEY>``
(read as HTML tags) and runs click's ``\\b`` example blocks together. ``skip=a,b`` leaves those
subcommands out: x-launch's ``launch`` is listed in its group but has its own marker under a
heading of the page's choosing (``x_launch.cli.main`` runs it without the word).
"""

from __future__ import annotations

import importlib
import re
from typing import Any

import click
from mkdocs.exceptions import PluginError

# Wide enough that each command's own max_content_width (click's default 80, or its
# context_settings) decides the layout, as in any terminal at least this wide.
TERMINAL_WIDTH = 120

MARKER = re.compile(r"^<!-- cli-reference\b(?P<body>.*?)-->[ \t]*$", re.MULTILINE)
BODY = re.compile(
    r"^\s*(?P<module>[\w.]+):(?P<attr>\w+)\s+prog=(?P<prog>\S+)(?:\s+level=(?P<level>[1-6]))?"
    r"(?:\s+skip=(?P<skip>[\w,-]+))?\s*$"
)


def _command(module: str, attr: str) -> click.Command:
    command = getattr(importlib.import_module(module), attr, None)
    if not isinstance(command, click.Command):
        raise PluginError(f"cli-reference: {module}:{attr} is not a click command")
    return command


def _context(command: click.Command, name: str, parent: click.Context | None) -> click.Context:
    ctx = command.context_class(command, info_name=name, parent=parent, **command.context_settings)
    # What click's HelpFormatter computes from the terminal's size, with a fixed terminal.
    ctx.terminal_width = max(min(TERMINAL_WIDTH, ctx.max_content_width or 80) - 2, 50)
    return ctx


def _render(
    command: click.Command,
    name: str,
    level: int,
    parent: click.Context | None = None,
    skip: frozenset[str] = frozenset(),
) -> list[str]:
    """The command's help in a text block, then each subcommand's under its own heading (but those in ``skip``)."""
    ctx = _context(command, name, parent)
    lines = ["```text", *ctx.get_help().splitlines(), "```", ""]
    if isinstance(command, click.Group):
        for sub_name in command.list_commands(ctx):
            sub = command.get_command(ctx, sub_name)
            if sub is None or sub.hidden or sub_name in skip:
                continue
            path = f"{ctx.command_path} {sub_name}"
            lines += [f"{'#' * min(level, 6)} `{path}`", ""]
            lines += _render(sub, sub_name, level + 1, ctx)
    return lines


def _replace(match: re.Match[str]) -> str:
    spec = BODY.match(match.group("body"))
    if spec is None:
        raise PluginError(
            f"cli-reference: cannot read {match.group(0)!r}; expected <!-- cli-reference module:attr prog=NAME [level=N] -->"
        )
    command = _command(spec["module"], spec["attr"])
    skip = frozenset((spec["skip"] or "").split(",")) - {""}
    return "\n".join(_render(command, spec["prog"], int(spec["level"] or 3), skip=skip)).rstrip() + "\n"


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return MARKER.sub(_replace, markdown)
