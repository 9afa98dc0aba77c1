"""The flag "this number may be wrong": its model (:mod:`.model`), the class-mix test it reads
(:mod:`.class_mix`) and the assessment of an estimated window (:mod:`.assessment`), what every surface reports
as ``trust``.

Above the estimators (it reads their estimates) and beside the segments and the pairs; it reads a calibration
through :class:`~.assessment.FlagCalibration`. Fitted at ``fit`` by :mod:`agent.offline.calibration.flag`.
"""
