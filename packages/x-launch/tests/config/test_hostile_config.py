"""Hostile config files: each loads or fails in well under a second, whatever it holds.

Every file below is written to disk and given to the real ``x-launch --config_file FILE
train.py``: it must exit 2 with one line naming the file, the problem and the fix, no
traceback, without running the script or touching the file. The loader is also timed in
process, where interpreter start-up does not hide a slow parse. The alias bomb hung at 1-2 GB
and growing before the loader counted aliases (``repr()`` of 9^9 shared items).
"""

from __future__ import annotations

import faulthandler
import os
import resource
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from x_launch.config.bounded_yaml import MAX_BYTES, MAX_DEPTH, MAX_VALUES
from x_launch.config.file import ConfigError, load_config


def _bomb() -> bytes:
    """A billion laughs with Accelerate's own (ignored) keys as anchors: 9^9 values, 500 bytes."""
    keys = ["commands", "tpu_name", "tpu_zone", "region", "profile", "image_uri", "base_job_name", "py_version"]
    lines = [f"tpu_env: &a [{', '.join(['lol'] * 9)}]"]
    for key, name, inner in zip(keys, "bcdefghi", "abcdefgh", strict=True):
        lines.append(f"{key}: &{name} [{', '.join([f'*{inner}'] * 9)}]")
    lines.append("num_processes: *i")
    return ("\n".join(lines) + "\n").encode()


def _merge_bomb() -> bytes:
    """The same with ``<<`` merges, which copy the merged keys into every mapping."""
    lines = ["tpu_env: &a {" + ", ".join(f"k{i}: 1" for i in range(10)) + "}"]
    for key, name, inner in [("commands", "b", "a"), ("tpu_name", "c", "b"), ("tpu_zone", "d", "c")]:
        lines.append(f"{key}: &{name} [{', '.join([f'*{inner}'] * 10)}]")
    lines.append("fsdp_config: {<<: *d}")
    return ("\n".join(lines) + "\n").encode()


SPELLED = "write one key: value per line, e.g. num_processes: 2"
TOO_MANY = f"it holds more than {MAX_VALUES} values, far more than a launch config; is it the right file?"
ALIASES = (
    f"its aliases (*name) expand to more than {MAX_VALUES} values, far more than a launch config holds; "
    "write the values out instead of nesting aliases"
)

