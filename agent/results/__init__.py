"""Results: one type per family of figures the agent reports — a window's estimates
(:class:`~agent.results.window.WindowEntry`), the bundle's section (:class:`~agent.results.bundle.BundleSection`),
a window's segment table (:class:`~agent.results.segments.SegmentResult`), a challenger's pair
(:class:`~agent.results.paired.PairedEntry`) and ``check``'s report
(:class:`~agent.results.check_report.CheckReport`) — each rendering itself as JSON (``to_json``), as the lines a
person reads (``to_text``), as metric points (``points``) and as one flat row (``to_row``), so that the
documents, the metrics and the text never disagree; a client of ``GET /v1/estimates`` (the demo) reads the
served document back as typed results (:mod:`agent.results.served`). Above :mod:`agent.estimation` (which
computes the figures and imports no exporter), below whoever serves them."""
