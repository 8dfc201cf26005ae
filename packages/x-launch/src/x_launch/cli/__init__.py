"""The ``x-launch`` command line: its commands and options, Accelerate's launch flags, and
Accelerate's command entry points (``launch_command`` and the rest) that libraries call in-process.

``main`` is the console entry point (``x-launch``, ``python -m x_launch``).
"""

from x_launch.cli.command_line import main

__all__ = ["main"]
