"""Fitting a pair's calibration at ``fit`` (:mod:`.fitting`): the fit-time room of :mod:`agent.estimation.pairs`."""
