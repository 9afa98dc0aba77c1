"""Settings of ``icos-agent serve``: the YAML file plus ``ICOS_AGENT_*`` overrides validated into one
pydantic model (:mod:`.settings`), and where the model comes from when it is an MLflow URI
(:mod:`.model_source`). Sits above :mod:`agent.audits`, whose registry shapes the ``audits`` section.
"""
