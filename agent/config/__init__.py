"""Settings of ``icos-agent serve``: the YAML file plus ``ICOS_AGENT_*`` overrides validated into one
pydantic model (:mod:`.settings`, the root), whose sections live with their concern (:mod:`.model`,
:mod:`.server`, :mod:`.estimates`, :mod:`.labels` and :mod:`.sampling`, :mod:`.fleet`), each field
documented by the docstring under it; and where the model comes from when it is an MLflow URI
(:mod:`.model_source`). Sits above :mod:`agent.audits`, whose registry shapes the ``audits`` section.
"""
