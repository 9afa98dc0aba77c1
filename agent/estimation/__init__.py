"""Label-free accuracy estimation of a window, by capability. Pure computation that runs no model: no I/O, no
HTTP, no threads. Every capability has two rooms of one name: its serving part here, its fit-time part (which
runs the model) under :mod:`agent.offline.calibration`.

Top to bottom (the ``layers`` contract in pyproject.toml; a room imports only the rooms below it):

* :mod:`.calibration` — the bundle's aggregate :class:`~.calibration.EstimatorCalibration`: every
  capability's part, read from and written to the bundle in one place. It sits above every room, so the rooms
  read it through narrow protocols of their own (``StatisticsCalibration``, ``EstimatesCalibration``,
  ``FlagCalibration``, ``SegmentsCalibration``) and never import it.
* :mod:`.flag` — is the window's number right? The flag's model and the class-mix test, and the assessment
  of an estimated window. :mod:`.segments` — the segments fixed at fit (one module per kind), the
  per-segment table of a window and its realized accuracy. :mod:`.pairs` — a model and its challenger on the
  same traffic: the pair's calibration and the difference of their accuracies. Independent of each other.
* :mod:`.estimators` — the registry of estimators and what they compute with: the label-assisted estimates,
  ``shift_aware`` and its calibration, the trust distance, the correctness predictor, the headline's evidence.
* :mod:`.statistics` — the additive sums of a window (what a fleet adds over replicas), their items, the input
  reference they bin into, the per-class metrics.
* :mod:`.intervals`, :mod:`.layout` — estimates with intervals, and the bins every room shares.
"""
