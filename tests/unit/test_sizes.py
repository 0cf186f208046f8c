"""Unit and property tests for byte-size parsing and formatting."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from userbenchmark.maestro.core.config.sizes import MAX_SIZE_BYTES, format_size, parse_size

GOOD = [
    (1, 1),
    (4096, 4096),
    (4096.0, 4096),
    ("4096", 4096),
    ("3", 3),
    ("1K", 1024),
    ("1k", 1024),
    ("64K", 65536),
    ("4M", 4 * 1024**2),
    ("2G", 2 * 1024**3),
    ("1T", 1024**4),
    ("1KiB", 1024),
    ("4MiB", 4 * 1024**2),
    ("2GiB", 2 * 1024**3),
    ("1TiB", 1024**4),
    ("4MB", 4 * 1024**2),
    ("512B", 512),
    ("1.5K", 1536),
    ("1.5KiB", 1536),
    ("0.5M", 512 * 1024),
    (".5K", 512),
    ("1.K", 1024),
    ("4 M", 4 * 1024**2),
    ("  8K  ", 8192),
    ("256T", 2**48),
    (2**48, 2**48),
]


@pytest.mark.parametrize(("text", "expected"), GOOD)
def test_parse_good(text, expected):
    assert parse_size(text) == expected


BAD = [
    (0, "positive"),
    ("0", "positive"),
    ("0K", "positive"),
    (0.0, "positive"),
    (-1, "positive"),
    ("-4M", "positive"),
    (-4.5, "positive"),
    ("abc", "expected a size"),
    ("", "expected a size"),
    ("4X", "expected a size"),
    ("4Ki", "expected a size"),
    ("4 MiB extra", "expected a size"),
    ("1e3", "expected a size"),
    ("0x10", "expected a size"),
    ("4_096", "expected a size"),
    ("1.5", "not a whole number"),
    ("1.25", "not a whole number"),
    ("1.0000001K", "not a whole number"),
    (1.5, "not a whole number"),
    (True, "boolean"),
    (False, "boolean"),
    (None, "expected a size"),
    ([4], "expected a size"),
    ({"a": 1}, "expected a size"),
    (math.nan, "finite"),
    (math.inf, "finite"),
    (2**48 + 1, "address space"),
    ("257T", "address space"),
    ("1024T", "address space"),
    (1e300, "address space"),
    ("9" * 200, "expected a size"),
]


@pytest.mark.parametrize(("value", "fragment"), BAD)
def test_parse_bad(value, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_size(value)


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (3, "3"),
        (1024, "1K"),
        (1536, "1.5K"),
        (4 * 1024**2, "4M"),
        (2**48, "256T"),
        (1000, "1000"),
        (1025, "1025"),
        (3 * 1024**3, "3G"),
        (1024**2 + 512 * 1024, "1.5M"),
    ],
)
def test_format_size(size, text):
    assert format_size(size) == text


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "4K"])
def test_format_size_rejects(bad):
    with pytest.raises(ValueError):
        format_size(bad)


@given(st.integers(min_value=1, max_value=MAX_SIZE_BYTES))
def test_round_trip(size):
    text = format_size(size)
    assert parse_size(text) == size
    assert len(text) <= len(str(size))


@given(st.integers(min_value=0, max_value=40), st.integers(min_value=1, max_value=1023))
def test_round_trip_on_unit_boundaries(shift, mult):
    size = min(mult << shift, MAX_SIZE_BYTES)
    assert parse_size(format_size(size)) == size


@given(st.integers(max_value=0))
def test_non_positive_ints_rejected(value):
    with pytest.raises(ValueError, match="positive"):
        parse_size(value)


def test_parse_does_not_accept_other_types_silently():
    class Weird:
        pass

    with pytest.raises(ValueError, match="Weird"):
        parse_size(Weird())
