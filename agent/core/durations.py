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
