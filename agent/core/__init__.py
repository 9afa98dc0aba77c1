"""Plumbing every other layer may use and that knows nothing of models: durations, JSON logs with
credentials redacted, OS thread names, and the APScheduler adapter.
"""
