"""Memory sizes: parse what users write ("10GiB", "500MB", "1.5 GB", "8G", 1024) and print bytes
in binary units that say what they are (KiB, MiB, GiB), never "MB" for 2**20.

Sizes read as Accelerate's ``convert_file_size_to_int`` reads them: ``GB`` is 10**9 bytes,
``GiB`` 2**30 (binary units in any case: ``"10gib"``), and a decimal unit ending in a
lowercase ``b`` counts bits (``"1gb"`` and ``"1Gb"`` are 10**9 / 8 bytes), so a
``max_memory`` written for Accelerate plans the same budget here. Beyond Accelerate: TB, PB,
EB and their binary forms, a space before the unit, and a bare K, M, G, T or P letter, which
means the binary unit as SLURM's ``--mem=8G`` and ``free -g`` do (``"8G"`` is 8 GiB).
"""

from __future__ import annotations

import math
import re
import warnings
from decimal import Decimal, DecimalException

__all__ = ["format_size", "parse_size"]

_DECIMAL = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15, "EB": 10**18}
_BINARY = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50, "EIB": 2**60}
_LARGEST = 2**80  # past any memory; refusing it keeps int() of a huge exponent from eating RAM
_FORMAT_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")

_ACCEPTED = (
    "accepted forms: a whole number of bytes (1024), or a number and a unit: "
    "B, KB, MB, GB, TB, PB, EB (powers of 1000) or KiB, MiB, GiB, TiB, PiB, EiB (powers of 1024), "
    "e.g. '10GiB', '500MB', '1.5 GB'; also K, M, G, T, P for KiB...PiB ('8G'), and, as in Accelerate, "
    "a lowercase final b counts bits ('1gb' is 125000000 bytes)"
)
_SIZE_RE = re.compile(r"^\s*(?P<number>[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(?P<unit>[A-Za-z]*)\s*$")


def parse_size(size: int | float | str) -> int:
    """Number of bytes in ``size``.

    Decimal units (KB, MB, GB, ...) are powers of 1000; binary units (KiB, MiB, GiB, ... in
    any case, or the bare letter: K, M, G, T, P) powers of 1024. A decimal unit ending in a
    lowercase ``b`` counts bits, as Accelerate reads it. Fractions of a byte round down.

    Examples:
        >>> parse_size("10GiB"), parse_size("500MB"), parse_size("1.5 GB"), parse_size(1024)
        (10737418240, 500000000, 1500000000, 1024)
        >>> parse_size("8G"), parse_size("1gb"), parse_size("10GB")
        (8589934592, 125000000, 10000000000)

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
    multiplier, bits = _unit_multiplier(size, unit)
    try:
        value = Decimal(number) * multiplier
        too_large = value > _LARGEST
    except DecimalException:  # exponent beyond what Decimal holds
        too_large = True
    if too_large:
        raise ValueError(f"invalid size {size!r}: larger than any memory (over {_LARGEST} bytes); {_ACCEPTED}")
    if not unit and value != value.to_integral_value():
        raise ValueError(f"invalid size {size!r}: a number without unit must be a whole count of bytes; {_ACCEPTED}")
    if bits:
        # Accelerate reads it so, and a migrated max_memory must mean what it meant there; but
        # "10gb" typed for 10 GB is the likelier intent, so the reading is said out loud.
        warnings.warn(
            f"size {size!r} is read as bits ({int(value) // 8} bytes), as Accelerate reads it; "
            f"write {number}{unit[:-1].upper()}B for bytes",
            stacklevel=2,
        )
        return int(value) // 8  # Accelerate: int(float(n) * 10**9) // 8
    return int(value)


def _unit_multiplier(original: str, unit: str) -> tuple[int, bool]:
    """``(bytes per unit, whether the number counts bits)``."""
    if not unit:
        return 1, False
    upper = unit.upper()
    if upper in _BINARY:
        return _BINARY[upper], False
    if upper in {"K", "M", "G", "T", "P", "E"}:
        return _BINARY[upper + "IB"], False
    if upper in _DECIMAL and upper != "B":
        return _DECIMAL[upper], unit.endswith("b")
    if unit == "B":
        return 1, False
    if unit == "b":
        raise ValueError(f"invalid size {original!r}: 'b' alone is bits, not a memory size; {_ACCEPTED}")
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
