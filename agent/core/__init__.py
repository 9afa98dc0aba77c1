"""Plumbing every other layer may use and that knows nothing of models: durations, JSON logs with
credentials redacted, OS thread names, the APScheduler adapter, ending a component's asyncio tasks, and
opening the state directory's SQLite files (checked at open, moved aside when damaged).
"""
