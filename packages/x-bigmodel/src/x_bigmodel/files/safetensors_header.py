"""A safetensors header read exactly as the ``safetensors`` library (0.8) reads it.

The file is an 8-byte little-endian header length ``n``, ``n`` bytes of UTF-8 JSON
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}`` and the
tensor bytes. ``parse_header`` accepts the files ``safetensors.safe_open`` accepts and rejects the
others with a one-line reason, so a checkpoint loads with x exactly when it loads with
safetensors. The rules, from the library's Rust reader (serde):

* ``n`` is at most 100,000,000 and ``8 + n`` fits in the file; the header is UTF-8 JSON (no
  ``NaN``, no lone surrogate escapes), an object;
* ``__metadata__`` is ``null`` or an object of strings; given twice, it is refused;
* a tensor entry is an object with ``dtype``, ``shape`` and ``data_offsets`` (each once; other
  fields ignored) or the list ``[dtype, shape, data_offsets]``; ``dtype`` is one of
  ``FORMAT_DTYPES`` (or ``{"F32": null}``); dims and offsets are JSON integers in ``[0, 2**64)``;
  a name given twice keeps its last entry;
* sorted by offsets, tensors tile the data from byte 0 with no gap or overlap, each spans exactly
  ``numel * bits / 8`` bytes (a whole number of bytes, computed without overflowing 64 bits), and
  the last one ends where the file ends.

A tensor torch cannot hold (``F6_*``, or a dtype this torch lacks) does not make the file
unreadable: its entry carries a ``problem``, raised when that tensor is loaded (as safetensors
raises at ``get_tensor``).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import torch

__all__ = ["FORMAT_DTYPES", "MAX_HEADER_BYTES", "TensorEntry", "parse_header", "torch_dtype_for"]

# Every dtype safetensors 0.8 knows: bits per element, and the torch dtype it maps to (by name,
# since older torch builds lack the newer ones). F6 formats have no torch dtype at all.
FORMAT_DTYPES: dict[str, tuple[int, str | None]] = {
    "BOOL": (8, "bool"),
    "F4": (4, "float4_e2m1fn_x2"),
    "F6_E2M3": (6, None),
    "F6_E3M2": (6, None),
    "U8": (8, "uint8"),
    "I8": (8, "int8"),
    "F8_E5M2": (8, "float8_e5m2"),
    "F8_E4M3": (8, "float8_e4m3fn"),
    "F8_E8M0": (8, "float8_e8m0fnu"),
    "F8_E4M3FNUZ": (8, "float8_e4m3fnuz"),
    "F8_E5M2FNUZ": (8, "float8_e5m2fnuz"),
    "I16": (16, "int16"),
    "U16": (16, "uint16"),
    "F16": (16, "float16"),
    "BF16": (16, "bfloat16"),
    "I32": (32, "int32"),
    "U32": (32, "uint32"),
    "F32": (32, "float32"),
    "C64": (64, "complex64"),
    "F64": (64, "float64"),
    "I64": (64, "int64"),
    "U64": (64, "uint64"),
}
MAX_HEADER_BYTES = 100_000_000
_U64 = 2**64
# torch sizes are signed 64-bit.
_TORCH_MAX_DIM = 2**63 - 1
_FIELDS = ("dtype", "shape", "data_offsets")


class TensorEntry:
    """Where one tensor lies in its file: absolute byte offset, size, dtype and (torch) shape.

    ``format_dtype`` is the header's name (``"F16"``). ``problem`` says why torch cannot hold the
    tensor (then ``dtype`` is ``None``); ``checked()`` raises it.
    """

    __slots__ = ("dtype", "format_dtype", "nbytes", "offset", "problem", "shape")

    def __init__(
        self,
        offset: int,
        nbytes: int,
        dtype: torch.dtype | None,
        shape: tuple[int, ...],
        format_dtype: str = "",
        problem: str | None = None,
    ) -> None:
        self.offset, self.nbytes, self.dtype, self.shape = offset, nbytes, dtype, shape
        self.format_dtype, self.problem = format_dtype, problem

    def checked(self) -> TensorEntry:
        if self.problem is not None:
            raise ValueError(self.problem)
        return self


class _Refused(ValueError):
    """A header safetensors refuses; the text is the reason."""


class _Float(float):
    """A JSON number written with a fraction or exponent: never a size or an offset."""


def torch_dtype_for(format_dtype: str) -> torch.dtype | None:
    """The torch dtype safetensors reads ``format_dtype`` as, ``None`` where this torch has none."""
    name = FORMAT_DTYPES[format_dtype][1]
    found = getattr(torch, name, None) if name else None
    return found if isinstance(found, torch.dtype) else None


def parse_header(fd: int, path: Path) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    """The tensors and metadata of the open safetensors file ``fd``, checked as safetensors checks them.

    Raises:
        ValueError: ``cannot read checkpoint file '<path>': <reason>; ...`` (one line).
    """
    try:
        return _parse(fd, path)
    except _Refused as exc:
        raise ValueError(
            f"cannot read checkpoint file {str(path)!r}: {exc}; the file is corrupt or truncated (an interrupted "
            "download or save?) or not a safetensors file; download or save it again"
        ) from None


def _parse(fd: int, path: Path) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    size = os.fstat(fd).st_size
    if size < 8:
        raise _Refused(f"it is {size} bytes long, shorter than a safetensors header")
    (length,) = struct.unpack("<Q", os.pread(fd, 8, 0))
    if length > MAX_HEADER_BYTES:
        raise _Refused(f"its header claims {length} bytes, more than the format's {MAX_HEADER_BYTES}")
    if 8 + length > size:
        raise _Refused(f"its header claims {length} bytes but the file has {size}")
    raw = os.pread(fd, length, 8)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Refused(f"its header is not UTF-8 (byte {exc.start})") from None
    header = _load_json(text)
    metadata, infos = _split(header)
    entries = _entries(infos, path, 8 + length, size)
    return entries, metadata


def _load_json(text: str) -> _Pairs:
    def no_constant(word: str) -> Any:
        raise _Refused(f"its header is not valid JSON ({word} is not a JSON value)")

    try:
        header = json.loads(
            text, object_pairs_hook=_Pairs, parse_float=_Float, parse_constant=no_constant, parse_int=_integer
        )
    except _Refused:
        raise
    except ValueError as exc:  # json.JSONDecodeError
        raise _Refused(f"its header is not valid JSON ({exc})") from None
    if not isinstance(header, _Pairs):
        raise _Refused(f"its header is JSON {type(header).__name__}, not an object")
    return header


def _integer(literal: str) -> int | _Float:
    # serde reads "-0" and integers past u64 as floats: neither is a size.
    if literal.startswith("-"):
        return _Float(literal) if literal == "-0" else int(literal)
    value = int(literal)
    return _Float(literal) if value >= _U64 else value


class _Pairs(dict[str, Any]):
    """A JSON object that remembers every key in order, repeated ones too (serde refuses some)."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)  # the last of a repeated key wins, as in serde's maps
        self.names = [k for k, _ in pairs]
        for key, _ in pairs:
            _utf8(key)


