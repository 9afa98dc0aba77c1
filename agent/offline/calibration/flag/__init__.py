"""Fitting the flag at ``fit`` (:mod:`.fitting`): the fit-time room of :mod:`agent.estimation.flag`."""
