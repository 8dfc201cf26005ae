"""parse_size and format_size: what users write, and bytes printed in binary units."""

from __future__ import annotations

import math
import warnings
from decimal import Decimal

import pytest

from x_common.sizes import format_size, parse_size

ACCEPTED = "accepted forms: a whole number of bytes (1024), or a number and a unit"

KiB, MiB, GiB, TiB, PiB = 2**10, 2**20, 2**30, 2**40, 2**50


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # the documented examples
        ("10GiB", 10 * GiB),
        ("500MB", 500_000_000),
        ("1.5 GB", 1_500_000_000),
        # whitespace around and between number and unit
        (" 2 KiB ", 2 * KiB),
        ("5\tMB", 5_000_000),
        # scientific notation, with and without unit
        ("1e3MB", 1_000_000_000),
        ("1E3", 1000),
        ("1.5e3", 1500),
        ("2e+2KB", 200_000),
        # plain numbers as strings
        ("1024", 1024),
        ("0", 0),
        ("1.0", 1),
        ("007", 7),
        # every unit
        ("3B", 3),
        ("1KB", 10**3),
        ("1MB", 10**6),
        ("1GB", 10**9),
        ("1TB", 10**12),
        ("1PB", 10**15),
        ("1KiB", KiB),
        ("1MiB", MiB),
        ("1GiB", GiB),
        ("1TiB", TiB),
        ("1PiB", PiB),
        # unit letters are case-insensitive except the final B
        ("10giB", 10 * GiB),
        ("10GIB", 10 * GiB),
        ("10kB", 10_000),
        ("10mB", 10_000_000),
        # fractions
        ("1.5KiB", 1536),
        (".5KiB", 512),
        ("0.25 GiB", GiB // 4),
        # a fraction of a byte rounds down
        ("1.0001KB", 1000),
        ("0.5B", 0),
        ("1.9B", 1),
        ("1.0000001 KiB", 1024),
    ],
)
def test_parse_size_strings(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, 0), (1, 1), (1024, 1024), (2**70, 2**70), (0.0, 0), (1024.0, 1024), (1e15, 10**15)],
)
def test_parse_size_numbers(value: int | float, expected: int) -> None:
    result = parse_size(value)
    assert result == expected
    assert type(result) is int


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        # 'b' alone counts bits: not a memory size (Accelerate refuses it too)
        ("8b", "'b' alone is bits"),
        # unknown units
        ("10 XB", "unknown unit 'XB'"),
        ("10 bytes", "unknown unit 'bytes'"),
        ("1 ZiB", "unknown unit 'ZiB'"),
        ("1ZB", "unknown unit 'ZB'"),
        ("2000000 EiB", "larger than any memory"),
        ("5 KiBB", "unknown unit 'KiBB'"),
        # not a number followed by letters at all
        ("", ACCEPTED),
        ("   ", ACCEPTED),
        ("G", ACCEPTED),
        ("GiB", ACCEPTED),
        ("abc", ACCEPTED),
        ("-5MB", ACCEPTED),
        ("-1", ACCEPTED),
        ("+5", ACCEPTED),
        ("1.", ACCEPTED),
        ("1.5.5GB", ACCEPTED),
        ("1,5GB", ACCEPTED),
        ("10 G B", ACCEPTED),
        ("nan", ACCEPTED),
        ("inf", ACCEPTED),
        # a number without unit must be a whole count of bytes
        ("1.5", "a number without unit must be a whole count of bytes"),
        ("1e-3", "a number without unit must be a whole count of bytes"),
        ("0.1", "a number without unit must be a whole count of bytes"),
        # numbers
        (-1, "sizes cannot be negative"),
        (-(2**70), "sizes cannot be negative"),
        (1.5, "a number without unit must be a whole, non-negative count of bytes"),
        (-1.0, "a number without unit must be a whole, non-negative count of bytes"),
        (math.nan, "a number without unit must be a whole, non-negative count of bytes"),
        (math.inf, "a number without unit must be a whole, non-negative count of bytes"),
        (-math.inf, "a number without unit must be a whole, non-negative count of bytes"),
        # not numbers or strings
        (True, "a boolean is not a size"),
        (False, "a boolean is not a size"),
        (None, "expected a string or an integer"),
        ([1024], "expected a string or an integer"),
        (b"10GB", "expected a string or an integer"),
        (Decimal(1024), "expected a string or an integer"),
    ],
)
def test_parse_size_rejects_and_explains(value: object, reason: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        parse_size(value)  # type: ignore[arg-type]
    message = str(excinfo.value)
    assert message.startswith(f"invalid size {value!r}: ")
    assert reason in message
    # every message lists the accepted forms, with examples
    assert ACCEPTED in message
    assert "B, KB, MB, GB, TB, PB, EB (powers of 1000) or KiB, MiB, GiB, TiB, PiB, EiB (powers of 1024)" in message
    assert "e.g. '10GiB', '500MB', '1.5 GB'" in message
    assert "'8G'" in message and "a lowercase final b counts bits" in message


@pytest.mark.parametrize(
    ("unit", "power"), [("K", 1), ("M", 2), ("G", 3), ("T", 4), ("P", 5), ("k", 1), ("g", 3), ("E", 6)]
)
def test_parse_size_single_letter_unit_is_binary(unit: str, power: int) -> None:
    # SLURM's --mem=8G, free -g, docker's 8g: a bare letter is the binary unit (Accelerate refuses it)
    assert parse_size(f"10{unit}") == 10 * 1024**power
    assert parse_size(f"1.5 {unit}") == int(1.5 * 1024**power)


# (text, bytes) pairs computed by Accelerate 1.15's convert_file_size_to_int.
ACCELERATE_READS = [
    ("1gb", 125_000_000),  # lowercase final b: gigabits
    ("10GB", 10_000_000_000),
    ("10GiB", 10 * 2**30),
    ("10gib", 10 * 2**30),
    ("10GIb", 10 * 2**30),
    ("10Gb", 1_250_000_000),
    ("1 Mb", 125_000),
    ("5.0GB", 5_000_000_000),
    ("1MiB", 2**20),
    ("3kb", 375),
    ("1.5KiB", 1536),
    ("7kb", 875),
    (1024, 1024),
]


@pytest.mark.parametrize(("text", "expected"), ACCELERATE_READS)
def test_parse_size_reads_as_accelerate_does(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


def test_parse_size_matches_accelerate_itself() -> None:
    modeling = pytest.importorskip("accelerate.utils.modeling")
    for text, _ in ACCELERATE_READS:
        assert parse_size(text) == modeling.convert_file_size_to_int(text), text


@pytest.mark.parametrize("text", ["1e999999999", "1e999999MB", "1e1000000 KiB"])
def test_parse_size_huge_exponent_raises_value_error(text: str) -> None:
    # The docstring promises ValueError for anything that is not a size; an exponent past
    # Decimal's range must not escape as decimal.Overflow (an ArithmeticError).
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("num_bytes", "expected"),
    [
        (0, "0 B"),
        (1, "1 B"),
        (512, "512 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (1536, "1.50 KiB"),
        (1048575, "1.00 MiB"),  # 1023.999 KiB would print as "1024.00 KiB"
        (MiB, "1.00 MiB"),
        (433249280, "413.18 MiB"),
        (GiB - 1, "1.00 GiB"),
        (1610612736, "1.50 GiB"),
        (1728724336, "1.61 GiB"),  # int(1.61 * 2**30)
        (1_610_000_000, "1.50 GiB"),  # 1.61 GB (decimal) is 1.50 GiB
        (TiB - 1, "1.00 TiB"),
        (TiB, "1.00 TiB"),
        (PiB, "1.00 PiB"),
        (2**60, "1.00 EiB"),
        (2**70, "1024.00 EiB"),  # no unit past EiB
        (5000 * 2**60, "5000.00 EiB"),
        (-1, "-1 B"),
        (-1024, "-1.00 KiB"),
        (-1048575, "-1.00 MiB"),
        (-433249280, "-413.18 MiB"),
        (512.0, "512 B"),
        (1.5, "1.50 B"),
        (0.0, "0 B"),
        (1024.0, "1.00 KiB"),
        (1.5 * GiB, "1.50 GiB"),
    ],
)
def test_format_size(num_bytes: int | float, expected: str) -> None:
    assert format_size(num_bytes) == expected


@pytest.mark.parametrize(
    ("num_bytes", "precision", "expected"),
    [
        (433249280, 0, "413 MiB"),
        (433249280, 1, "413.2 MiB"),
        (433249280, 4, "413.1787 MiB"),
        (1048575, 0, "1 MiB"),
        (1048575, 4, "1023.9990 KiB"),  # enough digits: no carry into MiB
        (1536, 3, "1.500 KiB"),
        (1.25, 1, "1.2 B"),
        (1000, 5, "1000 B"),  # whole bytes print without decimals
    ],
)
def test_format_size_precision(num_bytes: int | float, precision: int, expected: str) -> None:
    assert format_size(num_bytes, precision) == expected


def test_format_size_fractional_bytes_carry_into_kib() -> None:
    # 1048575 B prints as "1.00 MiB", not "1024.00 KiB"; the same carry is owed below 1 KiB:
    # 1023.999 B rounded to two decimals must read "1.00 KiB", not "1024.00 B".
    assert format_size(1023.999) == "1.00 KiB"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "1024", None, True, False, [1], Decimal(1)])
def test_format_size_rejects(value: object) -> None:
    with pytest.raises(ValueError) as excinfo:
        format_size(value)  # type: ignore[arg-type]
    assert str(excinfo.value) == f"invalid byte count {value!r}: expected a finite number"


def test_format_size_int_beyond_float_range() -> None:
    # An int is always finite; a byte count too large for a float must either print in EiB or
    # be refused with the documented ValueError, not escape as OverflowError.
    try:
        text = format_size(10**400)
    except ValueError:
        return
    assert text.endswith(" EiB")


@pytest.mark.parametrize("num_bytes", [KiB, 1536, MiB, 433249280, 1610612736, 10 * GiB, 3 * TiB, PiB])
def test_format_then_parse_round_trips_within_rounding(num_bytes: int) -> None:
    text = format_size(num_bytes, precision=6)
    assert abs(parse_size(text.replace(" ", "")) - num_bytes) <= num_bytes * 1e-6


def test_parse_size_says_when_it_reads_bits() -> None:
    with pytest.warns(UserWarning, match=r"size '10gb' is read as bits \(1250000000 bytes\), .* write 10GB for bytes"):
        assert parse_size("10gb") == 1_250_000_000
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # bytes are read without a word
        assert parse_size("10GB") == 10_000_000_000
