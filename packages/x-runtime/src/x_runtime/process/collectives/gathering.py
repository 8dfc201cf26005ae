"""``gather`` and ``gather_object``: every process's tensors (or objects) on every process, in rank order.

A checked gather used to take two collectives, the header exchange of the shape check and then the
data. Metrics gathers in an eval loop are latency-bound (a (64, 10) float tensor is 2.5 KB), so the
second collective doubled their cost. Here the header and the packed tensors share one buffer
per process, and every process sizes it from the same number without talking: the largest
payload the previous gather on this group carried, which every process read from the same
gathered headers. A process whose payload does not fit sends its header alone; the headers then
say so on every process, and the data follows in a second collective sized to fit. The first
gather on a group, a header that overflows, and payloads above ``_FOLD_BYTES`` take the
two-collective path, where small tensors still travel packed in one byte buffer and tensors
whose first dimension differs across processes are padded, gathered and trimmed. The structure,
dtype and shape checks run on every call either way.
"""

from __future__ import annotations

import ctypes
import struct
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from x_runtime.core.nested import apply
from x_runtime.process.collectives.debug import debug_mode, verify_operation
from x_runtime.process.collectives.errors import DistributedOperationException
from x_runtime.process.collectives.shapes import (
    HEADER,
    META_WORDS,
    Table,
    all_gather_words,
    by_rank,
    dtype_name,
    header_of,
    raise_local_problems,
    rebuild,
    table_from_rows,
    walk_tensors,
)
from x_runtime.process.collectives.transfer import (
    all_gather_rows,
    as_rows,
    data_device,
    gather_into,
    meta_device,
    numel,
    object_group,
    row_count,
)
from x_runtime.process.collectives.world import world_size

__all__ = ["gather", "gather_object"]

# Tensors up to this size travel together in one byte buffer on the two-collective path: below it
# a collective's latency costs more than the copies into and out of the buffer.
_PACK_BYTES = 1 << 20

# Above this a payload's own transfer dwarfs a header exchange, and padding every process's
# buffer to the largest one would cost more than the collective it saves.
_FOLD_BYTES = 1 << 20


# Below this the reservation only grows: padding a latency-bound collective costs next to nothing,
# and a loop that alternates two structures then folds both. Above it, it follows the latest call,
# so one large gather does not pad every small one after it.
_KEEP_BYTES = 1 << 16


@dataclass
class _Fold:
    backend: str
    words: int = META_WORDS  # header words every process reserves
    payload: int | None = None  # payload bytes every process reserves; None: take two collectives


_CPU = torch.device("cpu")

# Per process group, so a group destroyed and created again starts over (the same on every rank).
_FOLDS: weakref.WeakKeyDictionary[Any, _Fold] = weakref.WeakKeyDictionary()


def _gather_tensors(data: Any, world: int) -> list[torch.Tensor]:
    """Every tensor of ``data`` (in ``nested.apply``'s order) gathered from all processes along dim 0, in rank order."""
    walk = walk_tensors(data)
    words = header_of(walk)
    group = dist.group.WORLD
    fold = _FOLDS.get(group)
    if fold is None:
        fold = _FOLDS[group] = _Fold(backend=dist.get_backend(group))
    tensors = [_plain(tensor) for tensor in walk.tensors]
    if fold.payload is not None:
        folded = _gather_folded_host if _in_host_memory(fold, tensors) else _gather_folded
        done = folded(walk, words, tensors, fold, world)
        if isinstance(done, list):
            return done
        table, results = done
    else:
        # The header exchange is sized by the agreed reservation and grows in a second round if needed.
        table = table_from_rows("gather", walk, all_gather_words(words, world, fold.words))
        _check_gatherable(table)
        table.tensors = tensors
        results = _gather_checked(table, world)
    fold.words = max(fold.words, _header_words(table))
    fold.payload = _reserve(max(_payloads(table)), fold.payload)
    return results


