"""The challenger of ``challenger:`` settings: its runtime (its model run here whatever the mode, judged by its
bundle), the pair's calibration checked against the champion, and the companion built from them with its
metrics and, with delayed labels, its preference for the disagreements in the labeling sample."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from agent.config.settings import AgentSettings
from agent.dataplane.challenger.companion import Challenger, Forward
from agent.errors import UserError
from agent.estimation.pairs.calibration import PairCalibration, pair_of_bundle
from agent.judging.companions import Companion
from agent.judging.runtime import Runtime, load_runtime
from agent.labels.paired_labels import DisagreementDraws
from exporters.challenger_metrics import ChallengerMetrics


def load_challenger(settings: AgentSettings, champion: Runtime) -> tuple[Runtime, PairCalibration]:
    """The challenger's runtime and the pair's calibration, checked against ``champion``; raises
    :class:`UserError` naming the setting to fix."""
    cfg = settings.challenger
    assert cfg.model_path is not None and cfg.bundle_path is not None
    model = settings.model.model_copy(
        update={"path": cfg.model_path, "uri": None, "scores_output": cfg.scores_output, "scores_kind": cfg.scores_kind}
    )
    own = settings.model_copy(
        update={"mode": "serve", "model": model, "bundle": settings.bundle.model_copy(update={"path": cfg.bundle_path})}
    )
    rt = load_runtime(own, version=cfg.version)
    if len(rt.classes) != len(champion.classes):
        raise UserError(
            f"challenger.model_path: the challenger predicts {len(rt.classes)} classes, the champion "
            f"{len(champion.classes)}: compare versions of one model"
        )
    try:
        pair = pair_of_bundle(rt.bundle.pair, champion.model_sha256 or None)
    except ValueError as exc:
        raise UserError(f"challenger.bundle_path: {cfg.bundle_path}: {exc}") from None
    return rt, pair


def challengers_of(
    settings: AgentSettings, registry: CollectorRegistry, champion: Runtime, forward: Forward | None
) -> list[Companion]:
    """The serving agent's challenger as a list of companions (empty without one, and in fleet mode, where the
    fleet's own comparison runs: :mod:`agent.fleet.challenger`); ``forward``: the labeling sample's hand-over
    (None without delayed labels)."""
    s = settings
    if not s.challenger.enabled or s.mode == "fleet":
        return []
    runtime, pair = load_challenger(s, champion)
    metrics = ChallengerMetrics(registry, s.challenger.version)
    draws = None
    if s.labels.enabled:
        longest = max(s.window_seconds.values(), default=s.labels.budget_seconds)
        draws = DisagreementDraws(
            s.challenger.labels_per_window, s.labels.budget_seconds, s.labels.max_predictions, longest
        )
    return [Challenger(s, runtime, pair, metrics, forward=forward, draws=draws)]
