"""The lake benchmark: Spark against in-process estimates, and the memory of ``estimate-lake``
(:mod:`bench.lake.__main__`)."""
