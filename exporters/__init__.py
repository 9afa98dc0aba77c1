"""Prometheus collectors and the MLflow logger. They take plain results and know no HTTP."""
