"""The cheap shape check that runs before every gather or pad: one small all_gather of a description.

Every process describes its nested structure (tensor count, dtypes, shapes) in a fixed-size int64
tensor; after one all_gather, all processes hold the same table and so raise the same error, or
none, instead of hanging in a collective whose sizes disagree.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from x_runtime.core.nested import apply, is_namedtuple
from x_runtime.process.collectives.errors import DistributedOperationException
from x_runtime.process.collectives.transfer import gather_into, meta_device, object_group

__all__ = [
    "HEADER",
    "META_WORDS",
    "Table",
    "Walk",
    "all_gather_words",
    "by_rank",
    "check_shapes",
    "dtype_name",
    "header_of",
    "raise_local_problems",
    "rebuild",
    "table_from_rows",
    "walk_tensors",
]

# A tensor all_gather costs about a sixth of an all_gather_object on gloo (pickling plus two
# collectives). 32 words hold the header and a handful of 2-4-d tensors, the usual metrics
# batch; a larger structure takes a second round sized to fit (every process sees that).
META_WORDS = 32


HEADER = 4  # words needed, problem flag, structure fingerprint, tensor count


@dataclass
class Walk:
    """One process's nested input, flattened: its tensors, where they sit, and what no collective carries."""

    paths: list[str]  # where each tensor sits, in nested.apply's order
    tensors: list[torch.Tensor]
    problems: list[str]  # leaves no collective can carry
    signature: str  # every leaf's path and kind: equal on every process iff the structures match


def walk_tensors(data: Any) -> Walk:
    """``data``'s tensors and leaves, visited in ``nested.apply``'s order."""
    # Must visit in exactly nested.apply's order: results are put back with apply.
    paths: list[str] = []
    tensors: list[torch.Tensor] = []
    problems: list[str] = []
    leaves: list[str] = []

    def visit(value: Any, path: str) -> None:
        if isinstance(value, torch.Tensor):
            if value.layout != torch.strided or value.is_nested:
                problems.append(f"a {value.layout} tensor at {path or 'the top level'}")
            paths.append(path)
            tensors.append(value)
            leaves.append(f"{path}:T")
        elif is_namedtuple(value):
            for field, item in zip(value._fields, value, strict=True):
                visit(item, f"{path or 'data'}.{field}")
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                visit(item, f"{path or 'data'}[{index}]")
        elif isinstance(value, Mapping):
            for key, item in value.items():
                visit(item, f"{path or 'data'}[{key!r}]")
        else:
            problems.append(f"{type(value).__name__} at {path or 'the top level'}")
            leaves.append(f"{path}:{type(value).__name__}")

    visit(data, "")
    return Walk(paths, tensors, problems, "|".join(leaves))


def _problem_text(op: str, details: str) -> str:
    return f"{op}: expected tensors or nested lists/tuples/dicts of tensors; {details}"


def raise_local_problems(op: str, walk: Walk) -> None:
    """TypeError naming ``op`` when this process's input has leaves no collective carries."""
    if walk.problems:
        raise TypeError(_problem_text(op, "got " + ", ".join(walk.problems[:5])))


def rebuild(data: Any, results: list[torch.Tensor]) -> Any:
    """``data``'s containers around ``results``, one per tensor in ``walk``'s order."""
    replacements = iter(results)
    return apply(lambda _tensor: next(replacements), data)


@dataclass
class Table:
    """Every process's shapes and dtypes for one input, the same on every process."""

    paths: list[str]
    tensors: list[torch.Tensor]  # this process's
    shapes: list[list[tuple[int, ...]]]  # shapes[tensor][rank]
    dtypes: list[list[int]]  # dtype codes, dtypes[tensor][rank]


def check_shapes(op: str, data: Any, world: int) -> Table:
    """Every process's shapes and dtypes for ``data``, after checking that the structures match.

    One all_gather of a fixed-size int64 tensor in the common case (a second, sized to fit, only
    when some process's description overflows it). Raises on every process or on none.
    """
    walked = walk_tensors(data)
    return table_from_rows(op, walked, all_gather_words(header_of(walked), world))


