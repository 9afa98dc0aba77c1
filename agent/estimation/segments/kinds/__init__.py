"""The kinds of segment dimension, one module each behind :class:`~.base.SegmentKind`: how a dimension of the
kind reads a prediction at serving time. :mod:`.registry` lists them; a kind's fit-time part (how ``fit``
defines its dimensions) is the module of the same name under :mod:`agent.offline.calibration.segments.kinds`.
Adding a kind is one module here, one there, and one entry in each registry; ``tests/unit/test_segment_kinds.py``
runs every registered kind through the same checks.
"""
