"""Parameters of the robustness audits and the ``audits`` section of the agent's config.

One optional entry per registered audit kind (:mod:`agent.audits.registry`: its job model, i.e.
parameters plus schedule), then the shared settings. The parameter models live in
:mod:`agent.audits.params`.

Config example (see ``docs/audits.md``)::

    audits:
      reservoir: {size: 1000, horizon: 1h}
      mlflow: {tracking_uri: http://mlflow:5000, experiment: icos-agent-audits}
      dscore:
        interval: 6h            # or cron: "0 3 * * *" (exactly one of the two)
        time_budget: 10m
        data: {source: reference, path: reference.npz}
        n: 3
        t: 5
      metamorphic:
        cron: "30 * * * *"
        data: {source: live, min_samples: 200}
        transformations: [shift, brightness, gaussian_noise]
      baselines: {dscore: 0.65}  # what IcosDScoreDegraded compares with (default: the first run's)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, FiniteFloat, create_model, model_validator

import agent.audits.kinds  # noqa: F401  (registers the built-in kinds)
from agent.audits.params import (
    AuditData,
    AuditDataLimits,
    AuditMlflowConfig,
    CommonParams,
    ReservoirConfig,
    _Schedule,
    _Strict,
)
from agent.audits.registry import AUDIT_KINDS, PARAM_MODELS, baseline_gauge

__all__ = ["AUDIT_KINDS", "PARAM_MODELS", "AuditsConfig", "audits_config_model"]


class _AuditsSection(_Strict):
    """The ``audits`` section: one optional entry per audit kind, plus shared settings."""

    if TYPE_CHECKING:  # the fields, built by audits_config_model() after the kinds' entries
        reference: AuditData | None = None
        data_limits: AuditDataLimits = AuditDataLimits()
        reservoir: ReservoirConfig = ReservoirConfig()
        mlflow: AuditMlflowConfig = AuditMlflowConfig()
        history: int = 20
        first_run_delay: str | None = None
        baselines: dict[str, float] = {}

    @model_validator(mode="after")
    def _baselines_of_kinds_with_one(self) -> _AuditsSection:
        for kind in getattr(self, "baselines", {}):
            if baseline_gauge(kind) is None:
                have = [k for k in AUDIT_KINDS if baseline_gauge(k) is not None]
                raise ValueError(f"baselines: audit {kind!r} has no baseline; kinds with one: {', '.join(have)}")
        return self

    def configured_baselines(self) -> dict[str, float]:
        """``{gauge name: configured baseline}`` of ``baselines`` (keyed there by audit kind)."""
        out: dict[str, float] = {}
        for kind, value in getattr(self, "baselines", {}).items():
            gauge = baseline_gauge(kind)
            if gauge is not None:
                out[gauge] = value
        return out

    def jobs(self) -> dict[str, _Schedule]:
        out: dict[str, _Schedule] = {}
        for kind in AUDIT_KINDS:
            job = getattr(self, kind, None)
            if job is not None:
                out[kind] = job
        return out

    def data_for(self, kind: str) -> AuditData:
        """The data of ``kind``'s job, else ``reference``, else the live reservoir."""
        job = getattr(self, kind, None)
        if job is not None and job.data is not None:
            return job.data
        return self.reference if self.reference is not None else AuditData(source="live")

    def params_for(self, kind: str) -> CommonParams:
        """The configured parameters of ``kind`` (defaults when it has no entry)."""
        model = PARAM_MODELS[kind]
        job = getattr(self, kind, None)
        if job is None:
            return model()
        return model(**{k: v for k, v in job.model_dump().items() if k in model.model_fields})

    def resolve_paths(self, base: Path) -> None:
        """Make relative data paths relative to the config file's directory."""
        for data in [self.reference, *(j.data for j in self.jobs().values())]:
            if data is not None and data.path is not None and not data.path.is_absolute():
                data.path = base / data.path


def audits_config_model() -> type[_AuditsSection]:
    """The model of the ``audits`` section for the kinds registered now: one optional job entry
    per kind (in registration order), then the shared settings."""
    per_kind: dict[str, Any] = {name: (kind.job | None, None) for name, kind in AUDIT_KINDS.items()}
    shared: dict[str, Any] = {
        "reference": (
            AuditData | None,
            Field(None, description="default data of audits without their own (and of POST /v1/audits/{kind})"),
        ),
        "data_limits": (AuditDataLimits, Field(default_factory=AuditDataLimits)),
        "reservoir": (ReservoirConfig, Field(default_factory=ReservoirConfig)),
        "mlflow": (AuditMlflowConfig, Field(default_factory=AuditMlflowConfig)),
        "history": (int, Field(20, ge=1, le=1000, description="results kept per audit for GET /v1/audits")),
        "first_run_delay": (
            str | None,
            Field(None, description="interval jobs first run this long after start (default: one interval)"),
        ),
        "baselines": (
            dict[str, FiniteFloat],
            Field(
                default_factory=dict,
                description="per audit kind, the baseline its alert compares results with (`dscore`: the D-Score, "
                "exported as icos_dscore_baseline); a kind not listed takes its first successful run's result for "
                "the current model and audit settings",
            ),
        ),
    }
    return create_model(
        "AuditsConfig",
        __base__=_AuditsSection,
        __module__=__name__,
        __doc__=_AuditsSection.__doc__,
        **per_kind,
        **shared,
    )


if TYPE_CHECKING:
    AuditsConfig = _AuditsSection
else:
    AuditsConfig = audits_config_model()