# (id, the file's bytes, the error line after "Error: ", with {path} for the file's path)
HOSTILE = [
    ("alias-bomb", _bomb(), f"cannot parse config file {{path}}: line 4, column 19: {ALIASES}"),
    ("merge-bomb", _merge_bomb(), f"cannot parse config file {{path}}: line 3, column 47: {ALIASES}"),
    (
        "self-alias",
        b"tpu_env: &a [1, *a]\n",
        "cannot parse config file {path}: line 1, column 17: alias *a is inside the value it names, "
        "so it never ends; remove it",
    ),
    (
        "many-keys",
        b"tpu_env:\n" + b"".join(b"  k%d: v\n" % i for i in range(MAX_VALUES)),
        f"cannot parse config file {{path}}: line 1000, column 9: {TOO_MANY}",
    ),
    (
        "long-list",
        b"tpu_env: [" + b"a, " * 3000 + b"]\n",
        f"cannot parse config file {{path}}: line 1, column 6002: {TOO_MANY}",
    ),
    (
        "too-big",
        b"num_processes: 2\n# " + b"x" * MAX_BYTES + b"\n",
        "config file {path} is larger than 64 KiB, and a launch config is a few hundred bytes; is it the right file?",
    ),
    (
        "deep-flow",
        b"tpu_env: " + b"[" * 30000 + b"]" * 30000 + b"\n",
        f"cannot parse config file {{path}}: line 1, column 25: values nest more than {MAX_DEPTH} levels deep; "
        "a launch config nests 2 or 3",
    ),
    (
        "deep-block",
        "".join(" " * i + f"k{i}:\n" for i in range(40)).replace("k0", "tpu_env").encode(),
        f"cannot parse config file {{path}}: line 16, column 16: values nest more than {MAX_DEPTH} levels deep; "
        "a launch config nests 2 or 3",
    ),
    (
        "binary",
        bytes(range(256)) * 8,
        "cannot read config file {path}: it holds binary data (a NUL byte on line 1), not YAML text; "
        "give the path of a launch config",
    ),
    (
        "not-utf8",
        "num_processes: 2\nmain_process_ip: café\n".encode("latin-1"),
        "cannot read config file {path}: line 2, column 21: byte 0xe9 is not UTF-8 text; save the file as UTF-8",
    ),
    (
        "utf16",
        "num_processes: 2\n".encode("utf-16"),
        "cannot read config file {path}: it is UTF-16 (or UTF-32) text; save it as UTF-8",
    ),
    (
        "control-character",
        b"num_processes: 2\x1b[0m\n",
        "cannot parse config file {path}: line 1, column 17: character #x001b is not allowed in YAML; remove it",
    ),
    (
        "bare-scalar",
        b"just some words\n",
        f"config file {{path}} must hold key: value pairs, not a string ('just some words'); {SPELLED}",
    ),
    ("bare-number", b"8\n", f"config file {{path}} must hold key: value pairs, not a number (8); {SPELLED}"),
    (
        "top-level-list",
        b"- num_processes: 2\n",
        f"config file {{path}} must hold key: value pairs, not a list; {SPELLED}",
    ),
    (
        "tab",
        b"fsdp_config:\n\tfsdp_version: 2\n",
        "cannot parse config file {path}: line 2, column 1: found character '\\t' that cannot start any token; "
        "indent with spaces, not tabs",
    ),
    (
        "duplicate-key",
        b"num_processes: 2\nuse_cpu: true\nnum_processes: 3\n",
        "cannot parse config file {path}: line 3, column 1: key 'num_processes' is given twice (first on line 1); "
        "keep one",
    ),
    (
        "duplicate-anchor",
        b"tpu_env: &a 1\ncommands: &a 2\n",
        "cannot parse config file {path}: line 2, column 11: found duplicate anchor 'a' (first on line 1); "
        "give each anchor (&name) its own name",
    ),
    (
        "two-documents",
        b"num_processes: 2\n---\nuse_cpu: true\n",
        "cannot parse config file {path}: line 2, column 1: expected a single document in the stream, but found "
        "another document; keep one document: remove the second '---'",
    ),
    (
        "python-tag",
        b"num_processes: !!python/object/apply:os.system ['touch pwned']\n",
        "cannot parse config file {path}: line 1, column 16: could not determine a constructor for the tag "
        "'tag:yaml.org,2002:python/object/apply:os.system'; remove the tag: a launch config holds plain values",
    ),
    (
        "list-as-key",
        b"? [num_processes, use_cpu]\n: 2\n",
        "cannot parse config file {path}: line 1, column 3: found unhashable key; a key must be a plain name",
    ),
    (
        "giant-integer",
        b"num_processes: " + b"9" * 5000 + b"\n",
        "cannot parse config file {path}: line 1, column 16: an integer of 5000 digits is too long; "
        "a launch setting is a small number",
    ),
    (
        "impossible-date",
        b"num_processes: 2024-13-45\n",
        "cannot parse config file {path}: line 1, column 16: '2024-13-45' is not a valid date "
        "(month must be in 1..12); quote it if it is text",
    ),
    (
        "mapping-for-a-number",
        b"num_processes: {count: 2}\n",
        "{path}, line 1: num_processes: {'count': 2} is not valid: expected an integer >= 1",
    ),
    (
        "big-list-for-a-number",
        b"num_processes: [" + b"1, " * 500 + b"]\n",
        "{path}, line 1: num_processes: [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,... "
        "(a list of 500 items) is not valid: expected an integer >= 1",
    ),
    (
        "nested-list-for-gpu-ids",
        b"gpu_ids: [[0, 1], [2]]\n",
        "{path}, line 1: gpu_ids: [[0, 1], [2]] is not valid: expected 'all' or comma-separated GPU indices such as 0,1",
    ),
    (
        "long-text",
        b"main_process_ip: " + b"a" * 60000 + b"\n",
        "{path}, line 1: main_process_ip: '" + "a" * 59 + "... (60000 characters) is not valid: expected a string",
    ),
    (
        "long-unknown-key",
        b"b" * 1000 + b": 1\n",
        "{path}, line 1: unknown key '" + "b" * 59 + "... (1000 characters)",
    ),
    (
        "section-of-many",
        b"fsdp_config: [" + b"x, " * 1000 + b"]\n",
        "{path}, line 1: fsdp_config must be a mapping of keys, not "
        + "["
        + "'x', " * 11
        + "'x',... (a list of 1000 items)",
    ),
]
IDS = [case[0] for case in HOSTILE]


