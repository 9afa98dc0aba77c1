"""The additive statistic of a window of judged predictions and the per-sample inputs behind it.

:class:`WindowStats` is declared once: every field is an additive count, sum or vector of them, and
its sum, difference, in-place sum, copy and (de)serialisation are all derived from the field
declarations (the kind of a field is its annotation). :class:`SampleExtras` are the optional
per-sample inputs of the full ``shift_aware`` model (stored with every prediction as the columns of
:mod:`agent.estimation.statistics.extras_columns`).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import Field, asdict, dataclass, field, fields
from typing import Any, cast

import numpy as np

from agent.estimation.layout import N_CELLS, N_PCA_BINS, cell_counts, clip_index
from agent.estimation.statistics.calibrated import Numbering, StatisticsCalibration
from agent.estimation.statistics.reference import InputReference
from agent.estimation.statistics.segment_sums import per_segment
from invariants.oracle import FAMILIES, Verdict


@dataclass(frozen=True)
class SampleExtras:
    """Per-sample inputs of the full ``shift_aware`` model, derived once per batch (O(N))."""

    margin: np.ndarray  # top-1 minus top-2 probability
    rules: np.ndarray  # TDI rule (leaf) index
    agree: np.ndarray  # predicted label equals the leaf's class
    covered: np.ndarray  # the leaf's rule is selected
    pca_error: np.ndarray  # PCA reconstruction error of the input
    #: predicted class index (None when not kept, e.g. by stores of an older layout: the full model
    #: then falls back to the inputs model)
    label: np.ndarray | None = None

    def take(self, idx: np.ndarray) -> SampleExtras:
        return SampleExtras(
            self.margin[idx],
            self.rules[idx],
            self.agree[idx],
            self.covered[idx],
            self.pca_error[idx],
            None if self.label is None else self.label[idx],
        )

    @classmethod
    def concatenate(cls, parts: Sequence[SampleExtras]) -> SampleExtras:
        """The extras of several batches one after the other (``label`` only when every part has it)."""
        arrays = [np.concatenate([getattr(p, f) for p in parts]) for f in _EXTRA_ARRAYS]
        labels = None if any(p.label is None for p in parts) else np.concatenate([p.label for p in parts])  # type: ignore[misc]
        margin, rules, agree, covered, pca_error = arrays
        return cls(margin, rules, agree, covered, pca_error, labels)

    @classmethod
    def compute(
        cls,
        probabilities: np.ndarray,
        labels: np.ndarray,
        features: np.ndarray,
        tdi_rules: np.ndarray,
        reference: InputReference,
    ) -> SampleExtras:
        p = np.asarray(probabilities, dtype=np.float64)
        p = p.reshape(len(p), -1)
        if p.shape[1] >= 2:
            top2 = np.partition(p, p.shape[1] - 2, axis=1)[:, -2:]
            margin = np.abs(top2[:, 1] - top2[:, 0])
        else:
            margin = np.abs(2 * p[:, 0] - 1)
        rules = np.asarray(tdi_rules, dtype=np.int64).reshape(-1)
        lab = np.asarray(labels, dtype=np.int64).reshape(-1)
        if reference.n_rules:
            r = clip_index(rules, reference.n_rules)
            agree = reference._label[r] == lab  # type: ignore[attr-defined]
            covered = reference._selected[r]  # type: ignore[attr-defined]
        else:
            r = np.zeros(len(lab), dtype=np.int64)
            agree = covered = np.zeros(len(lab), dtype=bool)
        return cls(margin, r, agree, covered, reference.pca_error(features), lab)


_EXTRA_ARRAYS = ("margin", "rules", "agree", "covered", "pca_error")


def novel_inputs(calibration: StatisticsCalibration, extras: SampleExtras | None) -> np.ndarray | None:
    """Per prediction, whether its input is *novel*: its PCA reconstruction error above the clean calibration
    split's 99% quantile (the last of the reference's :data:`~agent.estimation.layout.PCA_QUANTILES`), as
    one input in a hundred is on data like the reference; None without a ``shift_aware`` reference. A count
    of them per segment is binomial, whatever the error's heavy tail."""
    shift = calibration.shift
    if shift is None or extras is None or not shift.reference.pca_edges:
        return None
    return np.asarray(extras.pca_error) > shift.reference.pca_edges[-1]


