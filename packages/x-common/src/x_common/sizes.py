"""Memory sizes: parse what users write ("10GiB", "500MB", "1.5 GB", 1024) and print bytes
in binary units that say what they are (KiB, MiB, GiB), never "MB" for 2**20.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, DecimalException

__all__ = ["format_size", "parse_size"]

_DECIMAL = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15, "EB": 10**18}
_BINARY = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50, "EIB": 2**60}
_LARGEST = 2**80  # past any memory; refusing it keeps int() of a huge exponent from eating RAM
_FORMAT_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")

_ACCEPTED = (
    "accepted forms: a whole number of bytes (1024), or a number and a unit: "
    "B, KB, MB, GB, TB, PB, EB (powers of 1000) or KiB, MiB, GiB, TiB, PiB, EiB (powers of 1024), "
    "e.g. '10GiB', '500MB', '1.5 GB'"
)
_SIZE_RE = re.compile(r"^\s*(?P<number>[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(?P<unit>[A-Za-z]*)\s*$")


def parse_size(size: int | float | str) -> int:
    """Number of bytes in ``size``.

    Decimal units (KB, MB, GB, ...) are powers of 1000 and binary units (KiB, MiB, GiB, ...)
    powers of 1024. Unit letters are case-insensitive except the final ``B``: a lowercase
    ``b`` means bits, which is refused rather than guessed. Fractions of a byte round down.

    Examples:
        >>> parse_size("10GiB"), parse_size("500MB"), parse_size("1.5 GB"), parse_size(1024)
        (10737418240, 500000000, 1500000000, 1024)

    Raises:
        ValueError: ``size`` is not a size; the message names it and the accepted forms.
    """
    if isinstance(size, bool):
        raise ValueError(f"invalid size {size!r}: a boolean is not a size; {_ACCEPTED}")
    if isinstance(size, int):
        if size < 0:
            raise ValueError(f"invalid size {size!r}: sizes cannot be negative; {_ACCEPTED}")
        return size
    if isinstance(size, float):
        if not math.isfinite(size) or size < 0 or not size.is_integer():
            raise ValueError(
                f"invalid size {size!r}: a number without unit must be a whole, non-negative count of bytes; {_ACCEPTED}"
            )
        return int(size)
    if not isinstance(size, str):
        raise ValueError(f"invalid size {size!r}: expected a string or an integer; {_ACCEPTED}")
    match = _SIZE_RE.match(size)
    if match is None:
        raise ValueError(f"invalid size {size!r}: {_ACCEPTED}")
    number, unit = match["number"], match["unit"]
    multiplier = _unit_multiplier(size, unit)
    try:
        value = Decimal(number) * multiplier
        too_large = value > _LARGEST
    except DecimalException:  # exponent beyond what Decimal holds
        too_large = True
    if too_large:
        raise ValueError(f"invalid size {size!r}: larger than any memory (over {_LARGEST} bytes); {_ACCEPTED}")
    if not unit and value != value.to_integral_value():
        raise ValueError(f"invalid size {size!r}: a number without unit must be a whole count of bytes; {_ACCEPTED}")
    return int(value)


def _unit_multiplier(original: str, unit: str) -> int:
    if not unit:
        return 1
    if unit.endswith("b") and not unit.endswith("B"):
        raise ValueError(
            f"invalid size {original!r}: a lowercase 'b' means bits; write the unit with a capital B "
            f"(e.g. 'GB' or 'GiB'); {_ACCEPTED}"
        )
    upper = unit.upper()
    if upper in _DECIMAL:
        return _DECIMAL[upper]
    if upper in _BINARY:
        return _BINARY[upper]
    if upper in {"K", "M", "G", "T", "P"}:
        raise ValueError(
            f"invalid size {original!r}: unit {unit!r} is ambiguous; write '{upper}B' "
            f"(powers of 1000) or '{upper}iB' (powers of 1024); {_ACCEPTED}"
        )
    raise ValueError(f"invalid size {original!r}: unknown unit {unit!r}; {_ACCEPTED}")


def format_size(num_bytes: int | float, precision: int = 2) -> str:
    """Bytes in the largest binary unit that keeps the number at or above 1.

    Examples:
        >>> format_size(433249280)
        '413.18 MiB'
        >>> format_size(512)
        '512 B'

    Raises:
        ValueError: ``num_bytes`` is not a finite number.
    """
    if isinstance(num_bytes, bool) or not isinstance(num_bytes, (int, float)):
        raise ValueError(f"invalid byte count {num_bytes!r}: expected a finite number")
    if isinstance(num_bytes, float) and not math.isfinite(num_bytes):
        raise ValueError(f"invalid byte count {num_bytes!r}: expected a finite number")
    sign = "-" if num_bytes < 0 else ""
    magnitude = abs(num_bytes)
    if magnitude > 2**1000:  # beyond float range: no memory is this large
        raise ValueError(f"invalid byte count {num_bytes!r}: too large to be a memory size")
    exponent = 0
    while exponent + 1 < len(_FORMAT_UNITS) and magnitude >= 1024 ** (exponent + 1):
        exponent += 1
    value = round(magnitude / 1024**exponent, precision)
    if value >= 1024 and exponent + 1 < len(_FORMAT_UNITS):
        # 1048575 bytes would print "1024.00 KiB"; say "1.00 MiB" instead.
        exponent += 1
        value = round(magnitude / 1024**exponent, precision)
    if exponent == 0 and float(value).is_integer():
        return f"{sign}{value:.0f} B"
    return f"{sign}{value:.{precision}f} {_FORMAT_UNITS[exponent]}"
