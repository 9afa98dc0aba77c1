"""Label-free accuracy estimation: the additive window statistics (:mod:`.statistics`), the calibrations
fitted offline (:mod:`.calibration`, :mod:`.shift_fitting`, :mod:`.shifts`) and the estimators, one registry
(:mod:`.estimators`). Pure computation: no I/O, no HTTP, no threads.
"""
