"""ICOS likely invariants as a pure library: IDI, TDI, ADI, the ordered oracle and bundles.

This package never imports :mod:`agent` or :mod:`exporters`.
"""
