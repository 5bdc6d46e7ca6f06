"""Quantities as people write them: what each form means, and how each mistake is reported."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from aisched.spec import SpecError
from aisched.spec.units import (
    UnitError,
    k8s_cpu_milli,
    k8s_mem_mib,
    k8s_quantity,
    parse_cpus_milli,
    parse_duration_s,
    parse_gpus,
    parse_mem_mib,
    to_bytes,
    to_duration_s,
    to_gpus,
    to_mem_mib,
    to_milli_cpu,
)

GIB = 1024


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("512M", 512),
        ("512MB", 512),
        ("512Mi", 512),
        ("512MiB", 512),
        ("512m", 512),  # lower case is the same unit: memory has no milli
        ("8G", 8 * GIB),
        ("8GB", 8 * GIB),  # G and GB are binary too (documented)
        ("8Gi", 8 * GIB),
        ("8GiB", 8 * GIB),
        ("8gib", 8 * GIB),
        ("1.5T", 1536 * GIB),
        ("1P", 1024 * 1024 * GIB),
        ("2048K", 2),
        ("1536B", 1),  # rounded up: never less than asked for
        ("1.5K", 1),
        ("0.1G", 103),  # 102.4 MiB, rounded up
        (" 8 G ", 8 * GIB),
        ("0G", 0),
        ("0", 0),  # zero needs no unit: it is the same in every unit
        (" 0 ", 0),
        (0, 0),
    ],
)
def test_mem(text: Any, want: int) -> None:
    assert to_mem_mib(text) == want
    assert parse_mem_mib(text, "--mem") == want


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (8, "8 has no unit: give a unit, e.g. 8G or 512M"),
        (0.5, "0.5 has no unit: give a unit, e.g. 8G or 512M"),
        ("8", "'8' has no unit: give a unit, e.g. 8G or 512M"),
        ("8i", "'8i' is not a size: give a unit, e.g. 8G or 512M"),
        ("lots", "'lots' is not a size: give a number and a unit, e.g. 8G, 512M, 1.5T or 512Mi"),
        ("-8G", "'-8G' is not a size: give a number and a unit, e.g. 8G, 512M, 1.5T or 512Mi"),
        ("8X", "'8X' is not a size: give a number and a unit, e.g. 8G, 512M, 1.5T or 512Mi"),
        (True, "expected a size such as 8G or 512M, got true (a boolean)"),
        (None, "expected a size such as 8G or 512M, got nothing"),
        ([8], "expected a size such as 8G or 512M, got a list"),
    ],
)
def test_mem_errors(value: Any, want: str) -> None:
    with pytest.raises(UnitError) as info:
        to_mem_mib(value)
    assert str(info.value) == want
    with pytest.raises(SpecError) as spec_info:
        parse_mem_mib(value, "--mem")
    assert spec_info.value.problems == (f"--mem: {want}",)


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (90, 90.0),
        (1.5, 1.5),
        ("90", 90.0),
        ("90s", 90.0),
        ("30m", 1800.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("1h30m", 5400.0),
        ("1h 30m", 5400.0),
        ("1h0m0s", 3600.0),  # as Go (and so Kubernetes) prints durations
        ("1.5h", 5400.0),
        ("250ms", 0.25),
        (0, 0.0),
    ],
)
def test_duration(value: Any, want: float) -> None:
    assert to_duration_s(value) == want
    assert parse_duration_s(value, "--time-limit") == want


_NOT_A_DURATION = (
    "is not a duration: give seconds or a number with a unit (ms, s, m, h, d), e.g. 90s, 30m, 2h "
    "or 1h30m"
)


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("1h30", f"'1h30' {_NOT_A_DURATION}"),
        ("2H", f"'2H' {_NOT_A_DURATION}"),
        ("-5s", "'-5s' is negative"),  # it was "is not a duration"
        ("-1h30m", "'-1h30m' is negative"),
        ("--5s", f"'--5s' {_NOT_A_DURATION}"),
        ("", f"'' {_NOT_A_DURATION}"),
        ("1w", f"'1w' {_NOT_A_DURATION}"),
        (-1, "-1 is negative"),
        (float("inf"), "inf is not a finite number"),
        (float("nan"), "nan is not a finite number"),
        (False, "expected a duration such as 90s, 30m or 2h, got false (a boolean)"),
        ({"h": 1}, "expected a duration such as 90s, 30m or 2h, got a dict"),
    ],
)
def test_duration_errors(value: Any, want: str) -> None:
    with pytest.raises(UnitError) as info:
        to_duration_s(value)
    assert str(info.value) == want
    with pytest.raises(SpecError) as spec_info:
        parse_duration_s(value, "--time-limit")
    assert spec_info.value.problems == (f"--time-limit: {want}",)


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (4, 4000),
        (0.5, 500),
        (0.1, 100),  # exact: not 100.00000000000001 rounded up to 101
        ("4", 4000),
        ("0.5", 500),
        ("500m", 500),
        ("1.5m", 2),  # rounded up to a whole milli-CPU
        (0, 0),
    ],
)
def test_cpus(value: Any, want: int) -> None:
    assert to_milli_cpu(value) == want
    assert parse_cpus_milli(value, "--cpus") == want


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("four", "'four' is not a CPU count: give e.g. 4, 0.5 or 500m"),
        ("500M", "'500M' is not a CPU count: give e.g. 4, 0.5 or 500m"),
        (-1, "-1 is negative"),
        (None, "expected a CPU count such as 4, 0.5 or 500m, got nothing"),
    ],
)
def test_cpus_errors(value: Any, want: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_cpus_milli(value, "--cpus")
    assert info.value.problems == (f"--cpus: {want}",)


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (0, (0, 0)),
        (2, (2, 0)),
        (2.0, (2, 0)),
        ("8", (8, 0)),
        (0.5, (0, 500)),
        ("0.25", (0, 250)),
        (0.001, (0, 1)),
        (1, (1, 0)),
    ],
)
def test_gpus(value: Any, want: tuple[int, int]) -> None:
    assert to_gpus(value) == want
    assert parse_gpus(value, "--gpus") == want


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (1.5, "1.5: more than one GPU must be a whole number; a share (0 to 1) is of one GPU"),
        (0.0001, "0.0001: a share of a GPU is counted in thousandths, e.g. 0.25"),
        (-1, "-1 is negative"),
        ("half", "'half' is not a GPU count: give e.g. 1, 4 or 0.5"),
        (True, "expected a GPU count such as 1, 4 or 0.5, got true (a boolean)"),
    ],
)
def test_gpus_errors(value: Any, want: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_gpus(value, "--gpus")
    assert info.value.problems == (f"--gpus: {want}",)


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("8Gi", 8 * GIB),
        ("512Mi", 512),
        ("1G", 954),  # decimal in Kubernetes: 10**9 bytes, rounded up to whole MiB
        ("1e9", 954),
        (1073741824, 1024),  # bare: bytes
        ("1073741824", 1024),
        ("128974848000m", 123),  # milli-bytes, as Kubernetes allows
        ("1.5Gi", 1536),
        ("+1Ki", 1),
    ],
)
def test_k8s_memory(value: Any, want: int) -> None:
    assert k8s_mem_mib(value) == want


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("500m", 500),
        ("2", 2000),
        (2, 2000),
        (0.5, 500),
        ("1.5", 1500),
        ("100u", 1),
        ("2k", 2000000),
    ],
)
def test_k8s_cpu(value: Any, want: int) -> None:
    assert k8s_cpu_milli(value) == want


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("8GB", "'8GB' is not a Kubernetes quantity (e.g. 8Gi, 512Mi, 500m, 2)"),
        ("-1Gi", "-1Gi is negative"),
        ("1e99", "'1e99' is out of range"),
        ("9" * 40, f"'{'9' * 40}' is far too large"),
        (float("nan"), "nan is not a finite number"),
        ([], "expected a Kubernetes quantity such as 8Gi or 500m, got a list"),
    ],
)
def test_k8s_errors(value: Any, want: str) -> None:
    with pytest.raises(UnitError) as info:
        k8s_mem_mib(value)
    assert str(info.value) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [("64K", 65536), ("4096B", 4096), ("1.5M", 1572864), ("10MiB", 10485760), ("1k", 1024)],
)
def test_sizes_in_bytes_keep_what_mib_would_round_away(text: str, want: int) -> None:
    assert to_bytes(text) == want
    assert to_mem_mib(text) == -(-want // (1 << 20))


@pytest.mark.parametrize(
    ("parse", "value"),
    [
        (to_gpus, "٢"),  # Arabic-Indic two: Python's int() and Decimal() read it as 2
        (to_milli_cpu, "０.１"),  # full-width digits
        (to_mem_mib, "８G"),
        (to_duration_s, "９s"),
        (k8s_quantity, "１Gi"),
    ],
)
def test_only_ascii_digits_are_numbers(parse: Callable[[Any], object], value: str) -> None:
    with pytest.raises(UnitError):
        parse(value)
