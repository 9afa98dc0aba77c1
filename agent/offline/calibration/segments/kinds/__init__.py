"""The fit-time part of every segment kind, one module each behind :class:`~.base.SegmentKindFit`, named as its
serving part under :mod:`agent.estimation.segments.kinds`; :mod:`.registry` lists them."""
