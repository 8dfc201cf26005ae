"""``x_common.kinds``: the ``check`` path (YAML values and flags) and the kinds only the launcher uses."""

from __future__ import annotations

import pytest

from x_common.kinds import Bool, BoolOrChoice, Choice, Float, GpuIds, Int, Str, StrList


@pytest.mark.parametrize(
    ("kind", "value", "expected"),
    [
        (Bool(), True, True),
        (Bool(), "Off", False),
        (Bool(), 1, True),
        (Int(minimum=1), " 8 ", 8),
        (Float(minimum=0.0), 1, 1.0),
        (Choice(("NO", "FSDP")), False, "NO"),  # YAML 1.1 reads an unquoted NO as false
        (Str(), 5, "5"),
        (StrList(), ["A", " B "], ("A", "B")),
        (StrList(joined=True), ["A", " B "], "A,B"),
        (StrList(joined=True), "A, B", "A,B"),
        (GpuIds(), [0, 1], "0,1"),
        (GpuIds(), "ALL", "all"),
        (BoolOrChoice(("FULL_SHARD",)), "yes", True),
        (BoolOrChoice(("FULL_SHARD",)), "full_shard", "FULL_SHARD"),
    ],
)
def test_check_returns_the_canonical_value(kind, value, expected) -> None:
    result = kind.check("key", value)
    assert (type(result), result) == (type(expected), expected)


@pytest.mark.parametrize(
    ("kind", "value", "expected"),
    [
        (Bool(), 2, "true or false"),
        (Int(minimum=1), True, "an integer >= 1"),
        (Float(minimum=0.0), float("inf"), "a number >= 0"),
        (Str(), ["x"], "a string"),
        (StrList(joined=True), "A,,B", "comma-separated names"),
        (GpuIds(), "0,a", "'all' or comma-separated GPU indices such as 0,1"),
        (BoolOrChoice(("FULL_SHARD", "NO_SHARD")), "maybe", "true, false or one of FULL_SHARD, NO_SHARD"),
    ],
)
def test_check_error_names_the_key_the_value_and_what_is_accepted(kind, value, expected) -> None:
    with pytest.raises(ValueError) as info:
        kind.check("some.key", value)
    assert str(info.value) == f"some.key: {value!r} is not valid: expected {expected}"


def test_parse_and_check_word_the_same_rule_for_their_origin() -> None:
    with pytest.raises(ValueError, match=r"^X='maybe' is not valid: expected a boolean \(1, true"):
        Bool().parse("X", "maybe")
    with pytest.raises(ValueError, match=r"^x: 'maybe' is not valid: expected true or false$"):
        Bool().check("x", "maybe")


@pytest.mark.parametrize(
    ("kind", "value"),
    [(StrList(joined=True), "A,B"), (GpuIds(), "0,1"), (BoolOrChoice(("FULL_SHARD",)), False), (Float(), 0.5)],
)
def test_format_round_trips_through_parse(kind, value) -> None:
    assert kind.parse("X", kind.format("X", value)) == value
