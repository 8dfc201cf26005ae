"""Starting a function in several processes from a notebook or a script: ``notebook_launcher``, and
``debug_launcher`` (CPU processes, to debug distributed code)."""

from x_runtime.launchers.debug import debug_launcher
from x_runtime.launchers.notebook import notebook_launcher

__all__ = ["debug_launcher", "notebook_launcher"]
