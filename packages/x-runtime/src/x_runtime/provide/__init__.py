"""x serves the ``accelerate`` import: transformers' ``Trainer``, TRL, PEFT and diffusers run on x.

Opt-in, in one of three ways (each makes the same finder answer; see ``x_common.accelerate_import``):

- ``X_PROVIDE_ACCELERATE=1`` in the environment of a process (``python``, torchrun or srun ranks);
- ``x-launch --provide-accelerate script.py`` (every rank);
- ``provide_accelerate()`` in the script, before transformers, TRL or PEFT is imported.

Then ``import accelerate`` and each ``accelerate.*`` module the libraries import are
``ServedModule`` objects whose names are x's objects (one table per module, ``tables/``);
``accelerate.__version__`` and ``importlib.metadata.version("accelerate")`` are the Accelerate API
level x implements. Rank 0 prints one line saying so. A module or name x lacks raises an
``ImportError`` that names x and the name.

Examples:
    >>> import subprocess, sys
    >>> code = "import x_runtime; x_runtime.provide_accelerate(); import accelerate; print(accelerate.Accelerator)"
    >>> subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    "<class 'x_runtime.accelerator.facade.Accelerator'>\\n"
"""

from __future__ import annotations

import importlib.machinery
import sys
import warnings

from x_common import accelerate_import
from x_common.accelerate_import import ACCELERATE_API
from x_common.env import PROVIDE_ACCELERATE
from x_common.process_env import process_env
from x_runtime.provide.served_module import DOCS, NotServedError, ServedLoader, ServedModule, not_served_message
from x_runtime.provide.table import Home, ModuleTable
from x_runtime.provide.tables import SERVED

__all__ = [
    "ACCELERATE_API",
    "SERVED",
    "Home",
    "ModuleTable",
    "NotServedError",
    "ServedModule",
    "find_spec",
    "not_served_message",
    "provide_accelerate",
]

# The libraries that import accelerate once, at their own import: serving it later is too late for them.
_USERS = ("transformers", "trl", "peft", "diffusers")


def find_spec(fullname: str) -> importlib.machinery.ModuleSpec:
    """The spec of a served ``accelerate.*`` module; called by the finder ``x_common`` installs.

    Raises:
        ModuleNotFoundError: Accelerate's module ``fullname`` is not served by x (the message names x).
    """
    table = SERVED.get(fullname)
    if table is None:
        raise ModuleNotFoundError(
            f"x-runtime serves accelerate ({ACCELERATE_API}'s API) but not its module {fullname}; "
            f"what x leaves out and why: {DOCS}. To use the real Accelerate instead, unset "
            f"{PROVIDE_ACCELERATE.name} (or drop --provide-accelerate / provide_accelerate())",
            name=fullname,
        )
    loader = ServedLoader(table, SERVED, announce=fullname == "accelerate" and process_env().rank == 0)
    return importlib.machinery.ModuleSpec(fullname, loader, origin="x-runtime", is_package=table.package)


def provide_accelerate() -> None:
    """Serve ``import accelerate`` from x in this process, from now on.

    Call it before transformers, TRL, PEFT or diffusers is imported: they import accelerate (and
    read its version) at their own import. Calling it again does nothing.

    Raises:
        RuntimeError: the real Accelerate was imported already in this process: both cannot serve one run.

    Examples:
        >>> import x_runtime
        >>> x_runtime.provide_accelerate()  # doctest: +SKIP
        >>> from transformers import Trainer  # its Accelerator is x's  # doctest: +SKIP
    """
    real = sys.modules.get("accelerate")
    if real is not None and not isinstance(real, ServedModule):
        raise RuntimeError(
            f"the real Accelerate was imported already (from {getattr(real, '__file__', '?')}): call "
            f"x_runtime.provide_accelerate() before anything imports accelerate, or set {PROVIDE_ACCELERATE.name}=1"
        )
    if accelerate_import.install():
        early = [name for name in _USERS if name in sys.modules]
        if early:
            warnings.warn(
                f"provide_accelerate() was called after {', '.join(early)} was imported; call it first, "
                f"or set {PROVIDE_ACCELERATE.name}=1, so that every import of accelerate is served by x",
                stacklevel=2,
            )
