"""colocate.base.units: sizes and fractions as the command line accepts them."""
import math

import pytest

from colocate.base.units import format_size, parse_fraction, parse_size

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


@pytest.mark.parametrize(
    "text, expected",
    [
        ("0", 0),
        ("512", 512),
        ("1B", 1),
        ("1024b", 1024),
        ("1KiB", KiB),
        ("2KiB", 2 * KiB),
        ("512MiB", 512 * MiB),
        ("2GiB", 2 * GiB),
        ("1TiB", TiB),
        ("1KB", 1000),
        ("100KB", 100_000),
        ("4MB", 4_000_000),
        ("8GB", 8_000_000_000),
        ("1TB", 10**12),
        ("2gib", 2 * GiB),  # units are case-insensitive
        ("2GIB", 2 * GiB),
        ("2Gi", 2 * GiB),  # Kubernetes short forms
        ("3Mi", 3 * MiB),
        ("1k", 1000),
        ("1.5GiB", 3 * GiB // 2),
        ("0.5KiB", 512),
        (".5KiB", 512),
        ("1.KiB", KiB),
        ("1.25MB", 1_250_000),
        (" 2 GiB ", 2 * GiB),  # surrounding and inner blanks
        ("3MiB", 3 * MiB),
    ],
)
def test_parse_size_accepts(text, expected):
    assert parse_size(text) == expected


def test_parse_size_rounds_fractions_down():
    assert parse_size("1.0001KiB") == 1024  # 1024.1024 -> 1024
    assert parse_size("0.9B") == 0
    assert isinstance(parse_size("1.5GiB"), int)


@pytest.mark.parametrize("value", [0, 1, 4096, 1 << 40])
def test_parse_size_passes_ints_through(value):
    assert parse_size(value) == value


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("12XB", "unknown size unit 'XB'"),
        ("2GiBs", "unknown size unit"),
        ("5 bytes", "unknown size unit"),
        ("abc", "malformed size 'abc'"),
        ("", "malformed size"),
        ("   ", "malformed size"),
        ("GiB", "malformed size"),
        ("-1GiB", "malformed size"),
        ("1e9", "malformed size"),
        ("1 2", "malformed size"),
        ("1..5MiB", "malformed size"),
        ("nan", "malformed size"),
        ("inf", "malformed size"),
        ("0x10", "malformed size"),
    ],
)
def test_parse_size_rejects_with_clear_message(text, fragment):
    with pytest.raises(ValueError) as info:
        parse_size(text)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("value", [-1, True, False, None, 1.5, [1]])
def test_parse_size_rejects_non_sizes(value):
    with pytest.raises(ValueError):
        parse_size(value)


def test_malformed_size_message_lists_units():
    with pytest.raises(ValueError) as info:
        parse_size("lots")
    for unit in ("KiB", "MiB", "GiB", "KB", "MB", "GB"):
        assert unit in str(info.value)


@pytest.mark.parametrize(
    "n, text",
    [
        (None, "-"),
        (0, "0 B"),
        (1, "1 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (3 * MiB, "3.0 MiB"),
        (3 * GiB // 2, "1.5 GiB"),
        (5 * TiB, "5.0 TiB"),
        (2048 * TiB, "2048.0 TiB"),  # TiB is the largest unit
        (-2048, "-2.0 KiB"),
        (-5, "-5 B"),
        (1024.0, "1.0 KiB"),
    ],
)
def test_format_size(n, text):
    assert format_size(n) == text


@pytest.mark.parametrize("n", [0, 1, 512, KiB, 3 * MiB, 7 * GiB, 2 * TiB])
def test_format_then_parse_round_trips_exact_binary_sizes(n):
    assert parse_size(format_size(n).replace(" ", "")) == n


@pytest.mark.parametrize(
    "text, expected",
    [("0", 0.0), ("1", 1.0), ("0.5", 0.5), (" 0.25 ", 0.25), ("1.0", 1.0), ("0.0", 0.0), (0.75, 0.75), (1, 1.0), ("1e-1", 0.1), ("-0", 0.0)],
)
def test_parse_fraction_accepts(text, expected):
    assert parse_fraction(text) == expected


@pytest.mark.parametrize("text", ["1.5", "-0.1", "2", "nan", "NaN", "inf", "-inf", "abc", "", None, "0.5.1", float("nan")])
def test_parse_fraction_rejects(text):
    with pytest.raises(ValueError):
        parse_fraction(text)


def test_parse_fraction_message_names_the_option():
    with pytest.raises(ValueError) as info:
        parse_fraction("1.5", "--sm-share")
    assert "--sm-share" in str(info.value) and "1.5" in str(info.value) and "between 0 and 1" in str(info.value)
    with pytest.raises(ValueError) as info:
        parse_fraction("abc", "share")
    assert "share" in str(info.value) and "'abc'" in str(info.value)


def test_parse_fraction_result_is_finite_float():
    value = parse_fraction("0.3")
    assert isinstance(value, float) and math.isfinite(value)
