"""The fleet's comparison of the champion with its challenger: the replicas' pair sums
(``icos_challenger_stat_total{model,version,bundle,stat}``, ``bundle`` the challenger bundle's label) summed
per window exactly as the window statistics are (:func:`~agent.fleet.window_sums.window_sums`: raw counter
values differenced, restarts corrected per replica), checked, and the label-free paired difference
estimated on them with the pair's calibration from the challenger's bundle (``challenger.bundle_path`` of the
evaluator's settings), as one agent estimates its own (:func:`agent.results.paired.paired_entry`).

It is the evaluator's one fleet companion (:class:`~agent.fleet.companions.FleetCompanion`) of a challenger.
Sums of two challenger bundles under one champion version are never added: that version gets no comparison
(its ``mismatch`` says why). Each version's own accuracy on the paired requests, and the label-assisted
difference, stay the agents' (the drawn disagreements are each replica's own).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.registry import Collector

from agent.config.settings import AgentSettings
from agent.errors import UserError
from agent.estimation.pairs.calibration import PairCalibration, pair_of_bundle
from agent.estimation.pairs.paired import COUNTS, EXPORTED, PairSums
from agent.fleet.prometheus_api import PrometheusAPI
from agent.fleet.stat_schema import PROBABILITY_SLACK, ROUNDING, WHOLE, RefusedAnswer, StatSchema
from agent.fleet.window_sums import FleetScope, window_sums
from agent.results.paired import PairedEntry, challenger_json, paired_entry, paired_points
from exporters.challenger_metrics import ChallengerCollector, ChallengerSnapshot
from invariants.bundle import Bundle, BundleError, sha256_file

#: The replicas' counter of the pair's label-free sums (:class:`exporters.challenger_metrics.PairStatsCollector`).
PAIR_METRIC = "icos_challenger_stat_total"
#: The names a replica exports, and which of them are counts.
PAIR_SCHEMA = StatSchema(frozenset(EXPORTED), frozenset(COUNTS), {}, False)


def checked_pair_sums(items: Mapping[str, float], scale: float, where: str) -> PairSums:
    """The pair sums of summed increments ``items``, checked as replicas of one pair can have sent them:
    whole counts, at most as many disagreements as paired predictions, ``Σq_A + Σq_B ≤ n_dis`` and
    ``Σg² ≤ n_dis`` (probabilities); raises :class:`RefusedAnswer` (``inconsistent``) otherwise."""
    tol = ROUNDING * scale + 1e-9
    clean: dict[str, float] = {}
    for stat, value in items.items():
        if stat in COUNTS:
            if abs(value - round(value)) > WHOLE or round(value) < 0:
                raise RefusedAnswer("inconsistent", f"{where}: count {stat} is {value!r} (not a whole number ≥ 0)")
            clean[stat] = round(value)
        elif value < -tol:
            raise RefusedAnswer("inconsistent", f"{where}: sum {stat} is negative ({value!r})")
        else:
            clean[stat] = max(value, 0.0)
    s = PairSums.from_items(clean)
    bound = s.n_dis * (1 + PROBABILITY_SLACK) + tol
    if s.n_dis > s.n:
        raise RefusedAnswer("inconsistent", f"{where}: n_dis {s.n_dis} > n {s.n}")
    if s.qa_sum + s.qb_sum > bound or s.g_sq_sum > bound:
        raise RefusedAnswer("inconsistent", f"{where}: the disagreements' probabilities exceed their count")
    return s


@dataclass
class FleetPairs:
    """One refresh's comparison: per champion version, each window's entry and its replicas; the versions
    left out (several challenger bundles, or not this evaluator's)."""

    windows: dict[str, dict[str, PairedEntry]] = field(default_factory=dict)
    replicas: dict[str, dict[str, int]] = field(default_factory=dict)
    mismatches: set[tuple[str, str]] = field(default_factory=set)
    queries: int = 0


class FleetChallenger:
    """Sums and estimates one champion's comparison with one challenger over the fleet."""

    def __init__(self, settings: AgentSettings, model: str, pair: PairCalibration, bundle_label: str) -> None:
        self.name = settings.challenger.version
        self.model = model
        #: the champion version of the ``icos_fleet_challenger_*`` series (the configured one)
        self.champion_version = settings.model.version
        self.pair = pair
        self.bundle_label = bundle_label
        fleet = settings.fleet
        self.scope = FleetScope(model, bundle_label, PAIR_SCHEMA, fleet.selector, fleet.max_versions, PAIR_METRIC)

    @classmethod
    def of_settings(cls, settings: AgentSettings, champion_sha256: str | None) -> list[FleetChallenger]:
        """The challenger of the evaluator's settings, as a list of fleet companions (empty without one);
        raises :class:`UserError`."""
        path = settings.challenger.bundle_path
        if path is None:
            return []
        try:
            bundle = Bundle.load(path)
            pair = pair_of_bundle(bundle.pair, champion_sha256 or None)
        except (BundleError, ValueError) as exc:
            raise UserError(f"challenger.bundle_path: {path}: {exc}") from None
        return [cls(settings, settings.model.name, pair, sha256_file(path / "manifest.json")[:16])]

    async def evaluate(
        self, api: PrometheusAPI, at: float, windows: Mapping[str, float], lookback_s: float
    ) -> FleetPairs:
        """Every window's comparison at ``at`` (raises :class:`~agent.fleet.prometheus_api.RefreshError`)."""
        out = FleetPairs()
        every = await window_sums(api, self.scope, at, windows, lookback_s)
        for name, sums in every.items():
            out.queries += sums.queries
            bundles: dict[str, set[str]] = {}
            for (model, version, bundle), items in sums.stats.items():
                if items.get("n", 0) >= 0.5:
                    bundles.setdefault(version, set()).add(bundle)
                if bundle != self.bundle_label:
                    continue
                where = f"model {model} version {version} challenger {self.name}, window {name}"
                pair = checked_pair_sums(items, sums.scale.get((model, version, bundle), 0.0), where)
                out.windows.setdefault(version, {})[name] = paired_entry(name, pair, self.pair)
                out.replicas.setdefault(version, {})[name] = sums.replicas.get((model, version, bundle), 0)
            for version, seen in bundles.items():
                if len(seen) > 1:
                    out.mismatches.add((version, "mixed"))
                elif seen != {self.bundle_label}:
                    out.mismatches.add((version, "other_bundle"))
        for version, _ in out.mismatches:
            out.windows.pop(version, None)
        return out

    def section(self, pairs: FleetPairs | None, version: str) -> dict[str, Any]:
        """The ``challenger`` section of the fleet's ``/v1/estimates`` for one champion version."""
        info: dict[str, Any] = {"model": {"version": self.name}, "bundle": self.bundle_label}
        entries = pairs.windows.get(version, {}) if pairs is not None else {}
        if pairs is not None:
            info["mismatch"] = next((why for v, why in sorted(pairs.mismatches) if v == version), None)
        doc = challenger_json(info, entries.values())
        for name, w in doc["windows"].items():
            w["replicas"] = pairs.replicas.get(version, {}).get(name, 0) if pairs is not None else 0
        return doc

    def sections(self, part: FleetPairs | None, version: str) -> Mapping[str, Any]:
        return {"challenger": self.section(part, version)}

    def snapshot(self, pairs: FleetPairs | None) -> ChallengerSnapshot:
        """What the ``icos_fleet_challenger_*`` collector exports (the configured champion version)."""
        version = self.champion_version
        entries = pairs.windows.get(version, {}) if pairs is not None else {}
        return ChallengerSnapshot(self.model, version, self.name, paired_points(entries.values()))

    def collectors(self, part: Callable[[], FleetPairs | None]) -> Sequence[Collector]:
        return [ChallengerCollector(lambda: self.snapshot(part()), prefix="icos_fleet_")]
