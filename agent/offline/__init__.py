"""The work behind ``icos-agent fit`` (:mod:`.fit`: invariants and estimator calibration into a bundle) and
``icos-agent check`` (:mod:`.check`: verdicts and every estimate for a data file).
"""