def _utf8(text: str) -> None:
    # Python's json keeps lone surrogate escapes ("\ud800"); serde refuses them.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _Refused("its header is not valid JSON (a string holds a lone surrogate escape)") from None


def _split(header: _Pairs) -> tuple[dict[str, str], dict[str, Any]]:
    if header.names.count("__metadata__") > 1:
        raise _Refused("its header gives __metadata__ twice")
    metadata = header.get("__metadata__")
    if metadata is None:
        metadata = {}
    elif not isinstance(metadata, dict):
        raise _Refused(f"its __metadata__ is {_kind(metadata)}, not an object of strings")
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise _Refused(f"its __metadata__ value for {key!r} is {_kind(value)}, not a string")
        _utf8(value)
    return dict(metadata), {k: v for k, v in header.items() if k != "__metadata__"}


def _entries(infos: dict[str, Any], path: Path, start: int, size: int) -> dict[str, TensorEntry]:
    parsed = [(name, *_fields(name, info)) for name, info in infos.items()]
    parsed.sort(key=lambda item: item[3])  # by (begin, end), as safetensors validates them
    entries: dict[str, TensorEntry] = {}
    end_of_data = 0
    for name, format_dtype, shape, (begin, end) in parsed:
        if begin != end_of_data or end < begin:
            where = "overlaps the tensor before it" if begin < end_of_data else "leaves a gap before it"
            if end < begin:
                where = "ends before it begins"
            raise _Refused(f"tensor {name!r} has data_offsets [{begin}, {end}], which {where}")
        end_of_data = end
        nbytes = _nbytes(name, format_dtype, shape)
        if end - begin != nbytes:
            raise _Refused(
                f"tensor {name!r} spans {end - begin} bytes but shape {list(shape)} of {format_dtype} needs {nbytes}"
            )
        dtype, torch_shape, problem = _torch_view(path, name, format_dtype, shape)
        entries[name] = TensorEntry(start + begin, nbytes, dtype, torch_shape, format_dtype, problem)
    if start + end_of_data != size:
        raise _Refused(f"it is {size} bytes long but its header describes {start + end_of_data}")
    return entries


