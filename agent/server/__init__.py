"""``icos-agent serve``: the ASGI app (:mod:`.app`), the fast infer path (:mod:`.fast_path`), the routes
(:mod:`.routes`, :mod:`.labels_routes`, :mod:`.audit_routes`), the one error table (:mod:`.errors`) and JSON
helper (:mod:`.responses`), and the services that compose the lower layers (:mod:`.service`, :mod:`.audits`,
:mod:`.proxy`, :mod:`.observe`). See ``docs/architecture.md`` for the path of one request.
"""
