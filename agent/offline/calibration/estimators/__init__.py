"""The estimators' fit-time room (of :mod:`agent.estimation.estimators`): ``shift_aware`` fitted on windows of
corrupted sets (:mod:`.shift_fitting`) and the headline chosen from evidence on simulated shifts
(:mod:`.headline_choice`)."""