def sample_extras(
    calibration: StatisticsCalibration,
    probabilities: np.ndarray | None,
    labels: np.ndarray | None,
    features: np.ndarray | None,
    tdi_rules: np.ndarray | None,
) -> SampleExtras | None:
    """Per-sample inputs of the full ``shift_aware`` model, or None when the calibration has no shift
    part or any input is missing (the estimator then uses its reduced model)."""
    shift = calibration.shift
    if shift is None or probabilities is None or labels is None or features is None or tdi_rules is None:
        return None
    return SampleExtras.compute(probabilities, labels, features, tdi_rules, shift.reference)


def _required() -> dict[str, bool]:
    """Field metadata of a statistic every serialised window carries (``from_dict`` fails without it)."""
    return {"required": True}


def _agent_only() -> dict[str, bool]:
    """Field metadata of a statistic the agent keeps but does not export (:func:`stat_items`)."""
    return {"agent_only": True}


def _families() -> dict[str, int]:
    return dict.fromkeys(FAMILIES, 0)


def _pad(a: list[Any], size: int, zero: float) -> list[Any]:
    return a + [zero] * (size - len(a))


@dataclass
class WindowStats:
    """Additive sufficient statistics of a set of judged predictions.

    Every field is additive; its annotation is its kind (``int``/``float``: a count or sum,
    ``list[int]``/``list[float]``: a vector of them, zero-padded to the longer one when combined,
    ``dict[str, int]``: counts per oracle family). Adding a statistic is adding a field here (and
    filling it in :meth:`of_samples`); the arithmetic and the JSON follow.

    The ``*_ext`` group (``n_ext`` … ``leaves``) is only filled when the caller passes the optional
    per-sample inputs of :meth:`from_batch`; ``shift_aware`` then uses its full model.
    """

    n: int = field(default=0, metadata=_required())
    fails: int = field(default=0, metadata=_required())
    fails_by_family: dict[str, int] = field(default_factory=_families)
    conf_sum: float = field(default=0.0, metadata=_required())
    conf_sq_sum: float = field(default=0.0, metadata=_required())
    atc_above: int = field(default=0, metadata=_required())
    #: samples per (verdict × confidence bin) cell, see :func:`~agent.estimation.layout.cell_index`
    cells: list[int] = field(default_factory=lambda: [0] * N_CELLS)
    #: samples with the optional per-sample inputs (probabilities, labels, inputs, TDI leaves)
    n_ext: int = 0
    margin_sum: float = 0.0
    #: predictions equal to the class of their TDI leaf / whose leaf holds a selected rule
    tdi_agree: int = 0
    tdi_covered: int = 0
    pca_sum: float = 0.0
    pca_bins: list[int] = field(default_factory=lambda: [0] * N_PCA_BINS)
    #: samples per bin of TDI leaf rules (:func:`~agent.estimation.statistics.reference.leaf_bin_of_rule`; empty
    #: until a batch with leaves arrives)
    leaves: list[int] = field(default_factory=list)
    #: samples whose predicted label was passed; their count and top-class probability sum per class
    n_cls: int = 0
    class_counts: list[int] = field(default_factory=list)
    class_conf: list[float] = field(default_factory=list)
    #: CBPE's per-class sums (:mod:`agent.estimation.statistics.class_metrics`) over the samples whose probability
    #: vectors were passed: their count, predictions per predicted class, the predicted class's
    #: probability per predicted class (expected true positives) and every class's probability
    #: (expected support). Exported like the class counts (up to the class cap), so that the fleet
    #: evaluator gives the fleet's per-class figures.
    cbpe_n: int = 0
    cbpe_predicted: list[int] = field(default_factory=list)
    cbpe_true_positive: list[float] = field(default_factory=list)
    cbpe_support: list[float] = field(default_factory=list)
    #: The labeled side of PPI++ (:mod:`agent.estimation.estimators.prediction_powered`): the predictions of the
    #: labeling sample in the window whose true label arrived, their count, and the sums of their
    #: top-class probability ``f``, of ``f²``, of ``Y = 1{correct}`` and of ``Y·f``. Never filled by
    #: judging: a report adds them from the delayed labels (:meth:`of_labeled_sample`). Agent-only.
    lab_n: int = field(default=0, metadata=_agent_only())
    lab_f_sum: float = field(default=0.0, metadata=_agent_only())
    lab_f_sq_sum: float = field(default=0.0, metadata=_agent_only())
    lab_y_sum: float = field(default=0.0, metadata=_agent_only())
    lab_yf_sum: float = field(default=0.0, metadata=_agent_only())
    #: The calibrated per-prediction probability of being correct
    #: (:meth:`~agent.estimation.calibration.EstimatorCalibration.predicted_correct`): the predictions
    #: it was computed for and its sum, the label-free side of the weighted ``with_labels``
    #: (:mod:`agent.estimation.estimators.active`). Exported: a fleet adds them over replicas.
    pcorrect_n: int = 0
    pcorrect_sum: float = 0.0
    #: The labeled side of the weighted ``with_labels``: the labeled predictions of the labeling sample
    #: whose draw probability ``π`` was kept, and over them Σf, Σw, ΣwY, Σwf, Σv, Σvf, ΣvY, ΣvYf and
    #: Σvf² (``f`` the predictor above, ``w = 1/π``, ``v = (1 − π)/π²``; see
    #: :func:`agent.estimation.statistics.window.weighted_sums`). Filled by :meth:`of_labeled_sample`. Agent-only.
    lab_ipw_n: int = field(default=0, metadata=_agent_only())
    lab_ipw_f_sum: float = field(default=0.0, metadata=_agent_only())
    lab_ipw_w_sum: float = field(default=0.0, metadata=_agent_only())
    lab_ipw_wy_sum: float = field(default=0.0, metadata=_agent_only())
    lab_ipw_wf_sum: float = field(default=0.0, metadata=_agent_only())
    lab_ipw_v_sum: float = field(default=0.0, metadata=_agent_only())
    lab_ipw_vf_sum: float = field(default=0.0, metadata=_agent_only())
    lab_ipw_vy_sum: float = field(default=0.0, metadata=_agent_only())
    lab_ipw_vyf_sum: float = field(default=0.0, metadata=_agent_only())
    lab_ipw_vff_sum: float = field(default=0.0, metadata=_agent_only())
    #: Per segment, the labeled predictions of the labeling sample above, and over them Σw, Σw², Σwr, Σwr², Σw²r,
    #: Σw²r², Σwf (``f`` the top-class probability, ``r = Y − f``): ``with_labels`` post-stratified on a segment
    #: dimension (:mod:`agent.estimation.estimators.post_stratified`). Filled by :meth:`add_segment_labels`. Agent-only.
    seg_lab_n: list[int] = field(default_factory=list, metadata=_agent_only())
    seg_lab_w: list[float] = field(default_factory=list, metadata=_agent_only())
    seg_lab_w2: list[float] = field(default_factory=list, metadata=_agent_only())
    seg_lab_wr: list[float] = field(default_factory=list, metadata=_agent_only())
    seg_lab_wr2: list[float] = field(default_factory=list, metadata=_agent_only())
    seg_lab_w2r: list[float] = field(default_factory=list, metadata=_agent_only())
    seg_lab_w2r2: list[float] = field(default_factory=list, metadata=_agent_only())
    seg_lab_wf: list[float] = field(default_factory=list, metadata=_agent_only())
    #: Per segment of the bundle's segmentation (:mod:`agent.estimation.segments.segmentation`, numbered across its
    #: dimensions; empty without segments): predictions, their confidence sum and sum of squares, the
    #: oracle's failures and the novel inputs (:func:`novel_inputs`; zeros without a ``shift_aware``
    #: reference). Every prediction counts once in every dimension (:meth:`add_segment_sums`).
    seg_n: list[int] = field(default_factory=list)
    seg_conf: list[float] = field(default_factory=list)
    seg_conf_sq: list[float] = field(default_factory=list)
    seg_fails: list[int] = field(default_factory=list)
    seg_novel: list[int] = field(default_factory=list)
    #: Per segment, the predictions whose change columns were read, and per segment and change column
    #: (segment-major, ``S × C``) the sums of ``z`` and ``z²`` (:mod:`agent.estimation.segments.change`: what
    #: changed where, label-free; empty without change columns).
    change_n: list[int] = field(default_factory=list)
    change_sum: list[float] = field(default_factory=list)
    change_sq: list[float] = field(default_factory=list)
    #: per segment and sketched pair of change columns (``S × P``), the sum of ``zᵢ zⱼ``
    change_cross: list[float] = field(default_factory=list)

    @classmethod
    def from_batch(
        cls,
        verdicts: np.ndarray,
        confidences: np.ndarray,
        calibration: StatisticsCalibration,
        *,
        probabilities: np.ndarray | None = None,
        labels: np.ndarray | None = None,
        features: np.ndarray | None = None,
        tdi_rules: np.ndarray | None = None,
    ) -> WindowStats:
        """``verdicts`` are :class:`invariants.oracle.Verdict` codes (0 pass, 1 idi, 2 tdi, 3 adi).

        Optional, all four together (otherwise ``shift_aware`` falls back to its reduced model):
        ``probabilities`` [N, K] (the model's output), ``labels`` [N] (predicted class indices),
        ``features`` [N, D] (the flattened model inputs, as the oracle reads them) and ``tdi_rules``
        [N] (the TDI rule index of every sample's leaf, from
        :meth:`invariants.compiled.CompiledOracle.judge_with_rules`).
        """
        extras = sample_extras(calibration, probabilities, labels, features, tdi_rules)
        shift = calibration.shift
        out = cls.of_samples(
            verdicts, confidences, calibration.atc_threshold, extras, shift.reference if shift is not None else None
        )
        if probabilities is not None:
            out.add_class_sums(probabilities, labels)
        out.add_predictor_sums(calibration, confidences, verdicts)
        seg = calibration.segments
        if seg is not None:
            ids = seg.ids(features, labels, tdi_rules, out.n)
            out.add_segment_sums(ids, seg.size, confidences, verdicts, novel_inputs(calibration, extras))
            out.add_change_values(seg, ids, seg.change_values(features))
        return out

    def add_change_values(self, seg: Numbering, ids: np.ndarray, z: np.ndarray | None) -> None:
        """Fill ``change_*`` from every prediction's change columns ``z`` ``[N, C]``
        (:meth:`~agent.estimation.segments.segmentation.Segmentation.change_values`) and segment numbers ``ids``
        ``[D, N]``: nothing when ``z`` is None (no sketch, a view narrower than at fit) or not one row per
        prediction of these statistics."""
        if z is not None and len(z) == self.n and ids.shape[-1] == self.n:
            self.add_change_sums(ids, seg.size, z, seg.change_cross(z))

    def add_change_sums(self, ids: np.ndarray, size: int, z: np.ndarray, cross: np.ndarray) -> None:
        """Fill ``change_*`` from the segment numbers ``ids`` ``[D, N]``, the change columns ``z`` ``[N, C]`` and
        their pairs' products ``cross`` ``[N, P]``: one ``np.bincount`` over the ``D × N × (1 + 2C + P)``
        numbers."""
        n_rows, c = z.shape
        values = np.concatenate([np.ones((n_rows, 1)), z, z * z, cross], axis=1)
        sums = per_segment(ids, size, values).reshape(size, values.shape[1])
        self.change_n = np.rint(sums[:, 0]).astype(np.int64).tolist()
        self.change_sum = cast(list[float], sums[:, 1 : 1 + c].ravel().tolist())
        self.change_sq = cast(list[float], sums[:, 1 + c : 1 + 2 * c].ravel().tolist())
        self.change_cross = cast(list[float], sums[:, 1 + 2 * c :].ravel().tolist())

    def add_segment_sums(
        self,
        ids: np.ndarray,
        size: int,
        confidences: np.ndarray,
        verdicts: np.ndarray,
        novel: np.ndarray | None = None,
    ) -> None:
        """Fill the ``seg_*`` sums of ``size`` segments from every prediction's segment number in each
        dimension, ``ids`` ``[D, N]`` (:meth:`agent.estimation.segments.segmentation.Segmentation.ids`; ``size`` counts
        nowhere) and, per prediction, whether its input is novel (:func:`novel_inputs`): one ``np.bincount``
        per sum over the ``D × N`` numbers (``np.add.at`` costs several times more per element)."""
        c = np.asarray(confidences, dtype=np.float64).reshape(-1)
        if not len(c):
            self.seg_n, self.seg_fails, self.seg_novel = [0] * size, [0] * size, [0] * size
            self.seg_conf, self.seg_conf_sq = [0.0] * size, [0.0] * size
            return
        ids2 = ids.reshape(-1, len(c))
        d = ids2.shape[0]
        flat = ids2.ravel()  # dimension by dimension: each per-prediction value repeats once per dimension
        m = size + 1  # ``size``: nowhere
        failed = np.asarray(verdicts).reshape(-1) != 0
        has_novel = novel is not None and len(novel) == len(c)
        self.seg_n = np.bincount(flat, minlength=m)[:size].tolist()
        self.seg_fails = np.bincount(flat[np.tile(failed, d)], minlength=m)[:size].tolist()
        self.seg_novel = (
            np.bincount(flat[np.tile(np.asarray(novel, dtype=bool), d)], minlength=m)[:size].tolist()
            if has_novel
            else [0] * size
        )
        self.seg_conf = np.bincount(flat, weights=np.tile(c, d), minlength=m)[:size].tolist()
        self.seg_conf_sq = np.bincount(flat, weights=np.tile(c * c, d), minlength=m)[:size].tolist()

    def add_predictor_sums(
        self, calibration: StatisticsCalibration, confidences: np.ndarray, verdicts: np.ndarray
    ) -> np.ndarray:
        """Fill ``pcorrect_*`` from the calibration's per-prediction predictor of being correct; returns it."""
        f = calibration.predicted_correct(confidences, verdicts)
        self.pcorrect_n, self.pcorrect_sum = len(f), float(f.sum())
        return f

    @classmethod
    def of_labeled_sample(
        cls,
        confidence: np.ndarray,
        correct: np.ndarray,
        *,
        predicted_correct: np.ndarray | None = None,
        draw_probability: np.ndarray | None = None,
    ) -> WindowStats:
        """The ``lab_*`` sums of labeled predictions of the labeling sample: their top-class
        probabilities and whether each was right (everything else empty). With every prediction's
        ``draw_probability`` (in (0, 1]) and ``predicted_correct`` (the calibration's predictor), the
        weighted ``lab_ipw_*`` sums too; a sample where some probability is unknown (NaN: stored before
        draw probabilities were kept) has none, and ``with_labels`` uses the unweighted form."""
        f = np.asarray(confidence, dtype=np.float64).reshape(-1)
        y = np.asarray(correct, dtype=np.float64).reshape(-1)
        if len(f) != len(y):
            raise ValueError(f"{len(f)} confidences for {len(y)} labels")
        out = cls(
            lab_n=int(len(y)),
            lab_f_sum=float(f.sum()),
            lab_f_sq_sum=float((f * f).sum()),
            lab_y_sum=float(y.sum()),
            lab_yf_sum=float((y * f).sum()),
        )
        if draw_probability is None or predicted_correct is None or not len(y):
            return out
        p = np.asarray(draw_probability, dtype=np.float64).reshape(-1)
        if len(p) != len(y) or not bool(((p > 0) & (p <= 1)).all()):  # NaN fails both comparisons
            return out
        sums = weighted_sums(predicted_correct, y, p)
        for name, value in zip(_IPW_FIELDS, sums, strict=True):
            setattr(out, name, value)
        return out

    def add_segment_labels(
        self, ids: np.ndarray, size: int, confidence: np.ndarray, correct: np.ndarray, draw_probability: np.ndarray
    ) -> None:
        """Fill the ``seg_lab_*`` sums from the labels' segment numbers ``ids`` ``[D, m]``, their top-class
        probabilities, whether each was right and the probability each was drawn with (in (0, 1])."""
        f = np.asarray(confidence, dtype=np.float64).reshape(-1)
        r = np.asarray(correct, dtype=np.float64).reshape(-1) - f
        w = 1.0 / np.asarray(draw_probability, dtype=np.float64).reshape(-1)
        cols = np.stack([np.ones_like(w), w, w * w, w * r, w * r * r, w * w * r, w * w * r * r, w * f], axis=1)
        sums = per_segment(np.asarray(ids, dtype=np.int64).reshape(-1, len(f)), size, cols).reshape(size, 8)
        self.seg_lab_n = [int(round(v)) for v in sums[:, 0]]
        for name, column in zip(_SEG_LAB_FIELDS, sums[:, 1:].T.tolist(), strict=True):
            setattr(self, name, column)

    def add_class_sums(self, probabilities: np.ndarray, labels: np.ndarray | None = None) -> None:
        """Fill the ``cbpe_*`` sums from the samples' probability vectors ``[N, K]`` and predicted
        classes (``labels``; the most probable class when not given)."""
        p = np.asarray(probabilities, dtype=np.float64)
        n = len(p)
        p = p.reshape(n, -1)
        k = p.shape[1]
        if n == 0 or k == 0:
            return
        pred = np.argmax(p, axis=1) if labels is None else clip_index(np.asarray(labels, dtype=np.int64).reshape(-1), k)
        if len(pred) != n:
            return
        self.cbpe_n = n
        self.cbpe_predicted = np.bincount(pred, minlength=k)[:k].tolist()
        self.cbpe_true_positive = np.bincount(pred, weights=p[np.arange(n), pred], minlength=k)[:k].tolist()
        self.cbpe_support = p.sum(axis=0).tolist()

    @classmethod
    def of_samples(
        cls,
        verdicts: np.ndarray,
        confidences: np.ndarray,
        atc_threshold: float,
        extras: SampleExtras | None = None,
        reference: InputReference | None = None,
    ) -> WindowStats:
        """Statistics of samples whose :class:`SampleExtras` (if any) are already computed."""
        v = np.asarray(verdicts)
        c = np.asarray(confidences, dtype=np.float64)
        fam = np.bincount(v.astype(np.int64), minlength=len(Verdict))
        out = cls(
            n=int(len(v)),
            fails=int((v != Verdict.PASS).sum()),
            fails_by_family={verdict.family: int(fam[verdict]) for verdict in Verdict if verdict is not Verdict.PASS},
            conf_sum=float(c.sum()),
            conf_sq_sum=float((c * c).sum()),
            atc_above=int((c > atc_threshold).sum()),
            cells=cell_counts(v, c),
        )
        if extras is not None and reference is not None and len(extras.margin) == len(v):
            ref = reference
            out.n_ext = int(len(v))
            out.margin_sum = float(extras.margin.sum())
            out.tdi_agree = int(extras.agree.sum())
            out.tdi_covered = int(extras.covered.sum())
            out.pca_sum = float(extras.pca_error.sum())
            bins = np.searchsorted(np.asarray(ref.pca_edges), extras.pca_error, side="right")
            out.pca_bins = np.bincount(bins, minlength=N_PCA_BINS)[:N_PCA_BINS].tolist()
            if ref.n_rules:
                nb = ref.n_leaf_bins
                out.leaves = np.bincount(ref.leaf_bin[extras.rules], minlength=nb)[:nb].tolist()  # type: ignore[attr-defined]
            k = ref.n_classes
            if extras.label is not None and k and len(extras.label) == len(v):
                lab = clip_index(np.asarray(extras.label, dtype=np.int64), k)
                out.n_cls = int(len(v))
                out.class_counts = np.bincount(lab, minlength=k)[:k].tolist()
                out.class_conf = np.bincount(lab, weights=c, minlength=k)[:k].tolist()
        return out

    def _combine(self, other: WindowStats, sign: int) -> WindowStats:
        values: dict[str, Any] = {}
        for f in _FIELDS:
            a, b = getattr(self, f.name), getattr(other, f.name)
            kind = str(f.type)
            if kind in _VECTOR_ZERO:
                size = max(len(a), len(b))
                zero = _VECTOR_ZERO[kind]
                values[f.name] = [x + sign * y for x, y in zip(_pad(a, size, zero), _pad(b, size, zero), strict=True)]
            elif kind == _FAMILY_KIND:
                values[f.name] = {k: a.get(k, 0) + sign * b.get(k, 0) for k in FAMILIES}
            else:
                values[f.name] = a + sign * b
        return WindowStats(**values)

    def __add__(self, other: WindowStats) -> WindowStats:
        return self._combine(other, 1)

    def __sub__(self, other: WindowStats) -> WindowStats:
        return self._combine(other, -1)

    def add_in_place(self, other: WindowStats) -> None:
        """``self = self + other`` in place, the fields kind by kind (same sums; the window buckets' hot path)."""
        mine, add = self.__dict__, other.__dict__
        for name in _SCALAR_FIELDS:
            mine[name] = mine[name] + add[name]
        for name, zero in _VECTOR_FIELDS:
            more = add[name]
            vec = mine[name]
            vec.extend([zero] * (len(more) - len(vec)))  # nothing when it is as long already
            if (
                len(more) >= DENSE_MIN
                and len(vec) == len(more)
                and len(more) - more.count(zero) > len(more) // DENSE_ADD
            ):
                # mostly non-zero (a batch's change sums touch most segments): one C-speed pass over both
                mine[name] = list(map(operator.add, vec, more))
                continue
            for i in itertools.compress(range(len(more)), more):  # the non-zero entries (C-speed scan)
                vec[i] += more[i]
        for name in _FAMILY_FIELDS:
            mine[name] = {k: mine[name].get(k, 0) + add[name].get(k, 0) for k in FAMILIES}

    def copy(self) -> WindowStats:
        """A copy sharing no mutable vector or dict with ``self``."""
        return WindowStats(**{f.name: _COPY[str(f.type)](getattr(self, f.name)) for f in _FIELDS})

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WindowStats:
        """Inverse of :meth:`to_dict`; statistics missing from older states take their empty value
        (``KeyError`` when a required one is missing)."""
        values: dict[str, Any] = {}
        for f in _FIELDS:
            if f.metadata.get("required"):
                raw = d[f.name]
            else:
                raw = d.get(f.name)
                if not raw and str(f.type) in (*_VECTOR_ZERO, _FAMILY_KIND):
                    raw = _default(f) if str(f.type) in _VECTOR_ZERO else {}
                elif raw is None:
                    raw = _default(f)
            values[f.name] = _PARSE[str(f.type)](raw)
        return cls(**values)


