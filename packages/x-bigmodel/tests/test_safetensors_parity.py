"""x's safetensors reader accepts exactly the files the installed safetensors accepts.

Every case is real bytes on disk, opened by ``safetensors.safe_open`` and by x's
``SafetensorsFile``: both accept or both refuse; x's refusal is one line naming the file; what both
accept reads to the same tensors, and a tensor safetensors cannot turn into torch (``get_tensor``
fails) is refused by x when that tensor is read, not when the file is opened.
"""

from __future__ import annotations

import json
import re
import struct

import pytest
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from x_bigmodel.files.safetensors_file import SafetensorsFile
from x_bigmodel.files.safetensors_header import FORMAT_DTYPES


def write(path, header, data=b"", length=None):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def info(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def raw(text: str) -> bytes:
    return text.encode()


W4 = '"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'
U64_MAX = 2**64 - 1
# name -> (header, data bytes, header length written instead of the real one)
CASES = {
    "plain": ({"w": info("F32", [2], 0, 8)}, b"\0" * 8, None),
    "empty header": ({}, b"", None),
    "scalar": ({"w": info("F32", [], 0, 4)}, b"\0" * 4, None),
    "zero-size beside another": ({"w": info("F32", [0, 3], 0, 0), "b": info("F32", [1], 0, 4)}, b"\0" * 4, None),
    "two zero-size at 0": ({"w": info("F32", [0], 0, 0), "b": info("F32", [0], 0, 0)}, b"", None),
    "overlapping offsets (bias inside weight)": (
        {"w": info("F32", [2], 0, 8), "b": info("F32", [1], 4, 8)},
        b"\0" * 8,
        None,
    ),
    "same offsets twice": ({"w": info("F32", [2], 0, 8), "b": info("F32", [2], 0, 8)}, b"\0" * 8, None),
    "gap between tensors": ({"w": info("F32", [1], 0, 4), "b": info("F32", [1], 8, 12)}, b"\0" * 12, None),
    "gap at the start": ({"w": info("F32", [1], 4, 8)}, b"\0" * 8, None),
    "end before begin": ({"w": info("F32", [0], 4, 0)}, b"\0" * 4, None),
    "duplicate key, same entry": (raw("{" + W4 + "," + W4 + "}"), b"\0" * 4, None),
    "duplicate key, last wins": (
        raw(
            '{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
        ),
        b"\0" * 8,
        None,
    ),
    "duplicate key, first would fit": (
        raw(
            '{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
        ),
        b"\0" * 8,
        None,
    ),
    "duplicate field": (raw('{"w":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}}'), b"\0" * 4, None),
    "duplicate unknown field": (
        raw('{"w":{"x":1,"x":2,"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'),
        b"\0" * 4,
        None,
    ),
    "unknown field": ({"w": {**info("F32", [1], 0, 4), "note": [1]}}, b"\0" * 4, None),
    "missing field": ({"w": {"dtype": "F32", "data_offsets": [0, 4]}}, b"\0" * 4, None),
    "entry as a list": (raw('{"w":["F32",[1],[0,4]]}'), b"\0" * 4, None),
    "entry as a short list": (raw('{"w":["F32",[1]]}'), b"", None),
    "entry as a long list": (raw('{"w":["F32",[1],[0,4],5]}'), b"\0" * 4, None),
    "entry null": (raw('{"w":null}'), b"", None),
    "entry a number": ({"w": [1, 2]}, b"", None),
    "string offsets": ({"w": {"dtype": "F32", "shape": [1], "data_offsets": ["0", "4"]}}, b"\0" * 4, None),
    "float offsets": ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0.0, 4.0]}}, b"\0" * 4, None),
    "exponent offset": (raw('{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4e0]}}'), b"\0" * 4, None),
    "minus zero offset": (raw('{"w":{"dtype":"F32","shape":[1],"data_offsets":[-0,4]}}'), b"\0" * 4, None),
    "boolean offset": (raw('{"w":{"dtype":"F32","shape":[1],"data_offsets":[false,4]}}'), b"\0" * 4, None),
    "three offsets": ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}}, b"\0" * 4, None),
    "one offset": ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}, b"\0" * 4, None),
    "offsets an object": ({"w": {"dtype": "F32", "shape": [1], "data_offsets": {"a": 0, "b": 4}}}, b"\0" * 4, None),
    "offset past 2**64": ({"w": info("F32", [1], 0, 4), "b": info("F32", [1], 4, 2**70)}, b"\0" * 8, None),
    "metadata of strings": ({"__metadata__": {"format": "pt"}, "w": info("F32", [1], 0, 4)}, b"\0" * 4, None),
    "metadata null": ({"__metadata__": None, "w": info("F32", [1], 0, 4)}, b"\0" * 4, None),
    "metadata empty": ({"__metadata__": {}, "w": info("F32", [1], 0, 4)}, b"\0" * 4, None),
    "metadata int value": ({"__metadata__": {"a": 1}, "w": info("F32", [1], 0, 4)}, b"\0" * 4, None),
    "metadata null value": ({"__metadata__": {"a": None}, "w": info("F32", [1], 0, 4)}, b"\0" * 4, None),
    "metadata nested value": ({"__metadata__": {"a": {"b": "c"}}, "w": info("F32", [1], 0, 4)}, b"\0" * 4, None),
    "metadata a list": ({"__metadata__": ["a"], "w": info("F32", [1], 0, 4)}, b"\0" * 4, None),
    "metadata a string": ({"__metadata__": "x", "w": info("F32", [1], 0, 4)}, b"\0" * 4, None),
    "metadata twice": (raw('{"__metadata__":{"a":"1"},"__metadata__":{"a":"2"},' + W4 + "}"), b"\0" * 4, None),
    "metadata key twice": (raw('{"__metadata__":{"a":"1","a":"2"},' + W4 + "}"), b"\0" * 4, None),
    "NaN in header": (raw('{"__metadata__":{"a":NaN},' + W4 + "}"), b"\0" * 4, None),
    "data past the end": ({"w": info("F32", [2], 0, 8)}, b"\0" * 4, None),
    "bytes after the data": ({"w": info("F32", [1], 0, 4)}, b"\0" * 8, None),
    "header length past the end": ({"w": info("F32", [1], 0, 4)}, b"", 1000),
    "header length over 100 MB": ({}, b"", 100_000_001),
    "header length exactly 100 MB": ({}, b"", 100_000_000),
    "zero header length": (b"", b"", None),
    "non-UTF-8 header": (
        raw('{"w') + b"\xff" + raw('":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'),
        b"\0" * 4,
        None,
    ),
    "UTF-8 BOM": (b"\xef\xbb\xbf" + raw("{" + W4 + "}"), b"\0" * 4, None),
    "lone surrogate escape": (raw('{"w\\ud800":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'), b"\0" * 4, None),
    "surrogate pair escape": (
        raw('{"w\\ud83d\\ude00":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'),
        b"\0" * 4,
        None,
    ),
    "escaped dtype": (raw('{"w":{"dtype":"F\\u00332","shape":[1],"data_offsets":[0,4]}}'), b"\0" * 4, None),
    "control character in a name": (raw('{"w\x01":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'), b"\0" * 4, None),
    "NUL escape in a name": (raw('{"w\\u0000":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'), b"\0" * 4, None),
    "space padding": (raw("{" + W4 + "}     "), b"\0" * 4, None),
    "leading whitespace": (raw("\t\n {" + W4 + "}\r\n"), b"\0" * 4, None),
    "form feed": (raw("\x0c{" + W4 + "}"), b"\0" * 4, None),
    "NUL padding": (raw("{" + W4 + "}") + b"\0\0", b"\0" * 4, None),
    "trailing characters": (raw("{" + W4 + "}x"), b"\0" * 4, None),
    "not an object": (raw("[]"), b"", None),
    "shape/size mismatch": ({"w": info("F32", [2], 0, 4)}, b"\0" * 4, None),
    "negative dim": ({"w": info("F32", [-1], 0, 4)}, b"\0" * 4, None),
    "float dim": ({"w": info("F32", [1.0], 0, 4)}, b"\0" * 4, None),
    "boolean dim": (raw('{"w":{"dtype":"F32","shape":[true],"data_offsets":[0,4]}}'), b"\0" * 4, None),
    "shape a string": (raw('{"w":{"dtype":"F32","shape":"1","data_offsets":[0,4]}}'), b"\0" * 4, None),
    "dim of 2**64 - 1": ({"w": info("F32", [U64_MAX], 0, 4)}, b"\0" * 4, None),
    "dim of 2**64": ({"w": info("F32", [2**64], 0, 4)}, b"\0" * 4, None),
    "numel overflow": ({"w": info("F32", [2**40, 2**40], 0, 4)}, b"\0" * 4, None),
    "bits overflow": ({"w": info("F64", [2**62], 0, 4)}, b"\0" * 4, None),
    "zero first, huge after": ({"w": info("F32", [0, U64_MAX, U64_MAX], 0, 0)}, b"", None),
    "huge first, zero after": ({"w": info("F32", [U64_MAX, U64_MAX, 0], 0, 0)}, b"", None),
    "unknown dtype": ({"w": info("F99", [1], 0, 4)}, b"\0" * 4, None),
    "lower-case dtype": ({"w": info("f32", [1], 0, 4)}, b"\0" * 4, None),
    "dtype null": ({"w": info(None, [1], 0, 4)}, b"\0" * 4, None),
    "dtype as {name: null}": ({"w": info({"F32": None}, [1], 0, 4)}, b"\0" * 4, None),
    "dtype as {name: 1}": ({"w": info({"F32": 1}, [1], 0, 4)}, b"\0" * 4, None),
    "dtype as an empty object": ({"w": info({}, [1], 0, 4)}, b"\0" * 4, None),
    "F4 pair": ({"a": info("F4", [2], 0, 1)}, b"\x21", None),
    "F4 rows": ({"a": info("F4", [3, 4], 0, 6)}, bytes(range(6)), None),
    "F4 odd count": ({"a": info("F4", [3], 0, 2)}, b"\0\0", None),
    "F4 odd last dim": ({"a": info("F4", [2, 1], 0, 1)}, b"\0", None),
    "F4 scalar": ({"a": info("F4", [], 0, 0)}, b"", None),
    "F4 empty": ({"a": info("F4", [0], 0, 0)}, b"", None),
    "F6_E2M3": ({"a": info("F6_E2M3", [4], 0, 3)}, b"\0" * 3, None),
    "F6_E3M2 beside F32": ({"a": info("F6_E3M2", [8], 0, 6), "w": info("F32", [1], 6, 10)}, b"\0" * 10, None),
    "F6 part byte": ({"a": info("F6_E3M2", [1], 0, 1)}, b"\0", None),
}


