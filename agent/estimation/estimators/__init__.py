"""The estimators of a window's accuracy: one registry of specs (:mod:`.registry`) and what they compute with:
``icos``/``cbpe``/``atc``/``doc`` in the registry, the label-assisted estimates (:mod:`.prediction_powered`,
:mod:`.active`, the stratified draws of :mod:`.strata`), ``shift_aware`` (:mod:`.shift_aware`, its calibration
:mod:`.shift_calibration` and its forests :mod:`.tree_ensemble`), the trust distance (:mod:`.trust`), the
correctness predictor (:mod:`.correctness`), the headline's evidence (:mod:`.evidence`) and the reliability
marks (:mod:`.reliability`).

They read the statistics below them and a calibration through
:class:`~.calibrated.EstimatesCalibration`: the bundle's aggregate also holds the flag's and the segments'
models, which read estimates, so the estimators never import it. Fitted at ``fit`` by
:mod:`agent.offline.calibration.estimators`.
"""