_FAMILY_KIND = "dict[str, int]"
#: The zero a vector of each kind is padded with.
_VECTOR_ZERO: dict[str, float] = {"list[int]": 0, "list[float]": 0.0}
_PARSE: dict[str, Callable[[Any], Any]] = {
    "int": int,
    "float": float,
    "list[int]": lambda raw: [int(v) for v in raw],
    "list[float]": lambda raw: [float(v) for v in raw],
    _FAMILY_KIND: lambda raw: {k: int(v) for k, v in dict(raw).items()},
}
_COPY: dict[str, Callable[[Any], Any]] = {
    "int": lambda v: v,
    "float": lambda v: v,
    "list[int]": list,
    "list[float]": list,
    _FAMILY_KIND: dict,
}
_FIELDS: tuple[Field[Any], ...] = tuple(fields(WindowStats))
_unknown = {str(f.type) for f in _FIELDS} - set(_PARSE)
if _unknown:
    raise TypeError(f"WindowStats fields of a kind without arithmetic: {sorted(map(str, _unknown))}")
#: :meth:`WindowStats.add_in_place` adds a vector entry by entry where at most ``1/DENSE_ADD`` of the added one is
#: non-zero, else the whole vectors in one pass (a new list: about twice as fast per entry as the loop).
DENSE_ADD = 3
#: ... for vectors of at least this many entries (shorter ones cost more to count than the pass saves)
DENSE_MIN = 64
#: The fields by kind, for :meth:`WindowStats.add_in_place`: counts and sums; vectors with their zero; family counts.
_SCALAR_FIELDS = tuple(f.name for f in _FIELDS if str(f.type) in ("int", "float"))
_VECTOR_FIELDS = tuple((f.name, _VECTOR_ZERO[str(f.type)]) for f in _FIELDS if str(f.type) in _VECTOR_ZERO)
_FAMILY_FIELDS = tuple(f.name for f in _FIELDS if str(f.type) == _FAMILY_KIND)


