"""Whole numbers written in text: job ids, attempts, ports, pids."""

from __future__ import annotations


def is_decimal(text: str) -> bool:
    """Whether `text` is a whole number in ASCII digits. `str.isdigit` alone also takes '¹',
    which `int` refuses (a request naming job '¹' was answered 500), and '٣', which `int`
    reads as 3: a name that is not the id it seems."""
    return text.isascii() and text.isdigit()
