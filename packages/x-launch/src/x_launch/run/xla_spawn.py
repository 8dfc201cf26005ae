"""Run a training script's main function on every TPU core, through torch_xla's launcher.

    python -m x_launch.run.xla_spawn [--main_training_function main] [--nprocs 1] script.py [args...]

``x-launch --tpu`` starts this. torch_xla spawns one process per TPU device and each calls the
script's function (``main`` unless named): the script is imported as a module, so its
``if __name__ == "__main__":`` block does not run twice. Every process sees ``sys.argv`` as if
the script had been run directly.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

__all__ = ["load_function", "main"]


class LaunchProblem(Exception):
    """Why the script cannot be run this way, with the fix."""


def load_function(script: str, name: str) -> Any:
    """Import ``script`` as a module (its folder first on ``sys.path``) and return ``name`` from it.

    Raises:
        LaunchProblem: the script is missing or has no such function.
    """
    path = Path(script).resolve()
    if not path.is_file():
        raise LaunchProblem(f"script {script} does not exist")
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # spawned processes inherit sys.path and import it by name
    module = importlib.import_module(path.stem)
    function = getattr(module, name, None)
    if not callable(function):
        raise LaunchProblem(
            f"{path.name} has no function {name}(); on TPU every process calls a function of the script: "
            f"define {name}() or pass --main_training_function"
        )
    return function


def _run(_index: int, module_name: str, function_name: str, argv: list[str]) -> None:
    sys.argv = argv
    getattr(importlib.import_module(module_name), function_name)()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m x_launch.run.xla_spawn", description=__doc__.splitlines()[0])
    parser.add_argument("--main_training_function", default="main")
    parser.add_argument("--nprocs", type=int, default=None, help="1 for one process; default: every device")
    parser.add_argument("script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    try:
        function = load_function(args.script, args.main_training_function)
    except LaunchProblem as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    try:
        import torch_xla.distributed.xla_multiprocessing as xmp
    except ImportError:
        print("Error: x-launch --tpu needs torch_xla: pip install 'torch_xla[tpu]'", file=sys.stderr)
        return 2
    script_argv = [str(Path(args.script).resolve()), *args.script_args]
    xmp.spawn(_run, args=(function.__module__, function.__name__, script_argv), nprocs=args.nprocs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
