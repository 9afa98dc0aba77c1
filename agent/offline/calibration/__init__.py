"""The estimators' calibration at ``fit``, which runs the model: corrupted copies of the calibration split
(:mod:`~agent.offline.calibration.corruptions`, :mod:`~agent.offline.calibration.input_corruptions`) passed
through the model and judged (:mod:`~agent.offline.calibration.sets`,
:mod:`~agent.offline.calibration.judged`), ``shift_aware`` fitted on windows of them
(:mod:`~agent.offline.calibration.shift_fitting`), and the headline chosen from evidence on simulated shifts
(:mod:`~agent.offline.calibration.headline_choice`, :mod:`~agent.offline.calibration.shift_windows`).

What a window needs at serving time (the statistics, the estimators, the calibrations they read) stays in
:mod:`agent.estimation`, which imports no model.
"""
