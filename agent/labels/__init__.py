"""Delayed labels: the prediction store (SQLite; :mod:`.store`, :mod:`.rows`, :mod:`.sqlite_schema`), realized
accuracy per window (:mod:`.realized`) and the service that joins labels and recalibrates (:mod:`.service`).
Knows nothing of HTTP: :mod:`agent.server.labels_routes` exposes it.
"""
