"""Durations as the config files write them (``"90s"``, ``"5m"``, ``"1h"``), the one parser every section uses."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """``"90s"``, ``"5m"``, ``"1h"``, ``"1d"`` → seconds. Raises ``ValueError`` naming the format."""
    m = _DURATION.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a duration like 30s, 5m, 1h or 1d")
    return float(m.group(1)) * _UNIT_SECONDS[m.group(2)]


def duration_name(ns: int) -> str:
    """A span of ``ns`` nanoseconds as the config files write it, in the largest unit that divides it
    (``3_600_000_000_000`` → ``"1h"``, ``5_400_000_000_000`` → ``"90m"``): the inverse of :func:`parse_duration`
    for whole milliseconds. Raises ``ValueError`` for a span that is not a positive number of milliseconds."""
    ms = 1_000_000
    if ns <= 0 or ns % ms:
        raise ValueError(f"a span of {ns} ns is not a whole number of milliseconds")
    for unit in ("d", "h", "m", "s"):
        width = int(_UNIT_SECONDS[unit] * 1000) * ms
        if ns % width == 0:
            return f"{ns // width}{unit}"
    return f"{ns // ms}ms"