def _fields(name: str, info: Any) -> tuple[str, tuple[int, ...], tuple[int, int]]:
    if isinstance(info, list):
        if len(info) != len(_FIELDS):
            raise _Refused(f"tensor {name!r} is a list of {len(info)} items, not [dtype, shape, data_offsets]")
        values = dict(zip(_FIELDS, info, strict=True))
    elif isinstance(info, _Pairs):
        for field in _FIELDS:
            count = info.names.count(field)
            if count != 1:
                raise _Refused(f"tensor {name!r} gives {field!r} {'twice' if count else 'nowhere'}")
        values = info
    else:
        raise _Refused(f"tensor {name!r} is {_kind(info)}, not an object with dtype, shape and data_offsets")
    format_dtype = values["dtype"]
    if isinstance(format_dtype, dict) and len(format_dtype) == 1 and None in format_dtype.values():
        (format_dtype,) = format_dtype  # serde's {"F32": null} spelling of a unit variant
    if not isinstance(format_dtype, str) or format_dtype not in FORMAT_DTYPES:
        raise _Refused(f"tensor {name!r} has dtype {format_dtype!r}; safetensors knows {', '.join(FORMAT_DTYPES)}")
    shape = values["shape"]
    if not isinstance(shape, list) or not all(_is_size(d) for d in shape):
        raise _Refused(f"tensor {name!r} has shape {shape!r}, not a list of integers >= 0")
    offsets = values["data_offsets"]
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_size(o) for o in offsets):
        raise _Refused(f"tensor {name!r} has data_offsets {offsets!r}, not [begin, end] as integers >= 0")
    return format_dtype, tuple(shape), (offsets[0], offsets[1])


def _is_size(value: Any) -> bool:
    return type(value) is int and 0 <= value < _U64


def _nbytes(name: str, format_dtype: str, shape: tuple[int, ...]) -> int:
    numel = 1
    for dim in shape:  # left to right, as safetensors does: [0, huge, huge] is fine, [huge, huge, 0] is not
        numel *= dim
        if numel >= _U64:
            raise _Refused(f"tensor {name!r} has shape {list(shape)}, too large to address")
    bits = numel * FORMAT_DTYPES[format_dtype][0]
    if bits >= _U64:
        raise _Refused(f"tensor {name!r} has shape {list(shape)}, too large to address")
    if bits % 8:
        raise _Refused(f"tensor {name!r} ({list(shape)} of {format_dtype}) does not fill a whole number of bytes")
    return bits // 8


def _torch_view(
    path: Path, name: str, format_dtype: str, shape: tuple[int, ...]
) -> tuple[torch.dtype | None, tuple[int, ...], str | None]:
    """The torch dtype and shape ``name`` loads as, or why it cannot be loaded."""
    prefix = f"cannot load tensor {name!r} from {str(path)!r}: "
    dtype = torch_dtype_for(format_dtype)
    if dtype is None:
        wanted = FORMAT_DTYPES[format_dtype][1]
        lacks = f"torch {torch.__version__} has no torch.{wanted}" if wanted else "torch has no such dtype"
        return None, shape, prefix + f"its dtype {format_dtype} cannot be held in a torch tensor ({lacks})"
    if any(d > _TORCH_MAX_DIM for d in shape):
        return None, shape, prefix + f"its shape {list(shape)} has a dimension torch cannot hold"
    if format_dtype == "F4":
        # torch packs two F4 values per element, along the last dimension.
        if not shape or shape[-1] % 2:
            return None, shape, prefix + f"F4 shape {list(shape)} needs an even last dimension to load as {dtype}"
        shape = (*shape[:-1], shape[-1] // 2)
    return dtype, shape, None


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"
