"""Results: the figures the agent reports, rendered once for every surface (the documents, the metrics), above
:mod:`agent.estimation` (which computes them and imports no exporter), below whoever serves them."""