# Leaves a mark if anything launches it: a refused launch must not run it.
SCRIPT = "from pathlib import Path\nPath('ran.txt').write_text('launched')\n"


@pytest.fixture(scope="module")
def exe(console_script) -> str:
    return console_script("x-launch")


def _limit_memory() -> None:
    # A regression must fail the test, not take the machine: 4 GiB, then MemoryError.
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    cap = 4 << 30 if hard == resource.RLIM_INFINITY else min(hard, 4 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def _launch(exe: str, config: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    try:
        out = subprocess.run(
            [exe, "--config_file", config, "train.py"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=20,
            preexec_fn=_limit_memory,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"x-launch --config_file {config} still running after 20 s")
    return out, time.monotonic() - start


def _state(path: Path) -> tuple[bytes, int, list[str]]:
    return path.read_bytes(), path.stat().st_mtime_ns, sorted(p.name for p in path.parent.iterdir())


@pytest.mark.parametrize(("name", "content", "message"), HOSTILE, ids=IDS)
def test_cli_refuses_hostile_file_in_one_line_quickly(
    exe: str, tmp_path: Path, name: str, content: bytes, message: str
) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    config = tmp_path / "bad.yaml"
    config.write_bytes(content)
    before = _state(config)
    out, seconds = _launch(exe, "bad.yaml", tmp_path)
    shown = f"exit {out.returncode} after {seconds:.1f} s\nstderr: {out.stderr[-2000:]}"
    assert out.returncode == 2, shown
    assert out.stderr.splitlines() == [f"Error: {message.replace('{path}', 'bad.yaml')}"], shown
    assert "Traceback" not in out.stdout + out.stderr
    assert seconds < 5, shown  # interpreter start included; the loader alone is timed below
    assert not (tmp_path / "ran.txt").exists(), "the script ran"
    assert _state(config) == before, "the config file changed"


@pytest.fixture
def watchdog(capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    # Without the bounds, the bomb hangs inside repr(), where no Python-level timeout can stop
    # it: end the run after 30 s, with the stack on the real stderr (pytest captures fd 2).
    with capsys.disabled():
        terminal = os.dup(2)
    faulthandler.dump_traceback_later(30, exit=True, file=terminal)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        os.close(terminal)


@pytest.mark.parametrize(("name", "content", "message"), HOSTILE, ids=IDS)
def test_loader_refuses_hostile_file_in_under_a_second(
    tmp_path: Path, watchdog: None, name: str, content: bytes, message: str
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_bytes(content)
    start = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        load_config(config)
    seconds = time.perf_counter() - start
    assert str(info.value) == message.replace("{path}", str(config))
    assert seconds < 1, f"{seconds:.2f} s"


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_endless_file_is_refused_by_its_size(exe: str, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    out, seconds = _launch(exe, "/dev/zero", tmp_path)
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "Error: config file /dev/zero is larger than 64 KiB, and a launch config is a few hundred bytes; "
        "is it the right file?"
    ]
    assert seconds < 5


@pytest.mark.parametrize(
    "text", ["", "# every setting commented out\n# num_processes: 2\n"], ids=["empty", "comments-only"]
)
def test_cli_says_an_empty_file_is_empty_and_launches_with_defaults(exe: str, tmp_path: Path, text: str) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    config = tmp_path / "launch.yaml"
    config.write_text(text)
    before = _state(config)
    out = subprocess.run(
        [exe, "--config_file", "launch.yaml", "--dry_run", "train.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == ["Warning: config file launch.yaml is empty: every setting takes its default"]
    assert "num_processes: 1" in out.stdout
    assert _state(config) == before


# --- what real files do with the same features still loads -----------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tpu_env: &ids [0, 1]\ngpu_ids: *ids\n", {"gpu_ids": "0,1"}),
        ("tpu_env: &base {num_processes: 2}\n<<: *base\nuse_cpu: true\n", {"num_processes": 2, "use_cpu": True}),
        ("\ufeffnum_processes: 2\n", {"num_processes": 2}),  # Windows editors write a byte-order mark
        ('{"num_processes": 2, "gpu_ids": [0, 1]}', {"num_processes": 2, "gpu_ids": "0,1"}),
        (
            "fsdp_config:\n  fsdp_transformer_layer_cls_to_wrap: [A, B]\n",
            {"fsdp_config.fsdp_transformer_layer_cls_to_wrap": "A,B"},
        ),
    ],
    ids=["small-alias", "merge", "utf8-bom", "json", "list-value"],
)
def test_ordinary_uses_of_the_same_features_load(tmp_path: Path, text: str, expected: dict) -> None:
    config = tmp_path / "launch.yaml"
    config.write_text(text, encoding="utf-8")
    assert load_config(config).values == expected


def test_the_bounds_leave_room_for_any_real_file(tmp_path: Path) -> None:
    # At every bound at once: the largest file, with the most values, nested the deepest, loads.
    nested = "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)  # the document itself is the first level
    # the document, num_processes and 2, commands and its list, tpu_env and its lists
    items = MAX_VALUES - (1 + 2 + 2 + 1 + (MAX_DEPTH - 1))
    text = f"num_processes: 2\ncommands: [{', '.join(['x'] * items)}]\ntpu_env: {nested}\n"
    text += "#" * (MAX_BYTES - len(text) - 1) + "\n"
    config = tmp_path / "launch.yaml"
    config.write_text(text)
    assert config.stat().st_size == MAX_BYTES
    start = time.perf_counter()
    loaded = load_config(config)
    assert time.perf_counter() - start < 1
    assert loaded.values == {"num_processes": 2}
    assert loaded.ignored == ["commands", "tpu_env"]


@pytest.mark.parametrize(
    ("too_much", "just_right", "message"),
    [
        (
            "tpu_env: " + "[" * MAX_DEPTH + "]" * MAX_DEPTH,
            "tpu_env: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1),
            "nest more than",
        ),
        # the document, the key, the list and its items
        (
            "tpu_env: [" + "x, " * (MAX_VALUES - 2) + "]",
            "tpu_env: [" + "x, " * (MAX_VALUES - 3) + "]",
            "more than 2000 values",
        ),
        ("tpu_env: 1\n#" + "x" * (MAX_BYTES - 12), "tpu_env: 1\n#" + "x" * (MAX_BYTES - 13), "larger than 64 KiB"),
    ],
    ids=["one-level-too-deep", "one-value-too-many", "one-byte-too-many"],
)
def test_one_past_a_bound_is_refused(tmp_path: Path, too_much: str, just_right: str, message: str) -> None:
    config = tmp_path / "launch.yaml"
    config.write_text(too_much + "\n")
    with pytest.raises(ConfigError, match=message):
        load_config(config)
    config.write_text(just_right + "\n")
    assert load_config(config).ignored == ["tpu_env"]


def test_the_bomb_is_a_small_file() -> None:
    # No size limit alone could catch it.
    assert len(_bomb()) < 600
