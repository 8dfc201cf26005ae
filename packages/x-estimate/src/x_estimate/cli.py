"""The ``x-estimate`` command line."""

from __future__ import annotations

import click

from x_estimate._version import __version__


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, no_args_is_help=True)
@click.version_option(__version__, prog_name="x-estimate")
def main() -> None:
    """Print the memory a model needs, built on the meta device without its weights.

    \b
    Examples:
      x-estimate --version
    """