def _gather_folded(
    walk: Any, words: list[int], tensors: list[torch.Tensor], fold: _Fold, world: int
) -> list[torch.Tensor] | tuple[Table, list[torch.Tensor]]:
    """The one-collective gather: its results when every process sent the same header, else the table too."""
    assert fold.payload is not None
    header = fold.words * 8
    block = header + fold.payload
    device = _device(fold, tensors)
    # A header longer than the reservation goes truncated: its first word, the length, tells everyone.
    sent = words[: fold.words]
    parts = [torch.tensor(sent + [0] * (fold.words - len(sent)), dtype=torch.int64, device=device).view(torch.uint8)]
    mine = [tensor.element_size() * tensor.numel() for tensor in tensors]
    used = sum(mine)
    if used <= fold.payload:
        parts += [tensor.contiguous().view(-1).view(torch.uint8).to(device) for tensor in tensors]
    else:
        used = 0
    if used < fold.payload:
        parts.append(torch.empty(fold.payload - used, dtype=torch.uint8, device=device))  # never read
    local = torch.cat(parts) if len(parts) > 1 else parts[0]
    gathered = torch.empty(world * block, dtype=torch.uint8, device=device)
    gather_into(gathered, local)
    blocks = gathered.view(world, block)
    rows = gathered.view(torch.int64).view(world, block // 8)[:, : fold.words].tolist()
    if rows[0][0] <= fold.words and not rows[0][1] and used == sum(mine) and all(row == rows[0] for row in rows[1:]):
        # Every process sent this one's header: same structure, dtypes and shapes, all data here.
        fold.payload = _reserve(used, fold.payload)
        return _same_shapes(blocks, header, tensors, mine, world)
    return _settle(walk, words, tensors, fold, world, rows, blocks)


def _settle(
    walk: Any,
    words: list[int],
    tensors: list[torch.Tensor],
    fold: _Fold,
    world: int,
    rows: list[list[int]],
    blocks: torch.Tensor,
) -> tuple[Table, list[torch.Tensor]]:
    """The headers differ (or overflowed): the agreed table, and the data from the buffer or a second collective."""
    assert fold.payload is not None
    header = fold.words * 8
    needed = max(row[0] for row in rows)
    if needed > fold.words:  # some header did not fit: every process sees it and exchanges again
        rows = all_gather_words(words, world, needed)
    table = table_from_rows("gather", walk, rows)
    _check_gatherable(table)
    table.tensors = tensors
    if needed > fold.words or max(_payloads(table)) > fold.payload:
        return table, _gather_checked(table, world)
    return table, _uneven_rows(blocks, header, table, world)


def _gather_folded_host(
    walk: Any, words: list[int], tensors: list[torch.Tensor], fold: _Fold, world: int
) -> list[torch.Tensor] | tuple[Table, list[torch.Tensor]]:
    """``_gather_folded`` for contiguous CPU tensors on a CPU backend, bytes moved by ``memmove``.

    The same buffer and the same outcome; what differs is the cost. A (64, 10) metrics gather's
    collective takes about 250 us on gloo, and each torch op around it (header tensor, views,
    cat, the header's ``tolist``, a strided copy per tensor) a few us, together a fifth of the
    collective. Here the header goes in as packed bytes, the data by one ``memmove`` per tensor,
    and headers are compared as bytes.
    """
    assert fold.payload is not None
    header = fold.words * 8
    block = header + fold.payload
    mine = [tensor.element_size() * tensor.numel() for tensor in tensors]
    used = sum(mine)
    sent = words[: fold.words]
    packed = struct.pack(f"{fold.words}q", *sent, *[0] * (fold.words - len(sent)))
    local = torch.empty(block, dtype=torch.uint8)
    base = local.data_ptr()
    ctypes.memmove(base, packed, header)
    fits = used <= fold.payload
    at = base + header
    for tensor, size in zip(tensors, mine, strict=True):
        if fits and size:
            ctypes.memmove(at, tensor.data_ptr(), size)
        at += size
    gathered = torch.empty(world * block, dtype=torch.uint8)
    gather_into(gathered, local)
    start = gathered.data_ptr()
    mine_whole = fits and words[0] <= fold.words and not words[1]
    if mine_whole and all(ctypes.string_at(start + r * block, header) == packed for r in range(world)):
        fold.payload = _reserve(used, fold.payload)
        return _same_shapes_host(start, block, header, tensors, mine, world)
    rows = [
        list(struct.unpack_from(f"{fold.words}q", ctypes.string_at(start + r * block, header))) for r in range(world)
    ]
    return _settle(walk, words, tensors, fold, world, rows, gathered.view(world, block))


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    # Collectives write untracked tensors, and move bytes: a lazy conjugate's or negation's bytes are
    # not its values (and refuse a byte view), so those are resolved first.
    tensor = tensor.detach()
    return tensor.resolve_conj().resolve_neg() if tensor.is_conj() or tensor.is_neg() else tensor


def _in_host_memory(fold: _Fold, tensors: list[torch.Tensor]) -> bool:
    return fold.backend in ("gloo", "mpi") and all(t.device.type == "cpu" and t.is_contiguous() for t in tensors)


def _same_shapes_host(
    start: int, block: int, header: int, tensors: list[torch.Tensor], sizes: list[int], world: int
) -> list[torch.Tensor]:
    results = []
    at = header
    for tensor, size in zip(tensors, sizes, strict=True):
        joined = torch.empty((world * row_count(tuple(tensor.shape)), *tensor.shape[1:]), dtype=tensor.dtype)
        out = joined.data_ptr()
        if size:
            for r in range(world):
                ctypes.memmove(out + r * size, start + r * block + at, size)
        results.append(joined)
        at += size
    return results


def _same_shapes(
    blocks: torch.Tensor, header: int, tensors: list[torch.Tensor], sizes: list[int], world: int
) -> list[torch.Tensor]:
    results = []
    at = header
    for tensor, size in zip(tensors, sizes, strict=True):
        joined = blocks[:, at : at + size].contiguous().view(tensor.dtype)
        results.append(joined.view(world * row_count(tuple(tensor.shape)), *tensor.shape[1:]).to(tensor.device))
        at += size
    return results


def _uneven_rows(blocks: torch.Tensor, header: int, table: Table, world: int) -> list[torch.Tensor]:
    results = []
    offsets = [header] * world
    for i, tensor in enumerate(table.tensors):
        pieces = []
        for r in range(world):
            size = tensor.element_size() * numel(table.shapes[i][r])
            pieces.append(blocks[r, offsets[r] : offsets[r] + size])
            offsets[r] += size
        rows_total = sum(row_count(shape) for shape in table.shapes[i])
        joined = torch.cat(pieces).view(tensor.dtype).view(rows_total, *tensor.shape[1:])
        results.append(joined.to(tensor.device))
    return results


def _device(fold: _Fold, tensors: list[torch.Tensor]) -> torch.device:
    # As transfer.data_device, with the group's backend read once.
    if fold.backend in ("gloo", "mpi") or not tensors:
        return _CPU if fold.backend in ("gloo", "mpi") else meta_device()
    if fold.backend in ("nccl", "xla"):
        return meta_device()
    return tensors[0].device


def _reserve(largest: int, reserved: int | None) -> int | None:
    if largest > _FOLD_BYTES:
        return None
    kept = max(largest, reserved or 0)
    kept = kept if kept <= _KEEP_BYTES else largest
    return -(-kept // 8) * 8  # whole int64 words, so each block's header reads as int64 in place


def _payloads(table: Table) -> list[int]:
    """Each process's payload in bytes, from the agreed table (dtypes already checked equal)."""
    world = len(table.shapes[0]) if table.shapes else 0
    sizes = [0] * max(world, 1)
    for tensor, shapes in zip(table.tensors, table.shapes, strict=True):
        for r, shape in enumerate(shapes):
            sizes[r] += tensor.element_size() * numel(shape)
    return sizes


def _header_words(table: Table) -> int:
    """The longest header any process sent, from the agreed table."""
    world = len(table.shapes[0]) if table.shapes else 1
    return max(HEADER + sum(2 + len(shapes[r]) for shapes in table.shapes) for r in range(world))


def _check_gatherable(table: Table) -> None:
    for i, path in enumerate(table.paths):
        at = f" at {path}" if path else ""
        if len(set(table.dtypes[i])) > 1:
            names = [dtype_name(code) for code in table.dtypes[i]]
            raise DistributedOperationException(
                f"gather: dtypes differ across processes{at}: {by_rank(names)}; cast them to one dtype"
            )
        if len({shape[1:] for shape in table.shapes[i]}) > 1:
            raise DistributedOperationException(
                f"gather: shapes differ across processes beyond dim 0{at}: {by_rank(map(str, table.shapes[i]))}; "
                "pad them with pad_across_processes or make them agree"
            )


def _gather_checked(table: Table, world: int) -> list[torch.Tensor]:
    itemsizes = [tensor.element_size() for tensor in table.tensors]
    nbytes = [
        [itemsize * numel(shape) for shape in shapes] for itemsize, shapes in zip(itemsizes, table.shapes, strict=True)
    ]
    small = [i for i, sizes in enumerate(nbytes) if max(sizes) <= _PACK_BYTES]
    results: list[torch.Tensor | None] = [None] * len(table.tensors)
    if len(small) > 1:  # packing pays off only when it saves a collective
        for i, result in zip(small, _gather_packed(table, small, nbytes, world), strict=True):
            results[i] = result
    for i, tensor in enumerate(table.tensors):
        if results[i] is None:
            results[i] = _gather_one(tensor, [row_count(shape) for shape in table.shapes[i]], world)
    return results  # type: ignore[return-value]


def _gather_packed(table: Table, which: list[int], nbytes: list[list[int]], world: int) -> list[torch.Tensor]:
    """The small tensors ``which`` gathered in one collective, as bytes in one buffer per process."""
    me = dist.get_rank()
    offsets = [[0] * world for _ in which]  # offsets[k][rank] of tensor which[k] in that rank's block
    totals = [0] * world
    for k, i in enumerate(which):
        for r in range(world):
            offsets[k][r] = totals[r]
            totals[r] += nbytes[i][r]
    block = max(totals)
    device = data_device(table.tensors[which[0]])
    local = torch.empty(block, dtype=torch.uint8, device=device)
    for k, i in enumerate(which):
        start = offsets[k][me]
        local[start : start + nbytes[i][me]].copy_(table.tensors[i].contiguous().view(-1).view(torch.uint8))
    gathered = all_gather_rows(local, world) if block else local
    results = []
    for k, i in enumerate(which):
        tensor = table.tensors[i]
        pieces = [gathered[r * block + offsets[k][r] : r * block + offsets[k][r] + nbytes[i][r]] for r in range(world)]
        rows = sum(row_count(shape) for shape in table.shapes[i])
        joined = torch.cat(pieces).view(tensor.dtype).view(rows, *tensor.shape[1:])
        results.append(joined.to(tensor.device))
    return results


def _gather_one(tensor: torch.Tensor, rows: list[int], world: int) -> torch.Tensor:
    longest = max(rows)
    local = as_rows(tensor).to(data_device(tensor)).contiguous()
    if local.shape[0] < longest:
        padded = local.new_empty((longest, *local.shape[1:]))
        padded[: local.shape[0]] = local
        local = padded
    gathered = all_gather_rows(local, world)
    if any(count != longest for count in rows):
        gathered = torch.cat([gathered[r * longest : r * longest + rows[r]] for r in range(world)])
    return gathered.to(tensor.device)


def gather(data: Any, *, debug: bool | None = None) -> Any:
    """Every tensor in ``data`` gathered from all processes and concatenated along dim 0 in rank order.

    Containers are rebuilt around the results. A 0-d tensor counts as one row, so gathering a
    scalar gives a 1-d tensor of ``world_size()`` values (on one process too). Processes must agree
    on the structure, the dtypes and every dim but the first: otherwise all of them raise the same
    ``ValueError``. Dim 0 may differ (unlike Accelerate): each process's rows are padded, gathered
    and trimmed back, so nothing needs ``pad_across_processes`` first. Results are on the device of
    the input tensor. On one process the input tensors themselves come back (0-d ones as views).
    Gathered tensors carry no autograd history (as in Accelerate): a tensor that requires grad
    is gathered like any other. The shapes are checked always, so ``debug`` changes nothing here.

    Args:
        data: A tensor, or nested lists/tuples/named tuples/dicts of tensors.

    Returns:
        The same structure with every tensor replaced by the concatenation of all processes' tensors.

    Raises:
        DistributedOperationException: (a ``ValueError``) Processes passed different structures,
            dtypes, or shapes beyond dim 0.
        TypeError: Some process passed a leaf that is not a tensor.

    Examples:
        >>> import torch
        >>> gather({"preds": torch.tensor([1, 2]), "loss": torch.tensor(0.5)})
        {'preds': tensor([1, 2]), 'loss': tensor([0.5000])}
    """
    world = world_size()
    if world == 1:
        raise_local_problems("gather", walk_tensors(data))
        return apply(as_rows, data)
    return rebuild(data, _gather_tensors(data, world))


def gather_object(obj: Any, *, debug: bool | None = None) -> list[Any]:
    """Every process's list, concatenated in rank order (Accelerate semantics).

    A list contributes its items; anything else, tuples and dicts included, contributes itself as
    one item (Accelerate would spread a tuple, a dict's keys or a string's characters). Objects go
    through pickle, so keep them small.

    Args:
        obj: A list of picklable objects, or one picklable object.

    Returns:
        A new list: rank 0's items, then rank 1's, and so on.

    Examples:
        >>> gather_object(["a", "b"])
        ['a', 'b']
        >>> gather_object({"id": 3})
        [{'id': 3}]
    """
    world = world_size()
    if world == 1:
        return list(obj) if isinstance(obj, list) else [obj]
    if debug_mode(debug):
        verify_operation(
            "x_runtime.process.collectives.gather_object", obj, key=lambda _obj: None, group=object_group()
        )
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, obj, group=object_group())
    out: list[Any] = []
    for item in gathered:
        if isinstance(item, list):
            out.extend(item)
        else:
            out.append(item)
    return out
