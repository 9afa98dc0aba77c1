"""Every segment kind's fit-time part, by name, in the order they take from ``fit --max-segments``: the
predicted class first, then the rules, the regions, and the table columns while the bound allows."""

from __future__ import annotations

from agent.offline.calibration.segments.kinds.base import SegmentKindFit
from agent.offline.calibration.segments.kinds.column import Column
from agent.offline.calibration.segments.kinds.predicted import Predicted
from agent.offline.calibration.segments.kinds.region import Region
from agent.offline.calibration.segments.kinds.rule import Rule

FITS: dict[str, SegmentKindFit] = {fit.name: fit for fit in (Predicted(), Rule(), Region(), Column())}
