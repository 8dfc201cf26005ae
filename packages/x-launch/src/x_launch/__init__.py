"""x-launch: start a PyTorch script on this machine, several machines, a SLURM allocation or a TPU.

The launcher never imports the training script and imports torch only when a command needs it,
so ``x-launch --help`` answers at once on a login node.
"""

from x_launch._version import __version__
from x_launch.merge import merge_command, merge_command_parser

__all__ = ["__version__", "merge_command", "merge_command_parser"]
