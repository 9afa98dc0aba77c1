"""The seeded challenger models of the benchmark and the tests (``train.py`` rebuilds them)."""