def their_view(path):
    """(keys, {key: tensor or the exception get_tensor raised}) or the exception safe_open raised."""
    try:
        with safe_open(str(path), framework="pt") as f:
            tensors = {}
            for key in f.keys():  # noqa: SIM118 - a safe_open handle, not a dict
                try:
                    tensors[key] = f.get_tensor(key)
                except Exception as exc:  # whatever the type: only the decision is compared
                    tensors[key] = exc
            return tensors, f.metadata() or {}
    except SafetensorError as exc:
        return exc


def same_tensor(ours: torch.Tensor, theirs: torch.Tensor) -> bool:
    if (ours.dtype, ours.shape) != (theirs.dtype, theirs.shape):
        return False
    return torch.equal(ours.view(-1).view(torch.uint8), theirs.reshape(-1).view(torch.uint8))


def check_same(path) -> str:
    """Open ``path`` with both readers, assert the same decisions, say which it was."""
    theirs = their_view(path)
    try:
        ours = SafetensorsFile(path)
    except ValueError as exc:
        message = str(exc)
        assert isinstance(theirs, Exception), f"x refused what safetensors reads: {message}"
        assert "\n" not in message
        assert message.startswith(f"cannot read checkpoint file {str(path)!r}: ")
        return "refused"
    assert not isinstance(theirs, Exception), f"x accepted what safetensors refuses ({theirs})"
    tensors, metadata = theirs
    with ours:
        assert ours.keys() == sorted(tensors)
        assert ours.metadata == metadata
        for key, expected in tensors.items():
            if isinstance(expected, Exception):
                with pytest.raises(ValueError) as info:
                    ours.read(key)
                assert "\n" not in str(info.value)
                assert str(info.value).startswith(f"cannot load tensor {key!r} from {str(path)!r}: ")
                continue
            assert same_tensor(ours.read(key), expected), key
            assert same_tensor(ours.view(key), expected), key
    return "read"


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_and_odd_files_get_the_same_decision(tmp_path, case) -> None:
    header, data, length = CASES[case]
    check_same(write(tmp_path / "model.safetensors", header, data, length))


