"""Segments fixed at ``fit``: the segmentation and its reference (:mod:`.segmentation`), one module per kind of
dimension behind one base class (:mod:`.kinds`: predicted class, table column, TDI rule, region), the per-segment
table of a window with each segment's contribution to the drop (:mod:`.table`), what changed in each segment's
inputs (:mod:`.change`, over the change columns sketched at fit, :mod:`.sketch`), whether the change is across the
traffic rather than in a few segments (:mod:`.scope`) and a segment's realized accuracy from delayed labels
(:mod:`.realized`).

Above the estimators (the ``on_segments`` estimators run per segment) and beside the flag and the pairs; the
table reads a calibration through :class:`~.table.SegmentsCalibration`. Defined at ``fit`` by
:mod:`agent.offline.calibration.segments`, whose kinds are named as these.
"""
