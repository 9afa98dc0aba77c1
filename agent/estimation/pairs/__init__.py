"""A model and its challenger on the same traffic: the pair's calibration of their disagreements
(:mod:`.calibration`) and the difference of their accuracies on a window (:mod:`.paired`).

Reads only the intervals: independent of the estimators, the flag and the segments. Fitted at ``fit`` by
:mod:`agent.offline.calibration.pairs`.
"""