def test_the_cases_cover_both_decisions(tmp_path) -> None:
    # Guards the table itself: a parity test where everything is refused would prove nothing.
    decisions = [check_same(write(tmp_path / f"{i}.safetensors", *CASES[c])) for i, c in enumerate(CASES)]
    assert decisions.count("read") >= 20 and decisions.count("refused") >= 40


@pytest.mark.parametrize("case", ["", "\x00" * 7])
def test_files_shorter_than_the_length_field(tmp_path, case) -> None:
    path = tmp_path / "short.safetensors"
    path.write_bytes(case.encode())
    assert check_same(path) == "refused"


def installed_dtypes(tmp_path) -> list[str]:
    """The dtypes the installed safetensors knows, from its own refusal of an unknown one."""
    path = write(tmp_path / "probe.safetensors", {"w": info("NOPE", [0], 0, 0)})
    with pytest.raises(SafetensorError) as info_:
        safe_open(str(path), framework="pt")
    listed = re.search(r"expected one of (.*?) at line", str(info_.value))
    assert listed, str(info_.value)
    return re.findall(r"`(\w+)`", listed.group(1))


def test_the_reader_knows_every_dtype_safetensors_knows(tmp_path) -> None:
    assert sorted(FORMAT_DTYPES) == sorted(installed_dtypes(tmp_path))


