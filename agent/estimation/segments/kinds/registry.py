"""Every segment kind, by name, in the order ``fit`` lists a bundle's dimensions (one entry per kind module)."""

from __future__ import annotations

from agent.estimation.segments.kinds.base import SegmentKind
from agent.estimation.segments.kinds.column import Column
from agent.estimation.segments.kinds.predicted import Predicted
from agent.estimation.segments.kinds.region import Region
from agent.estimation.segments.kinds.rule import Rule

KINDS: dict[str, SegmentKind] = {kind.name: kind for kind in (Predicted(), Column(), Rule(), Region())}
