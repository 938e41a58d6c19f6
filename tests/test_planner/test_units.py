"""Budget parsing and human-readable sizes and durations (planner/units.py)."""

from __future__ import annotations

import math

import pytest

from planner.units import BudgetError, format_bytes, format_seconds, parse_bytes


@pytest.mark.parametrize(("text", "expected"), [
    ("16GiB", 16 * 2**30),
    ("80GB", 80 * 10**9),
    ("1.5 TiB", 3 * 2**39),
    ("512MiB", 512 * 2**20),
    ("1e9", 10**9),
    ("16gib", 16 * 2**30),
    ("16 GIB", 16 * 2**30),
    ("  2 gb  ", 2 * 10**9),
    ("0.3GB", 300_000_000),          # decimal arithmetic: not 299999999
    ("4096", 4096),
    ("4096 B", 4096),
    ("1KB", 1000),
    ("1KiB", 1024),
    ("2Gi", 2 * 2**30),
    ("1_000_000", 1_000_000),
    ("1.5e3 MiB", 1500 * 2**20),
    (".5 KiB", 512),
    ("1 PB", 10**15),
    (17179869184, 16 * 2**30),
    (1e9, 10**9),
    (1.6, 2),                        # fractional bytes round to the nearest byte
])
def test_parse_bytes_accepts(text: object, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(("value", "reason"), [
    ("-16GiB", "positive"),
    ("0", "positive"),
    ("0 GiB", "positive"),
    (0, "positive"),
    (-5, "positive"),
    ("nan", "finite"),
    ("inf", "finite"),
    (math.nan, "finite"),
    (math.inf, "finite"),
    ("", "empty"),
    ("   ", "empty"),
    ("16 XB", "unknown unit 'XB'"),
    ("16 bits", "unknown unit"),
    ("16G", "ambiguous"),
    ("16 m", "ambiguous"),
    ("GiB", "not a number"),
    ("16 GiB per GPU", "not a number"),
    ("1e999999999", "2^80"),
    ("0.1", "at least 1 byte"),
    (True, "boolean"),
    (None, "NoneType"),
    ([16], "list"),
])
def test_parse_bytes_rejects_with_accepted_forms(value: object, reason: str) -> None:
    with pytest.raises(BudgetError) as info:
        parse_bytes(value)  # type: ignore[arg-type]
    message = str(info.value)
    assert reason in message
    assert "16GiB" in message and "80GB" in message  # the message shows the accepted forms
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"),
    (512, "512 B"),
    (1023, "1023 B"),
    (1024, "1.0 KiB"),
    (1536, "1.5 KiB"),
    (16 * 2**30, "16.0 GiB"),
    (2**30 - 1, "1.0 GiB"),          # rounds up into the next unit instead of "1024.0 MiB"
    (int(1.5 * 2**40), "1.5 TiB"),
    (-3 * 2**20, "-3.0 MiB"),
])
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


@pytest.mark.parametrize(("s", "text"), [
    (0.0, "0 s"),
    (1.234, "1.23 s"),
    (12.34, "12.3 s"),
    (0.0123, "12.3 ms"),
    (4.56e-6, "4.56 µs"),
    (2e-10, "0.2 ns"),
    (0.99996, "1 s"),                # no "1e+03 ms"
    (123.4, "2 min 3.4 s"),
    (3725.0, "1 h 02 min"),
    (-0.5, "-500 ms"),
    (math.inf, "inf s"),
])
def test_format_seconds(s: float, text: str) -> None:
    assert format_seconds(s) == text


def test_format_then_parse_is_close() -> None:
    for n in (1536, 16 * 2**30, 80 * 10**9, 3 * 2**40):
        back = parse_bytes(format_bytes(n).replace(" ", ""))
        assert abs(back - n) / n < 0.05