@pytest.mark.parametrize("name", list(FORMAT_DTYPES))
def test_every_dtype_reads_as_safetensors_reads_it(tmp_path, name) -> None:
    bits, torch_name = FORMAT_DTYPES[name]
    path = tmp_path / "model.safetensors"
    dtype = getattr(torch, torch_name, None) if torch_name else None
    if isinstance(dtype, torch.dtype):
        # Written by safetensors itself, with distinct bytes so a wrong offset or dtype shows.
        count = 24 * dtype.itemsize
        tensor = (torch.arange(count, dtype=torch.int64) % 251).to(torch.uint8).view(dtype).reshape(2, -1)
        save_file({"t": tensor, "after": torch.arange(3, dtype=torch.float32)}, str(path))
    else:
        # torch cannot make it, so neither can safetensors.torch: the header by hand.
        count = 16
        nbytes = count * bits // 8
        write(
            path,
            {"t": info(name, [2, 8], 0, nbytes), "after": info("F32", [3], nbytes, nbytes + 12)},
            bytes(range(nbytes)) + torch.arange(3, dtype=torch.float32).numpy().tobytes(),
        )
    assert check_same(path) == "read"


def test_a_tensor_torch_cannot_hold_is_refused_at_its_load_not_at_open(tmp_path) -> None:
    path = write(
        tmp_path / "model.safetensors",
        {"a": info("F6_E2M3", [4], 0, 3), "w": info("F32", [1], 3, 7)},
        b"\0" * 3 + torch.tensor([2.5]).numpy().tobytes(),
    )
    with SafetensorsFile(path) as f:
        assert f.read("w").tolist() == [2.5]
        with pytest.raises(ValueError) as info_:
            f.read("a")
    assert str(info_.value) == (
        f"cannot load tensor 'a' from {str(path)!r}: its dtype F6_E2M3 cannot be held in a torch tensor "
        "(torch has no such dtype)"
    )


# --- through the loader ------------------------------------------------------------------------