def header_of(walk: Walk) -> list[int]:
    """This process's header: words needed, problem flag, structure fingerprint, count, then per tensor dtype, ndim, shape."""
    words = [0, int(bool(walk.problems)), _code(walk.signature), len(walk.tensors)]
    for tensor in walk.tensors:
        words += [_code(str(tensor.dtype)), tensor.dim(), *tensor.shape]
    words[0] = len(words)
    return words


def table_from_rows(op: str, walk: Walk, rows: list[list[int]]) -> Table:
    """The table every process builds from the same gathered headers; raises on all of them or on none."""
    world = len(rows)
    if any(row[1] for row in rows):
        problems = _all_gather_objects("; ".join(walk.problems[:5]), world)
        details = "; ".join(f"rank {r} has {text}" for r, text in enumerate(problems) if text)
        raise TypeError(_problem_text(op, details))
    if len({(row[2], row[3]) for row in rows}) > 1:
        # Rare and fatal: a second collective buys a readable message. Every process takes it.
        layouts = _all_gather_objects(_layout_text(walk), world)
        raise DistributedOperationException(
            f"{op}: the nested structure differs across processes: {by_rank(layouts)}; "
            "every process must pass the same containers, keys and lengths"
        )

    shapes: list[list[tuple[int, ...]]] = [[] for _ in walk.tensors]
    dtypes: list[list[int]] = [[] for _ in walk.tensors]
    for row in rows:
        at = HEADER
        for i in range(len(walk.tensors)):
            dtype, ndim = row[at], row[at + 1]
            dtypes[i].append(dtype)
            shapes[i].append(tuple(row[at + 2 : at + 2 + ndim]))
            at += 2 + ndim
    return Table(walk.paths, walk.tensors, shapes, dtypes)


def _layout_text(walk: Walk) -> str:
    shown = [path or "tensor" for path in walk.paths[:8]]
    more = f", and {len(walk.paths) - 8} more" if len(walk.paths) > 8 else ""
    return f"[{', '.join(shown)}{more}]"


def all_gather_words(words: list[int], world: int, capacity: int = META_WORDS) -> list[list[int]]:
    """Every process's header (``header_of``), each as a list; a second round when one overflows ``capacity``."""
    device = meta_device()
    while True:
        local = torch.zeros(capacity, dtype=torch.int64)
        local[: min(len(words), capacity)] = torch.tensor(words[:capacity], dtype=torch.int64)
        local = local.to(device)
        gathered = torch.empty(world * capacity, dtype=torch.int64, device=device)
        gather_into(gathered, local)
        rows = gathered.view(world, capacity).tolist()
        needed = max(row[0] for row in rows)  # the same on every process, so all retry or none
        if needed <= capacity:
            return rows
        capacity = needed


def _all_gather_objects(obj: Any, world: int) -> list[Any]:
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, obj, group=object_group())
    return gathered


@functools.lru_cache(maxsize=512)  # a metrics loop describes the same few structures and dtypes each call
def _code(text: str) -> int:
    return zlib.crc32(text.encode()) & 0x7FFFFFFF


def dtype_name(code: int) -> str:
    """The dtype a header's code stands for, as torch prints it."""
    names = {_code(str(value)): str(value) for value in vars(torch).values() if isinstance(value, torch.dtype)}
    return names.get(code, f"dtype #{code}")


def by_rank(values: Any) -> str:
    """``rank 0 (4, 3), ranks 1-2 (4, 5)``: ranks grouped by what they passed, in rank order."""
    groups: dict[str, list[int]] = {}
    for r, value in enumerate(values):
        groups.setdefault(value, []).append(r)
    parts = []
    for value, ranks in groups.items():
        spans: list[str] = []
        start: int | None = ranks[0]  # None past the last rank, where the loop ends
        for prev, cur in zip(ranks, [*ranks[1:], None], strict=True):
            if cur != prev + 1:
                spans.append(str(start) if start == prev else f"{start}-{prev}")
                start = cur
        label = "rank" if len(ranks) == 1 else "ranks"
        parts.append(f"{label} {', '.join(spans)} {value}")
    return ", ".join(parts)
