"""x-launch: start a PyTorch script on this machine, several machines, a SLURM allocation or a TPU.

The launcher never imports the training script and imports torch only when a command needs it,
so ``x-launch --help`` answers at once on a login node.
"""

from typing import Any

from x_launch._version import __version__
from x_launch.commands.merge_weights import merge_command, merge_command_parser

# Accelerate's launch and config entry points (x_launch.cli.accelerate), loaded on first use:
# they bring click and the settings table, and `import x_launch` stays cheap.
_ACCELERATE_COMMANDS = ("default_config_file", "launch_command", "launch_command_parser", "load_config_from_file")

__all__ = [
    "__version__",
    "default_config_file",
    "launch_command",
    "launch_command_parser",
    "load_config_from_file",
    "merge_command",
    "merge_command_parser",
]


def __getattr__(name: str) -> Any:
    if name in _ACCELERATE_COMMANDS:
        from x_launch.cli import accelerate

        return getattr(accelerate, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
