"""The calibration at ``fit``, which runs the model: the fit-time room of each capability of
:mod:`agent.estimation`, under the same name.

Shared by the rooms: corrupted copies of the calibration split (:mod:`.corruptions`,
:mod:`.input_corruptions`) passed through the model and judged (:mod:`.sets`, :mod:`.judged`), and the
simulated shifts' windows (:mod:`.shift_windows`). The rooms: :mod:`.estimators` (``shift_aware`` fitted on
windows of the corrupted sets, the headline chosen from evidence on simulated shifts), :mod:`.flag` (the flag
fitted on the same windows), :mod:`.segments` (the segments fixed at fit, one module per kind) and
:mod:`.pairs` (a pair's calibration of its disagreements).

What a window needs at serving time stays in :mod:`agent.estimation`, which imports no model.
"""
