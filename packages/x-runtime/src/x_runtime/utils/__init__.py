"""Accelerate's small utilities: the ``is_*_available`` checks and ``patch_environment``.

``imports`` says what this machine has (devices asked without initialising them, packages by
their installed distribution); ``environment`` sets variables for the length of a block.
"""

from x_runtime.utils import imports
from x_runtime.utils.environment import patch_environment
from x_runtime.utils.imports import *  # noqa: F403 - every check, named once in imports.__all__

__all__ = [*imports.__all__, "patch_environment"]
