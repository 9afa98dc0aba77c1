"""Label-free accuracy estimation of a window: the additive window statistics (:mod:`.statistics`), the
calibrations the estimators read (:mod:`.calibration`) and the estimators, one registry of specs
(:mod:`.estimators`). Pure computation that runs no model: no I/O, no HTTP, no threads; the calibrations are
fitted by :mod:`agent.offline.calibration`, which does.
"""
