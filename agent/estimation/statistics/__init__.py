"""A window's statistics: additive sums of its predictions (:mod:`.window`; a fleet adds them over replicas),
their exported items (:mod:`.items`), the input reference they bin into (:mod:`.reference`), the per-segment sums
they and the segments' references are added with (:mod:`.segment_sums`) and the per-class metrics
(:mod:`.class_metrics`).

The bottom room of :mod:`agent.estimation`: the sums read a calibration through
:class:`~.calibrated.StatisticsCalibration` (the ATC threshold, the reference, the predictor, the segments'
numbering) rather than the bundle's aggregate, and the labeled sums (:func:`~.window.weighted_sums`) live
next to the fields they fill, so the statistics import no estimator and no segment kind.
"""
