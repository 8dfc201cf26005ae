"""The command line's spellings x-estimate accepts beside its own: Accelerate's and x-launch's.

``--dtypes float32 float16`` (Accelerate's multi-value form), ``--seq_len`` for ``--seq-len``,
and ``bf16``/``fp16``/``fp32`` for the dtype names, as x-launch's ``--mixed_precision`` spells them.
"""

from __future__ import annotations

from typing import Any

import click

from x_estimate.report.table import DTYPES

__all__ = ["DTYPE_ALIASES", "DtypeChoice", "dashed_options", "spread_multi_value"]

DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


class DtypeChoice(click.Choice):
    """A dtype name, or x-launch's short spelling of one (given back as the name)."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        return super().convert(DTYPE_ALIASES.get(value, value), param, ctx)


def spread_multi_value(argv: list[str], option: str) -> list[str]:
    """Let ``--dtypes float32 float16`` (Accelerate's spelling) reach click as repeated options."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            out += argv[i:]
            break
        if arg.startswith(option + "="):
            out += [x for v in arg.split("=", 1)[1].split(",") if v for x in (option, v)]
        elif arg == option:
            i += 1
            took = 0
            # Take words while they are dtypes, so "--dtypes float32 float16 MODEL" leaves MODEL;
            # a first word that is no dtype is still taken, for click to name it as invalid.
            while i < len(argv) and not argv[i].startswith("-"):
                values = [v for v in argv[i].split(",") if v]
                if took and not all(v in DTYPES or v in DTYPE_ALIASES for v in values):
                    break
                out += [x for v in values for x in (option, v)]
                took += 1
                i += 1
            if not took:
                out.append(option)
            continue
        else:
            out.append(arg)
        i += 1
    return out


def dashed_options(argv: list[str], known: set[str]) -> list[str]:
    """``--seq_len 8`` reads as ``--seq-len 8``: Accelerate's underscore spelling of every dashed option."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if arg == "--":
            return out + argv[i:]
        name, eq, value = arg.partition("=")
        if name.startswith("--") and "_" in name and name not in known and name.replace("_", "-") in known:
            arg = name.replace("_", "-") + eq + value
        out.append(arg)
    return out
