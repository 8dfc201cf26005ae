"""Accelerate's ``accelerate.utils`` names: the ``is_*_available`` checks and ``patch_environment``.

The top layer of x_runtime, beside the facade: it holds no code of its own and re-exports names
from the layers that keep them (``core.imports`` says what this machine has, devices asked
without initialising them and packages by their installed distribution; ``core.environment``
sets variables for the length of a block).
"""

from x_runtime.core import imports
from x_runtime.core.environment import patch_environment
from x_runtime.core.imports import *  # noqa: F403 - every check, named once in imports.__all__

__all__ = [*imports.__all__, "patch_environment"]
