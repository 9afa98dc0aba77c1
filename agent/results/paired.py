"""A challenger's comparison with the champion on the same requests, as a result: one window of paired
predictions estimated once (:func:`paired_entry`) and rendered as the ``challenger`` section
(:func:`challenger_json`), as the ``icos_challenger_*`` metrics (:meth:`PairedEntry.points`), as the lines
``check`` prints (:func:`challenger_lines`) and as one flat row."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.registry import estimate_window, headline_of
from agent.estimation.intervals import Estimate
from agent.estimation.pairs.calibration import PairCalibration
from agent.estimation.pairs.paired import Difference, PairSums, best_of, differences
from agent.estimation.statistics.window import WindowStats
from agent.results.estimate import DECIMALS, estimate_point, estimate_row, headline_json, rounded
from exporters.challenger_metrics import PairedPoint
from exporters.prometheus import EstimatePoint


@dataclass(frozen=True)
class PairedModel:
    """One version of a pair as its window is estimated: its bundle's calibration and headline estimator."""

    calibration: EstimatorCalibration
    headline: str


def challenger_lines(section: object) -> list[str]:
    """A ``challenger`` section in a few lines: the agreement, the difference and what it decides, each
    version's headline, and the truth when known."""
    if not isinstance(section, dict):
        return []
    lines = [f"challenger: agrees with the model on {section['agreement']:.1%} of {section['n']} predictions"]
    for role in ("champion", "challenger"):
        h = section.get(role)
        if isinstance(h, dict):
            lines.append(f"  {role:<11}{h['value']:>9.3f}   [{h['lower']:.3f}, {h['upper']:.3f}]  ({h['estimator']})")
    for name, d in section.get("differences", {}).items():
        verdict = "better" if d["lower"] > 0 else "worse" if d["upper"] < 0 else "undecided"
        labels = f", {d['n_labels']} labels" if "n_labels" in d else ""
        lines.append(
            f"  difference {d['value']:>+8.3f}   [{d['lower']:+.3f}, {d['upper']:+.3f}]  ({name}{labels}): "
            f"challenger {verdict}" + (" with 95% confidence" if verdict != "undecided" else "")
        )
        if "unreliable" in d:
            lines.append(f"    unreliable: {d['unreliable']}")
    truth = section.get("truth")
    if isinstance(truth, dict):
        lines.append(
            f"  true difference {truth['difference']:+.3f} (champion {truth['champion']:.3f}, "
            f"challenger {truth['challenger']:.3f})"
        )
    return lines


@dataclass(frozen=True)
class PairedEntry:
    """One window of paired predictions estimated once: the pair's sums, every difference, and each version's
    headline on the paired predictions (None where only the pair's sums are known: the fleet)."""

    name: str
    pair: PairSums
    differences: dict[str, Difference]
    champion: tuple[str, Estimate] | None = None
    challenger: tuple[str, Estimate] | None = None
    #: why the label-free difference should not be read as a number (None: it can be)
    label_free_caveat: str | None = None

    def difference_json(self, name: str, d: Difference, decimals: int | None) -> dict[str, Any]:
        out: dict[str, Any] = {k: rounded(v, decimals) for k, v in d.to_dict().items()}
        if name == "label_free" and self.label_free_caveat is not None:
            out["unreliable"] = self.label_free_caveat
        return out

    def to_json(self, *, decimals: int | None = DECIMALS) -> dict[str, Any]:
        """The window in a ``challenger`` section: the paired predictions and their agreement, the difference
        reported first (``difference``: labeled when the window has labeled disagreements) and every one, and
        each version's headline."""
        out: dict[str, Any] = {
            "n": self.pair.n,
            "disagreements": self.pair.n_dis,
            "agreement": round(self.pair.agreement, decimals) if decimals is not None else self.pair.agreement,
        }
        best = best_of(self.differences)
        if best is not None:
            out["difference"] = {"estimator": best[0], **self.difference_json(*best, decimals)}
        out["differences"] = {k: self.difference_json(k, d, decimals) for k, d in self.differences.items()}
        for role, headline in (("champion", self.champion), ("challenger", self.challenger)):
            if headline is not None:
                out[role] = headline_json(headline)
        return out

    def to_text(self) -> list[str]:
        """The lines ``check`` prints of the window (:func:`challenger_lines`)."""
        return challenger_lines(self.to_json(decimals=None))

    def points(self) -> PairedPoint:
        """The window as the ``icos_challenger_*`` collectors export it."""
        diffs = [EstimatePoint(k, self.name, d.value, d.lower, d.upper, d.n) for k, d in self.differences.items()]
        sides = [
            estimate_point(h[0], self.name, h[1]) if h is not None else None for h in (self.champion, self.challenger)
        ]
        return PairedPoint(self.name, self.pair.n, self.pair.agreement, diffs, sides[0], sides[1])

    def to_row(self) -> dict[str, Any]:
        """One flat row: the window, the paired predictions and their agreement, the difference reported first
        (its ``estimator``, ``value``, ``lower``, ``upper``; ``alert``: its interval excludes zero), every
        difference's ``<name>_value``/``_lower``/``_upper`` and each version's headline."""
        best = best_of(self.differences)
        d = None if best is None else best[1]
        row: dict[str, Any] = {
            "window": self.name,
            "n": self.pair.n,
            "disagreements": self.pair.n_dis,
            "agreement": self.pair.agreement,
            "estimator": None if best is None else best[0],
            "value": None if d is None else d.value,
            "lower": None if d is None else d.lower,
            "upper": None if d is None else d.upper,
            "alert": None if d is None else (d.lower > 0 or d.upper < 0),
        }
        for name, diff in self.differences.items():
            row.update(estimate_row(name, diff))
        for role, headline in (("champion", self.champion), ("challenger", self.challenger)):
            row.update(estimate_row(role, None if headline is None else headline[1]))
        return row


def _caveat(pair: PairCalibration) -> str | None:
    if pair.corrupted_sets > 0:
        return None
    return (
        "the pair was calibrated on clean rows only (no model to corrupt inputs for): under a covariate shift "
        "its interval may not hold; labels drawn on the disagreements settle it"
    )


def paired_entry(
    name: str,
    pair: PairSums,
    calibration: PairCalibration,
    champion: tuple[WindowStats, PairedModel] | None = None,
    challenger: tuple[WindowStats, PairedModel] | None = None,
) -> PairedEntry:
    """Window ``name`` of paired predictions estimated from the pair's sums (labeled ones included) with the
    pair's ``calibration``, and each version's headline from its statistics on the paired predictions."""

    def headline(side: tuple[WindowStats, PairedModel] | None) -> tuple[str, Estimate] | None:
        if side is None or side[0].n == 0:
            return None
        stats, model = side
        return headline_of(estimate_window(stats, model.calibration).estimates, model.headline)

    return PairedEntry(
        name, pair, differences(pair, calibration), headline(champion), headline(challenger), _caveat(calibration)
    )


def challenger_json(
    info: Mapping[str, Any], entries: Iterable[PairedEntry], *, decimals: int | None = DECIMALS
) -> dict[str, Any]:
    """The ``challenger`` section of ``/v1/estimates``: what the challenger is (``info``) and every window."""
    return {**info, "windows": {e.name: e.to_json(decimals=decimals) for e in entries}}


def paired_points(entries: Iterable[PairedEntry]) -> list[PairedPoint]:
    """Every window as the ``icos_challenger_*`` collectors export it (:meth:`PairedEntry.points`)."""
    return [e.points() for e in entries]
