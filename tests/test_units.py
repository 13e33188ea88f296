"""Unit strings are parsed once, strictly: bits vs bytes, binary vs decimal prefixes, time, counts."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fmsim.errors import ConfigError, UnitError
from fmsim.units import (
    format_quantity,
    parse_bytes,
    parse_count,
    parse_flop_rate,
    parse_flops,
    parse_quantity,
    parse_rate,
    parse_time,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("3200 Gbps", 400e9),  # EFA v2 on p5: 3,200 gigabits per second = 400 GB/s
        ("400 Gb/s", 50e9),
        ("100 Gbit/s", 12.5e9),
        ("3.35 TB/s", 3.35e12),  # H100 HBM3
        ("900 GBps", 900e9),
        ("250 MB/s", 250e6),
        ("1 GiB/s", 2.0**30),
        ("8 bps", 1.0),
        (12.5e9, 12.5e9),  # a bare number is already bytes/s
    ],
)
def test_rates_distinguish_bits_from_bytes(text, expected):
    assert parse_rate(text) == pytest.approx(expected)


def test_gbps_is_one_eighth_of_gb_per_s():
    assert parse_rate("100 Gbps") * 8 == parse_rate("100 GB/s")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("80 GiB", 80 * 2.0**30),
        ("80 GB", 80e9),
        ("1.5 TB", 1.5e12),
        ("512 MiB", 512 * 2.0**20),
        ("30.4 TB", 30.4e12),
        ("400 Gb", 50e9),  # bits
        ("1 KiB", 1024.0),
        ("1 kB", 1000.0),
        ("100 bytes", 100.0),
        ("2 TiB", 2 * 2.0**40),
        (4096, 4096.0),
    ],
)
def test_sizes_distinguish_binary_from_decimal(text, expected):
    assert parse_bytes(text) == pytest.approx(expected)


def test_gib_is_larger_than_gb():
    assert parse_bytes("80 GiB") / parse_bytes("80 GB") == pytest.approx(2**30 / 1e9)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1.5 us", 1.5e-6),
        ("1.5 µs", 1.5e-6),
        ("250 ns", 250e-9),
        ("12 ms", 0.012),
        ("12.3 s", 12.3),
        ("30 min", 1800.0),
        ("5 m", 300.0),
        ("1000 h", 3.6e6),
        ("2 d", 172800.0),
        ("10 minutes", 600.0),
        (600, 600.0),
        ("45", 45.0),
    ],
)
def test_durations(text, expected):
    assert parse_time(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("15T", 15e12),
        ("16M", 16e6),
        ("2k", 2000.0),
        ("2K", 2000.0),
        ("405B", 405e9),
        ("1.5G", 1.5e9),
        ("16Mi", 2.0**24),
        ("4Ki", 4096.0),
        ("2048", 2048.0),
        (2048, 2048.0),
        ("1_000", 1000.0),
    ],
)
def test_counts_with_decimal_and_binary_suffixes(text, expected):
    assert parse_count(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("989 TFLOP/s", 989e12),
        ("989 TFLOPS", 989e12),
        ("1979 TFLOP/s", 1979e12),
        ("2.5 PFLOP/s", 2.5e15),
        (312e12, 312e12),
    ],
)
def test_flop_rates(text, expected):
    assert parse_flop_rate(text) == pytest.approx(expected)


def test_flop_counts():
    assert parse_flops("3.1e23") == pytest.approx(3.1e23)
    assert parse_flops("5 EFLOP") == pytest.approx(5e18)


@pytest.mark.parametrize(
    "parse, text",
    [
        (parse_rate, "100 GB"),  # a size is not a rate
        (parse_rate, "fast"),
        (parse_bytes, "80 GB/s"),  # a rate is not a size
        (parse_bytes, "80 Gx"),
        (parse_bytes, "80 kiB"),  # binary prefixes are Ki, Mi, Gi ...
        (parse_time, "30 parsecs"),
        (parse_time, "1 week"),
        (parse_count, "15 tokens"),
        (parse_count, "45%"),
        (parse_flop_rate, "989 TB/s"),
        (parse_bytes, True),
        (parse_bytes, None),
        (parse_bytes, [1, 2]),
        (parse_bytes, float("inf")),
        (parse_bytes, "1e999 GB"),  # overflows to infinity: refused, not passed on
        (parse_time, "nan s"),
    ],
)
def test_malformed_quantities_raise_unit_errors(parse, text):
    with pytest.raises(UnitError):
        parse(text)


def test_unit_error_is_a_config_error():
    with pytest.raises(ConfigError, match="cannot read '3 parsecs' as a duration"):
        parse_time("3 parsecs")


def test_numpy_scalars_are_numbers():
    assert parse_bytes(np.float64(1.5)) == 1.5
    assert parse_count(np.int64(7)) == 7.0


def test_parse_quantity_dispatches_on_dimension():
    assert parse_quantity("3200 Gbps", "bytes_per_s") == pytest.approx(400e9)
    with pytest.raises(ValueError):
        parse_quantity("1", "furlongs")


@pytest.mark.parametrize(
    "value, dim, expected",
    [
        (80 * 2.0**30, "bytes", "80 GiB"),
        (12.3, "s", "12.3 s"),
        (1800.0, "s", "30 min"),
        (1.5e-6, "s", "1.5 us"),
        (0.0, "s", "0 s"),
        (3.35e12, "bytes_per_s", "3.35 TB/s"),
        (989e12, "flop_per_s", "989 TFLOP/s"),
        (1234.5, "usd", "$1,234.50"),
        (2.514e8, "s", "2,910 d"),                      # past the largest unit: digits, not 2.91e+03
        (999.7, "s", "16.7 min"),
        (5e21, "flop", "5,000 EFLOP"),
        (2e-5, "count", "2e-05"),                        # far below one stays in exponent form, not "0"
        (None, "s", "-"),
        (float("nan"), "bytes", "-"),
    ],
)
def test_format_quantity(value, dim, expected):
    assert format_quantity(value, dim) == expected


@given(
    st.floats(min_value=1e-9, max_value=1e18, allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "K", "M", "G", "T", "Ki", "Mi", "Gi", "Ti"]),
)
def test_size_strings_scale_the_number_by_the_prefix(x, prefix):
    scale = {
        "": 1.0,
        "K": 1e3,
        "M": 1e6,
        "G": 1e9,
        "T": 1e12,
        "Ki": 2.0**10,
        "Mi": 2.0**20,
        "Gi": 2.0**30,
        "Ti": 2.0**40,
    }[prefix]
    assert math.isclose(parse_bytes(f"{x!r} {prefix}B"), x * scale, rel_tol=1e-12)
    assert math.isclose(parse_rate(f"{x!r} {prefix}bps"), x * scale / 8, rel_tol=1e-12)
