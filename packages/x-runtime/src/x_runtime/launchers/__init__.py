"""Starting a function in several processes from a notebook or a script: ``notebook_launcher``."""

from x_runtime.launchers.notebook import notebook_launcher

__all__ = ["notebook_launcher"]
