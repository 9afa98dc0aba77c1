"""The work behind ``icos-agent fit`` (:mod:`.fit`, in the stages of :mod:`.fit_stages`, written once over a
:mod:`.fit_source`: invariants and estimator calibration into a bundle; :mod:`.calibration`: the calibration
that runs the model) and ``icos-agent check`` (:mod:`.check`: verdicts and every estimate for a data file;
:mod:`.tables` for tables of any model's predictions), both reading a model through :mod:`.viewing`.
"""
