"""Plumbing every other layer may use and that knows nothing of models: durations, JSON logs with
credentials redacted, OS thread names, the APScheduler adapter, opening the state directory's SQLite
files (checked at open, moved aside when damaged), and ending the background tasks a part started.
"""