#: the ``seg_lab_*`` sums of :meth:`WindowStats.add_segment_labels` after the count, in its order
_SEG_LAB_FIELDS = ("seg_lab_w", "seg_lab_w2", "seg_lab_wr", "seg_lab_wr2", "seg_lab_w2r", "seg_lab_w2r2", "seg_lab_wf")
#: the ``lab_ipw_*`` fields in the order of :func:`agent.estimation.statistics.window.weighted_sums`
_IPW_FIELDS = (
    "lab_ipw_n",
    "lab_ipw_f_sum",
    "lab_ipw_w_sum",
    "lab_ipw_wy_sum",
    "lab_ipw_wf_sum",
    "lab_ipw_v_sum",
    "lab_ipw_vf_sum",
    "lab_ipw_vy_sum",
    "lab_ipw_vyf_sum",
    "lab_ipw_vff_sum",
)


def _default(f: Field[Any]) -> Any:
    """The empty value of a field (its default or the result of its default factory)."""
    return f.default_factory() if callable(f.default_factory) else f.default


def weighted_sums(
    predicted_correct: np.ndarray, correct: np.ndarray, draw_probability: np.ndarray
) -> tuple[int, float, float, float, float, float, float, float, float, float]:
    """``(m, Σf, Σw, ΣwY, Σwf, Σv, Σvf, ΣvY, ΣvYf, Σvf²)`` of labeled predictions, ``w = 1/π``,
    ``v = (1 − π)/π²``."""
    f = np.asarray(predicted_correct, dtype=np.float64).reshape(-1)
    y = np.asarray(correct, dtype=np.float64).reshape(-1)
    p = np.asarray(draw_probability, dtype=np.float64).reshape(-1)
    if not (len(f) == len(y) == len(p)):
        raise ValueError(f"{len(f)} predictor values, {len(y)} labels and {len(p)} draw probabilities")
    if len(p) and not bool(((p > 0) & (p <= 1)).all()):
        raise ValueError("draw probabilities must lie in (0, 1]")
    w = 1.0 / p
    v = (1.0 - p) * w * w
    return (
        len(y),
        float(f.sum()),
        float(w.sum()),
        float((w * y).sum()),
        float((w * f).sum()),
        float(v.sum()),
        float((v * f).sum()),
        float((v * y).sum()),
        float((v * y * f).sum()),
        float((v * f * f).sum()),
    )
