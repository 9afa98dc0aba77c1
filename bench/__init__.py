"""Benchmarks (not tests): each prints ratios against a baseline measured in the same run.

Run them as modules from the repository root (``python -m bench [name ...]``, ``python -m bench.serving``):
they import the agent as the installed package and ``bench`` (and the tests' servers, ``tests.support``) as
packages of the repository, never by editing ``sys.path``.
"""
