"""The ``x-estimate`` command line: its options, the spellings it accepts, ``--plan``'s run.

``command`` is the click command and ``main``, the console script's entry point
(``x_estimate.cli:main``, kept here so the installed script and ``python -m x_estimate`` keep
their import); ``spellings`` takes Accelerate's and x-launch's spellings of the options;
``plan`` runs ``--plan`` from the parsed options.
"""

from x_estimate.cli.command import main

__all__ = ["main"]
