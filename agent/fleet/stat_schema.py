"""What the replicas of one bundle export, and the checks a fleet window passes before it is believed.

A replica exports the flat items of its :class:`WindowStats` (:func:`stat_items`) as
``icos_window_stat_total{stat}``; which names it can export follows from the statistic's layout and
the bundle (its TDI leaf bins, its classes, whether it exports per-input statistics at all).
:class:`StatSchema` holds that set: a name outside it is either unknown (a statistic this evaluator
does not define, e.g. from newer replicas: counted and ignored) or an index of one of the bundle's
vectors beyond its length (a class the bundle does not have: the answer is refused).

Every number a replica exports comes from the same batches, so a window of the fleet (differences of
sums of them) keeps their relations exactly: counts are whole and non-negative, ``fails ≤ n``, the
verdict cells add up to ``n`` and to each family's failures, confidences are probabilities (so their
sum is at most ``n``), the class counts add up to the predictions with a class, and so on
(:meth:`StatSchema.window`). An answer that breaks one is not what replicas of this bundle can have
sent: the refresh fails, and the last good estimates stay.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.layout import N_CONF_BINS
from agent.estimation.segments.segmentation import Segmentation
from agent.estimation.segments.sketch import CLIP as CHANGE_CLIP
from agent.estimation.statistics.items import stat_items, stats_from_items
from agent.estimation.statistics.reference import InputReference
from agent.estimation.statistics.window import WindowStats
from agent.fleet.prometheus_api import RefreshError, printable
from invariants.oracle import Verdict

#: Largest counter value taken as exact (float64 holds every whole number up to 2⁵³).
MAX_EXACT = float(2**53)
#: Distance from a whole number within which a difference of counters counts as whole.
WHOLE = 1e-6
#: Relative rounding slack of float sums (totals summed over replicas in float64, then differenced).
ROUNDING = 1e-9
#: Relative slack of bounds on sums of probabilities: scores taken as probabilities may sum to
#: 1 ± 10⁻³ (:func:`agent.model.classifier.scores_as_probabilities`).
PROBABILITY_SLACK = 1e-3


class RefusedAnswer(RefreshError):
    """The API answered, but not what replicas of this bundle can export (a bad label, value or
    statistic, too many versions, or inconsistent sums)."""


def _exported_fields() -> dict[str, str]:
    """Exported :class:`WindowStats` field → its kind (its annotation)."""
    return {f.name: str(f.type) for f in fields(WindowStats) if not f.metadata.get("agent_only")}


@dataclass(frozen=True)
class StatSchema:
    """The ``stat`` names the replicas of one bundle export, and the checks of a window of them."""

    names: frozenset[str]
    #: names of counts (whole numbers), the others are sums of floats
    counts: frozenset[str]
    #: exported vector field → its length for this bundle (0: not exported)
    vectors: Mapping[str, int]
    #: whether the replicas export per-input statistics (``n_ext`` then counts the samples behind
    #: ``margin_sum``, ``tdi_agree`` …; bundles fitted before the leaf bins export it as 0)
    inputs: bool
    #: the segments of every dimension as ``(start, end)`` global numbers (a prediction counts once in each)
    segment_spans: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of_bundle(cls, calibration: EstimatorCalibration, n_classes: int | None = None) -> StatSchema:
        """The names replicas judging with ``calibration`` export (``n_classes``: the model's classes,
        for the per-class sums of bundles without an input reference)."""
        ref = calibration.shift.reference if calibration.shift is not None else None
        return cls.of_reference(ref, n_classes, calibration.segments)

    @classmethod
    def of_reference(
        cls, ref: InputReference | None, n_classes: int | None = None, segments: Segmentation | None = None
    ) -> StatSchema:
        """The names replicas export whose bundle's input reference is ``ref`` (None: no
        ``shift_aware`` part; see :func:`stat_items`), whose model has ``n_classes`` classes (None:
        the reference's) and whose bundle has ``segments``."""
        inputs = ref is None or ref.leaf_bins > 0
        full = WindowStats()
        size = segments.size if segments is not None else 0
        full.seg_n, full.seg_fails, full.seg_novel = [0] * size, [0] * size, [0] * size
        full.seg_conf, full.seg_conf_sq = [0.0] * size, [0.0] * size
        columns, pairs = segments.change_sizes if segments is not None else (0, 0)
        if columns:
            full.change_n = [0] * size
            full.change_sum = full.change_sq = [0.0] * (size * columns)
            full.change_cross = [0.0] * (size * pairs)
        k = n_classes if n_classes is not None else ref.n_classes if ref is not None else 0
        full.cbpe_predicted = [0] * k
        full.cbpe_true_positive = full.cbpe_support = [0.0] * k
        if ref is not None:
            full.leaves = [0] * ref.n_leaf_bins
            full.class_counts = [0] * ref.n_classes
            full.class_conf = [0.0] * ref.n_classes
        names = frozenset(k for k, _ in stat_items(full, inputs=inputs))
        kinds = _exported_fields()
        counts = frozenset(k for k in names if kinds[k.partition(":")[0]] in ("int", "list[int]", "dict[str, int]"))
        vectors = {
            name: sum(1 for k in names if k.partition(":")[0] == name)
            for name, kind in kinds.items()
            if kind.startswith("list[")
        }
        spans = tuple((a, b) for _, a, b in segments.spans()) if segments is not None else ()
        return cls(names, counts, vectors, inputs, spans)

    def known(self, stat: str) -> bool:
        """True for a statistic of this bundle, False for an unknown one (to be ignored); raises
        :class:`RefusedAnswer` (``bad_stat``) for an index of one of its vectors it does not have."""
        if stat in self.names:
            return True
        name, _, index = stat.partition(":")
        if name in self.vectors:
            size = self.vectors[name]
            what = f"index {printable(index, 20)}" if index.isdigit() else f"malformed index {printable(index, 20)!r}"
            raise RefusedAnswer(
                "bad_stat",
                f"statistic {name} with {what}: this bundle's replicas export {size} of them (0 … {size - 1})",
            )
        return False

    def check_value(self, stat: str, value: float) -> None:
        """A counter's value as Prometheus holds it: non-negative, at most 2⁵³, whole for a count."""
        if not 0 <= value <= MAX_EXACT:
            raise RefusedAnswer("bad_value", f"statistic {printable(stat, 40)} has the counter value {value!r}")
        if stat in self.counts and value != int(value):
            raise RefusedAnswer("bad_value", f"count {printable(stat, 40)} has the counter value {value!r}, not whole")

    def window(self, items: Mapping[str, float], scale: float, where: str) -> WindowStats:
        """The window statistic of summed increments ``items`` (names of this schema), checked:
        raises :class:`RefusedAnswer` (``inconsistent``) naming the first relation it breaks.
        ``scale`` is the largest counter total behind them (it sets the float rounding allowed)."""
        tol = ROUNDING * scale + 1e-9
        clean: dict[str, float] = {}
        for stat, value in items.items():
            if stat in self.counts:
                whole = round(value)
                if abs(value - whole) > WHOLE or whole < 0:
                    raise RefusedAnswer("inconsistent", f"{where}: count {stat} is {value!r} (not a whole number ≥ 0)")
                clean[stat] = whole
            else:
                if value < -tol:
                    raise RefusedAnswer("inconsistent", f"{where}: sum {stat} is negative ({value!r})")
                clean[stat] = max(value, 0.0)
        stats = stats_from_items(clean)
        _Checks(stats, tol, where).run(self)
        return stats


@dataclass
class _Checks:
    s: WindowStats
    tol: float
    where: str

    def require(self, ok: bool, what: str) -> None:
        if not ok:
            raise RefusedAnswer("inconsistent", f"{self.where}: {what}")

    def at_most(self, value: float, bound: float, what: str) -> None:
        """``value ≤ bound`` for a sum of probabilities (``bound`` a count)."""
        self.require(value <= bound * (1 + PROBABILITY_SLACK) + self.tol, f"{what} ({value:g} > {bound:g})")

    def adds_up(self, parts: float, total: float, what: str) -> None:
        self.require(parts == total, f"{what} add up to {parts:g}, not {total:g}")

    def run(self, schema: StatSchema) -> None:
        s = self.s
        n, fails = s.n, s.fails
        self.require(fails <= n, f"fails {fails} > n {n}")
        self.require(s.atc_above <= n, f"atc_above {s.atc_above} > n {n}")
        self.adds_up(sum(s.fails_by_family.values()), fails, "the failures by family (to fails)")
        self.adds_up(sum(s.cells), n, "the verdict cells (to n)")
        for verdict in Verdict:
            row = sum(s.cells[verdict * N_CONF_BINS : (verdict + 1) * N_CONF_BINS])
            want = n - fails if verdict is Verdict.PASS else s.fails_by_family.get(verdict.family, 0)
            self.adds_up(row, want, f"the cells of verdict {verdict.name.lower()}")
        self.at_most(s.conf_sum, n, "the confidence sum exceeds n")
        self.at_most(s.conf_sq_sum, s.conf_sum, "the sum of squared confidences exceeds the confidence sum")
        self.require(s.n_ext <= n, f"n_ext {s.n_ext} > n {n}")
        per_input = s.n_ext if schema.inputs else n  # bundles fitted before the leaf bins export n_ext as 0
        self.at_most(s.margin_sum, per_input, "the margin sum exceeds the samples behind it")
        self.require(s.tdi_agree <= per_input, f"tdi_agree {s.tdi_agree} > {per_input}")
        self.require(s.tdi_covered <= per_input, f"tdi_covered {s.tdi_covered} > {per_input}")
        if schema.vectors.get("pca_bins"):
            self.adds_up(sum(s.pca_bins), s.n_ext, "the PCA error bins (to n_ext)")
        if schema.vectors.get("leaves"):
            self.adds_up(sum(s.leaves), s.n_ext, "the leaf bins (to n_ext)")
        self.require(s.n_cls <= s.n_ext, f"n_cls {s.n_cls} > n_ext {s.n_ext}")
        self.adds_up(sum(s.class_counts), s.n_cls, "the class counts (to n_cls)")
        counts, confs = s.class_counts, s.class_conf
        for i in range(max(len(counts), len(confs))):
            count, conf = counts[i] if i < len(counts) else 0, confs[i] if i < len(confs) else 0.0
            self.at_most(conf, count, f"the confidence sum of class {i} exceeds its count")
        self.cbpe()
        self.segments(schema)

    def segments(self, schema: StatSchema) -> None:
        """The per-segment sums: a prediction counts once in each dimension (so a dimension's counts add up
        to at most ``n``), a segment's failures, novel inputs and confidences are at most its predictions."""
        s = self.s
        for a, b in schema.segment_spans:
            counted = sum(s.seg_n[a:b])
            self.require(counted <= s.n, f"the segments {a}..{b - 1} hold {counted} predictions, more than n {s.n}")
        for i, count in enumerate(s.seg_n):
            self.require(s.seg_fails[i] <= count if i < len(s.seg_fails) else True, f"segment {i}: fails > n")
            self.require(s.seg_novel[i] <= count if i < len(s.seg_novel) else True, f"segment {i}: novel > n")
            conf = s.seg_conf[i] if i < len(s.seg_conf) else 0.0
            self.at_most(conf, count, f"the confidence sum of segment {i} exceeds its predictions")
            square = s.seg_conf_sq[i] if i < len(s.seg_conf_sq) else 0.0
            self.at_most(square, conf, f"the squared confidences of segment {i} exceed its confidence sum")
            read = s.change_n[i] if i < len(s.change_n) else 0
            self.require(read <= count, f"segment {i}: change columns read for more predictions than it holds")
        if s.change_n and len(s.change_sq) >= len(s.change_n):
            c = len(s.change_sq) // max(len(s.change_n), 1)
            for i, read in enumerate(s.change_n):
                squares = s.change_sq[i * c : (i + 1) * c]
                top = read * (2 * CHANGE_CLIP) ** 2
                self.at_most(max(squares, default=0.0), top, f"segment {i}: change sums too large")

    def cbpe(self) -> None:
        """CBPE's per-class sums: predictions per predicted class add up to ``cbpe_n`` (at most ``n``),
        the predicted class's probability is at most one per prediction, every class's at most one."""
        s = self.s
        self.require(s.cbpe_n <= s.n, f"cbpe_n {s.cbpe_n} > n {s.n}")
        if s.cbpe_predicted:
            self.adds_up(sum(s.cbpe_predicted), s.cbpe_n, "the CBPE predictions per class (to cbpe_n)")
        for i, tp in enumerate(s.cbpe_true_positive):
            count = s.cbpe_predicted[i] if i < len(s.cbpe_predicted) else 0
            self.at_most(tp, count, f"the expected true positives of class {i} exceed its predictions")
        self.at_most(sum(s.cbpe_support), s.cbpe_n, "the expected supports exceed cbpe_n")