class Exotic(torch.nn.Module):
    """Buffers of dtypes the reader used to call corrupt: F8_E8M0 scales, C64, F8_E4M3FNUZ, F4."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.empty(4, dtype=torch.float8_e8m0fnu))
        self.register_buffer("phase", torch.empty(3, dtype=torch.complex64))
        self.register_buffer("fnuz", torch.empty(5, dtype=torch.float8_e4m3fnuz))
        self.register_buffer("packed", torch.empty(2, 3, dtype=torch.float4_e2m1fn_x2))


def exotic_state() -> dict[str, torch.Tensor]:
    return {
        "scale": torch.tensor([1.0, 2.0, 0.5, 8.0]).to(torch.float8_e8m0fnu),
        "phase": torch.tensor([1 + 2j, -3j, 0.5], dtype=torch.complex64),
        "fnuz": torch.tensor([0.5, -1.0, 2.0, 0.0, 3.0]).to(torch.float8_e4m3fnuz),
        "packed": torch.tensor([[1, 2, 3], [250, 17, 0]], dtype=torch.uint8).view(torch.float4_e2m1fn_x2),
    }


@pytest.mark.skipif(
    not all(hasattr(torch, n) for n in ("float8_e8m0fnu", "float4_e2m1fn_x2")), reason="torch lacks these dtypes"
)
@pytest.mark.parametrize("mmap", [True, False])
def test_new_dtypes_load_into_a_model_as_safetensors_reads_them(tmp_path, mmap) -> None:
    from x_bigmodel.loading.checkpoint import load_checkpoint_in_model

    path = tmp_path / "model.safetensors"
    save_file(exotic_state(), str(path))
    with torch.device("meta"):
        model = Exotic()
    load_checkpoint_in_model(model, path, show_progress=False, mmap=mmap)
    with safe_open(str(path), framework="pt") as f:
        for name, buffer in model.named_buffers():
            assert same_tensor(buffer, f.get_tensor(name)), name
    assert model.phase.tolist() == [1 + 2j, -3j, 0.5 + 0j]
    assert model.scale.float().tolist() == [1.0, 2.0, 0.5, 8.0]


def test_a_tensor_torch_cannot_hold_is_named_when_the_model_needs_it(tmp_path) -> None:
    from x_bigmodel.loading.checkpoint import load_checkpoint_in_model

    path = write(
        tmp_path / "model.safetensors",
        {"weight": info("F6_E3M2", [2, 4], 0, 6), "bias": info("F32", [2], 6, 14)},
        b"\0" * 14,
    )
    with torch.device("meta"):
        layer = torch.nn.Linear(4, 2)
    with pytest.raises(ValueError) as info_:
        load_checkpoint_in_model(layer, path, show_progress=False)
    assert str(info_.value).startswith(f"cannot load tensor 'weight' from {str(path)!r}: its dtype F6_E3M2 ")
    assert layer.bias.device.type == "meta"  # refused before anything was loaded

    # A model that does not need it loads the rest (the F6 tensor is an unexpected key, skipped).
    class BiasOnly(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bias = torch.nn.Parameter(torch.ones(2))

    model = BiasOnly()
    with pytest.warns(UserWarning, match="weight"):
        load_checkpoint_in_model(model, path, show_progress=False)
    assert model.bias.tolist() == [0.0, 0.0]


def test_a_dtype_this_torch_lacks_is_named_with_the_torch_version(tmp_path, monkeypatch) -> None:
    # As F8_E8M0 reads on a torch older than 2.7: the file opens, that tensor says what is missing.
    import x_bigmodel.files.safetensors_header as header

    monkeypatch.setitem(header.FORMAT_DTYPES, "F8_E8M0", (8, "float8_not_in_this_torch"))
    path = write(
        tmp_path / "model.safetensors",
        {"scale": info("F8_E8M0", [2], 0, 2), "w": info("F32", [1], 2, 6)},
        b"\x7f\x80" + torch.tensor([1.5]).numpy().tobytes(),
    )
    with SafetensorsFile(path) as f:
        assert f.read("w").tolist() == [1.5]
        with pytest.raises(ValueError) as info_:
            f.read("scale")
    assert str(info_.value) == (
        f"cannot load tensor 'scale' from {str(path)!r}: its dtype F8_E8M0 cannot be held in a torch tensor "
        f"(torch {torch.__version__} has no torch.float8_not_in_this_torch)"
    )
