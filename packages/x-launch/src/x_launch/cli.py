"""The ``x-launch`` command line."""

from __future__ import annotations

import click

from x_launch._version import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="x-launch")
def main() -> None:
    """Configure, check and launch PyTorch scripts.

    \b
    Examples:
      x-launch --version
    """
