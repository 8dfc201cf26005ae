"""``x-launch merge-weights``: Accelerate's ``accelerate merge-weights``, same arguments.

Merges the shards of an FSDP ``SHARDED_STATE_DICT`` checkpoint into one weights file through
``x_runtime.merge_fsdp_weights``, imported only when the command runs: x-launch does not
depend on x-runtime. ``merge_command_parser()`` and ``merge_command(args)`` are importable
from ``x_launch`` as from ``accelerate.commands.merge``.

Examples:
    >>> args = merge_command_parser().parse_args(["ckpt/pytorch_model_fsdp_0", "out", "--unsafe_serialization"])
    >>> args.checkpoint_directory, args.output_path, args.unsafe_serialization, args.remove_checkpoint_dir
    ('ckpt/pytorch_model_fsdp_0', 'out', True, False)
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["DESCRIPTION", "MergeUnavailable", "merge_command", "merge_command_parser"]

DESCRIPTION = (
    "Merge the weights of an FSDP checkpoint saved as SHARDED_STATE_DICT (one folder of shards) into one "
    "weights file in OUTPUT_PATH. CPU-bound; needs RAM for the whole model's state dict."
)


class MergeUnavailable(RuntimeError):
    """x-runtime, which does the merge, is not installed."""


def merge_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's parser: ``checkpoint_directory output_path [--unsafe_serialization] [--remove_checkpoint_dir]``."""
    if subparsers is not None:
        parser = subparsers.add_parser("merge-weights", description=DESCRIPTION)
    else:
        parser = argparse.ArgumentParser(prog="x-launch merge-weights", description=DESCRIPTION)
    parser.add_argument("checkpoint_directory", type=str, help="A directory containing sharded weights saved by FSDP.")
    parser.add_argument("output_path", type=str, help="Where to save the merged weights.")
    parser.add_argument(
        "--unsafe_serialization",
        "--unsafe-serialization",
        action="store_true",
        default=False,
        help="Save the merged weights as .bin (pickle) rather than .safetensors (not recommended).",
    )
    parser.add_argument(
        "--remove_checkpoint_dir",
        "--remove-checkpoint-dir",
        action="store_true",
        default=False,
        help="Remove the checkpoint directory after merging.",
    )
    if subparsers is not None:
        parser.set_defaults(func=merge_command)
    return parser


def merge_command(args: argparse.Namespace) -> None:
    """Merge as ``args`` (from ``merge_command_parser``) say.

    Raises:
        MergeUnavailable: x-runtime is not installed (``pip install x-runtime``).
    """
    try:
        import x_runtime
    except ImportError:
        raise MergeUnavailable(
            "merge-weights needs x-runtime, which reads and writes the checkpoint: pip install x-runtime"
        ) from None
    merge_fsdp_weights = getattr(x_runtime, "merge_fsdp_weights", None)
    if merge_fsdp_weights is None:
        raise MergeUnavailable("this x-runtime has no merge_fsdp_weights: pip install -U x-runtime")
    merge_fsdp_weights(
        args.checkpoint_directory,
        args.output_path,
        safe_serialization=not args.unsafe_serialization,
        remove_checkpoint_dir=args.remove_checkpoint_dir,
    )
