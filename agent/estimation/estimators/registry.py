"""Operational-accuracy estimators computed from unlabeled predictions, and their one registry.

Every estimator works on a small set of sufficient statistics
(:class:`~agent.estimation.statistics.window.WindowStats`) so that the
same code serves a batch (``icos-agent check``) and streaming windows (the sidecar), where stats of
arriving predictions are added and those of expiring ones subtracted.

Estimators:

``icos``
    1 − share of predictions the oracle fails (ICOS paper §5.3: the estimated accuracy is the share of
    ``pass`` verdicts). Wilson 95% interval on the pass share.
``icos_corrected``
    Rogan–Gladen correction of the fail share with the oracle's TPR and FPR measured on a calibration
    split held out of ADI training: with fail share ``r``, accuracy = (TPR − r) / (TPR − FPR), clipped
    to [0, 1]. 95% interval by the delta method around the clipped value, with Wilson-type variances of
    ``r``, TPR and FPR (never 0, whatever few errors the split holds).
``avg_conf``
    Mean top-class probability. Normal interval for the window's accuracy: the mean's sampling
    variance plus each outcome's Bernoulli variance given its confidence (:func:`_mean_interval`).
``cbpe``
    Confidence-based performance estimation (CBPE-style, as NannyML's): the mean top-class
    probability plus, per confidence bin, the calibration split's accuracy minus its mean confidence
    (:func:`~agent.estimation.estimators.trust.confidence_offsets`; none when the split holds too few errors).
    Interval of ``avg_conf`` shifted.
``atc``
    Average Thresholded Confidence (Garg et al., ICLR 2022): a threshold ``t`` on the top-class
    probability is chosen on the calibration split so that the share of samples above ``t`` equals
    the calibration accuracy; the estimate is the live share above ``t``. Wilson interval.
``doc``
    Difference of Confidences (Guillory et al., 2021): calibration accuracy shifted by the change of
    average confidence between calibration and live data. Interval of ``avg_conf`` shifted.
``shift_aware`` (the recommended, headline estimator)
    A regression from label-free statistics of the whole window (confidence histogram, oracle
    verdict shares, agreement with the TDI leaves and leaf distance, input PCA error, margin, the mix
    of predicted classes) to its accuracy, learnt at fit time on windows of corrupted copies of the
    calibration split (a generic family of corruptions and the metamorphic audit's transformations,
    see :mod:`agent.offline.calibration.corruptions`). The forests predict the *residual* accuracy minus mean
    confidence, so the estimate is the mean confidence corrected by what similar calibration windows
    showed (the AutoEval-style regression of Deng & Zheng, CVPR 2021, on a confidence baseline). Three
    gradient-boosted forests serve windows with all per-sample inputs (``full``), without the
    predicted labels (``inputs``) and without any per-sample input (``reduced``). The 95% interval
    combines the forest's out-of-family error (95% quantile per level of predicted accuracy, from
    holding corruption families out) with the sampling noise. Everything comes from additive counts
    (:class:`~agent.estimation.statistics.window.WindowStats`), so it works on streaming windows. Without a
    shift calibration of the current format in the bundle (old bundles) the estimator is absent.
    The learnt estimate is shrunk toward ``cbpe`` where the window looks like the clean calibration
    split or lies outside the calibration windows' support, with a wider interval there
    (:mod:`agent.estimation.estimators.trust`; :func:`window_trust` gives the trust signal).

``with_labels``
    The prediction-powered accuracy (PPI++, :mod:`agent.estimation.estimators.prediction_powered`) of the window
    from the labels of the labeling sample among its predictions (the ``lab_*`` sums a report adds to
    the window's statistics); absent without labels.

Every estimator calibrated on the labeled calibration split (its spec's ``split_calibrated``) has its
interval combined in quadrature with the split's own Wilson 95% interval of its accuracy
(:func:`split_floored`): with 3 wrong predictions in 237 the split cannot tell an accuracy of 0.987 from
one of 0.996, and no estimate calibrated on it may claim to.

Every estimator is one :func:`register_estimator` entry below, in the order reports list them: an
:class:`EstimatorSpec`, its formula and what it is — what it needs (labels, the oracle, the model's shift
calibration), the estimator that stands in where it cannot estimate a window, whether it may be a
headline and whether it is a default one. Everything that treats estimators differently reads the spec:
:func:`estimate_all` (labels), :func:`headline_of` (fallbacks), :func:`default_headline` and
:func:`headline_candidates` (the headline's choice at ``fit``), :mod:`agent.estimation.estimators.reliability` (the
oracle). :func:`estimate_window` gives a window's estimates and its trust signal from one computation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Set
from dataclasses import dataclass, replace

from agent.estimation.estimators.active import active_of_stats
from agent.estimation.estimators.calibrated import EstimatesCalibration
from agent.estimation.estimators.post_stratified import post_stratified
from agent.estimation.estimators.prediction_powered import WITH_LABELS, prediction_powered_of_sums
from agent.estimation.estimators.shift_aware import shift_aware
from agent.estimation.estimators.trust import Trust, confidence_base
from agent.estimation.intervals import Z95, Estimate, clip01, wilson
from agent.estimation.layout import N_VERDICTS
from agent.estimation.statistics.window import WindowStats

#: An estimator: the estimate of a non-empty window, or None when it cannot estimate it (e.g. no
#: ``shift_aware`` calibration in the bundle).
Estimator = Callable[[WindowStats, EstimatesCalibration], Estimate | None]


@dataclass(frozen=True)
class EstimatorSpec:
    """What an estimator is: its formula and what it rests on (one :func:`register_estimator` entry)."""

    name: str
    formula: Estimator
    #: it estimates only windows holding labeled predictions (the labeling sample's sums)
    needs_labels: bool = False
    #: it rests on the oracle's verdicts: not to be read (nor chosen as a headline) where the oracle
    #: separates right from wrong predictions poorly
    needs_oracle: bool = False
    #: its calibration runs the model on corrupted copies of the calibration inputs: only bundles fitted
    #: with the model (``fit --model``) have it
    needs_model: bool = False
    #: the estimator reported in its place where it cannot estimate a window (None: it always can)
    fallback: str | None = None
    #: ``fit`` may choose it as a bundle's headline
    headline: bool = True
    #: where no evidence chooses another, the headline is the default one of lowest rank the bundle can
    #: compute (None: never a default)
    default_rank: int | None = None
    #: it is calibrated on the labeled calibration split (offsets, thresholds, rates, regressions): its
    #: interval is never narrower than what the split can tell of the accuracy (:func:`split_floored`)
    split_calibrated: bool = False
    #: it reads only the sums a window keeps per segment (count, fails, confidence sums), so it estimates a
    #: segment with the segment's own reference as its calibration (:mod:`agent.estimation.segments.table`)
    on_segments: bool = False


#: Every estimator's spec by name, in registration order (the one place an estimator is added).
REGISTRY: dict[str, EstimatorSpec] = {}


class _NeedingLabels(Set[str]):
    """The registered estimators that need true labels (they answer nothing for a window without): a view
    of the specs' ``needs_labels``."""

    def __contains__(self, name: object) -> bool:
        spec = REGISTRY.get(name) if isinstance(name, str) else None
        return spec is not None and spec.needs_labels

    def __iter__(self) -> Iterator[str]:
        return (n for n, s in REGISTRY.items() if s.needs_labels)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    @classmethod
    def _from_iterable(cls, it: Iterable[str]) -> set[str]:  # type: ignore[override]
        return set(it)


NEEDS_LABELS: Set[str] = _NeedingLabels()


def register_estimator(
    name: str,
    *,
    needs_labels: bool = False,
    needs_oracle: bool = False,
    needs_model: bool = False,
    fallback: str | None = None,
    headline: bool | None = None,
    default_rank: int | None = None,
    split_calibrated: bool = False,
    on_segments: bool = False,
) -> Callable[[Estimator], Estimator]:
    """Decorator adding an estimator's :class:`EstimatorSpec` to :data:`REGISTRY` under ``name`` (a name is
    taken once); the keywords are the spec's fields. ``headline``: by default every estimator that needs
    no labels may be one."""

    def add(fn: Estimator) -> Estimator:
        if name in REGISTRY:
            raise ValueError(f"estimator {name!r} is already registered")
        may_lead = not needs_labels if headline is None else headline
        REGISTRY[name] = EstimatorSpec(
            name,
            fn,
            needs_labels,
            needs_oracle,
            needs_model,
            fallback,
            may_lead,
            default_rank,
            split_calibrated,
            on_segments,
        )
        return fn

    return add


def estimator_specs() -> tuple[EstimatorSpec, ...]:
    """Every registered estimator's spec, in registration order."""
    return tuple(REGISTRY.values())


def estimator_names(*, label_free: bool = False) -> tuple[str, ...]:
    """The registered estimators' names, in registration order (``label_free``: those that need no
    labels)."""
    return tuple(n for n, s in REGISTRY.items() if not (label_free and s.needs_labels))


def headline_candidates(*, with_model: bool = True) -> tuple[str, ...]:
    """The estimators ``fit`` may choose as a headline, in registration order (``with_model=False``: those
    a bundle fitted without the model can compute)."""
    return tuple(n for n, s in REGISTRY.items() if s.headline and (with_model or not s.needs_model))


def default_headline(candidates: Collection[str]) -> str:
    """The headline where no evidence chooses another: the default estimator of lowest rank among
    ``candidates`` (``shift_aware`` where the bundle has its calibration, else ``cbpe``), the last
    default when none is among them."""
    ranked = sorted((s for s in REGISTRY.values() if s.default_rank is not None), key=lambda s: s.default_rank or 0)
    return next((s.name for s in ranked if s.name in candidates), ranked[-1].name)


@dataclass(frozen=True)
class ShiftAwareEstimate(Estimate):
    """A ``shift_aware`` estimate and, from the same computation, the window's trust signal."""

    trust: Trust | None = None

    def to_dict(self) -> dict[str, float | int | str]:
        return Estimate.to_dict(self)


def _mean_interval(stats: WindowStats) -> tuple[float, float, float]:
    """The mean top-class probability ``c̄`` and its 95% interval as an estimate of the *window's*
    accuracy: the variance is the sampling variance of the mean, var(c)/n, plus the Bernoulli noise of
    each outcome given its confidence, Σc(1 − c)/n² (how far a calibrated model's window accuracy
    lies from its mean confidence). Without the second term a window of equal confidences would get
    a zero-width interval, and a calibrated model's window accuracy would fall outside the interval
    in about half of the windows. Both come from the additive sums Σc and Σc²."""
    n = stats.n
    mean = stats.conf_sum / n
    var = max(stats.conf_sq_sum / n - mean * mean, 0.0) * n / max(n - 1, 1)
    outcome = max(stats.conf_sum - stats.conf_sq_sum, 0.0) / (n * n)
    half = Z95 * math.sqrt(var / n + outcome)
    return mean, mean - half, mean + half


def _wilson_variance(successes: float, n: float) -> float:
    """The variance of a proportion with Wilson's pseudo-counts, ``p̃(1 − p̃)/(n + z²)`` with
    ``p̃ = (x + z²/2)/(n + z²)``: never 0 at a proportion of 0 or 1 (the Wald variance of 3 detected
    errors of 3 is 0, and an interval built on it has no width)."""
    z2 = Z95 * Z95
    p = (successes + z2 / 2) / (n + z2)
    return p * (1 - p) / (n + z2)


def rogan_gladen(fail_share: float, n: int, cal: EstimatesCalibration) -> Estimate:
    """Accuracy = (TPR − r) / (TPR − FPR), clipped to [0, 1], with a delta-method interval around the
    clipped value and Wilson-type variances of ``r``, TPR and FPR (:func:`_wilson_variance`): an estimate
    past 1 (a window with fewer fails than the calibration's right predictions raise) keeps an interval
    below 1 instead of ``[1, 1]``.

    When TPR ≤ FPR the oracle carries no information and the interval is [0, 1].
    """
    denom = cal.tpr - cal.fpr
    if denom <= 1e-9 or n == 0:
        return Estimate(clip01(1.0 - fail_share), 0.0, 1.0, n)
    acc = (cal.tpr - fail_share) / denom
    e = min(max(1.0 - acc, 0.0), 1.0)
    var_r = _wilson_variance(fail_share * n, n)
    var_tpr = _wilson_variance(cal.tpr * cal.n_wrong, cal.n_wrong) if cal.n_wrong else 0.25
    var_fpr = _wilson_variance(cal.fpr * cal.n_right, cal.n_right) if cal.n_right else 0.25
    var = (var_r + e * e * var_tpr + (1 - e) ** 2 * var_fpr) / (denom * denom)
    half = Z95 * math.sqrt(var)
    value = clip01(acc)
    return Estimate(value, clip01(value - half), clip01(value + half), n)


def split_half_widths(n_wrong: int, n: int) -> tuple[float, float]:
    """How far below and above the calibration split's accuracy ``1 − n_wrong/n`` its Wilson 95% interval
    reaches: what the split itself can tell of the accuracy (a split of 3 wrong predictions in 237 cannot
    tell 0.987 from 0.996)."""
    if n <= 0:
        return 1.0, 1.0
    lo, hi = wilson(n - n_wrong, n)
    acc = 1.0 - n_wrong / n
    return max(acc - lo, 0.0), max(hi - acc, 0.0)


def split_floored(e: Estimate, calibration: EstimatesCalibration) -> Estimate:
    """``e`` with each half-width combined in quadrature with the calibration split's own
    (:func:`split_half_widths`): an estimator calibrated on a split inherits the uncertainty of what the
    split can tell, so a handful of errors never gives a zero-width interval."""
    below, above = split_half_widths(calibration.n_wrong, calibration.n)
    v = e.value
    lower = v - math.hypot(max(v - e.lower, 0.0), below)
    upper = v + math.hypot(max(e.upper - v, 0.0), above)
    return replace(e, lower=clip01(lower), upper=clip01(upper))


@register_estimator("icos", needs_oracle=True, on_segments=True)
def _icos(stats: WindowStats, calibration: EstimatesCalibration) -> Estimate:
    n = stats.n
    passes = n - stats.fails
    lo, hi = wilson(passes, n)
    return Estimate(passes / n, lo, hi, n)


@register_estimator("icos_corrected", needs_oracle=True, split_calibrated=True, on_segments=True)
def _icos_corrected(stats: WindowStats, calibration: EstimatesCalibration) -> Estimate:
    return rogan_gladen(stats.fails / stats.n, stats.n, calibration)


@register_estimator("avg_conf", on_segments=True)
def _avg_conf(stats: WindowStats, calibration: EstimatesCalibration) -> Estimate:
    mean, mlo, mhi = _mean_interval(stats)
    return Estimate(clip01(mean), clip01(mlo), clip01(mhi), stats.n)


def _bin_shares(stats: WindowStats) -> list[float]:
    """The window's share of samples per confidence bin (all verdicts together)."""
    k = len(stats.cells) // N_VERDICTS
    return [sum(stats.cells[v * k + b] for v in range(N_VERDICTS)) / stats.n for b in range(k)]


@register_estimator("cbpe", default_rank=1, split_calibrated=True)
def _cbpe(stats: WindowStats, calibration: EstimatesCalibration) -> Estimate:
    mean, mlo, mhi = _mean_interval(stats)
    shift = confidence_base(_bin_shares(stats), mean, calibration.conf_offsets) - mean
    return Estimate(clip01(mean + shift), clip01(mlo + shift), clip01(mhi + shift), stats.n)


@register_estimator("atc", split_calibrated=True)
def _atc(stats: WindowStats, calibration: EstimatesCalibration) -> Estimate:
    n = stats.n
    lo, hi = wilson(stats.atc_above, n)
    return Estimate(stats.atc_above / n, lo, hi, n)


@register_estimator("doc", split_calibrated=True, on_segments=True)
def _doc(stats: WindowStats, calibration: EstimatesCalibration) -> Estimate:
    mean, mlo, mhi = _mean_interval(stats)
    shift = calibration.accuracy - calibration.avg_conf
    return Estimate(clip01(mean + shift), clip01(mlo + shift), clip01(mhi + shift), stats.n)


@register_estimator("shift_aware", needs_model=True, fallback="doc", default_rank=0, split_calibrated=True)
def _shift_aware(stats: WindowStats, calibration: EstimatesCalibration) -> Estimate | None:
    if calibration.shift is None or sum(stats.cells) != stats.n:
        return None
    parts = shift_aware(stats, calibration.shift, calibration.conf_offsets)
    e = parts.estimate
    return ShiftAwareEstimate(e.value, e.lower, e.upper, e.n, parts.trust)


@register_estimator(WITH_LABELS, needs_labels=True)
def _with_labels(stats: WindowStats, calibration: EstimatesCalibration) -> Estimate | None:
    whole = _whole_window_with_labels(stats, calibration)
    if stats.lab_ipw_n == stats.lab_n and stats.seg_lab_n:
        stratified = post_stratified(stats, calibration.segment_strata)
        if stratified is not None and (
            whole is None or stratified.upper - stratified.lower < whole.upper - whole.lower
        ):
            return stratified
    return whole


def _width(e: Estimate) -> float:
    return e.upper - e.lower


def _whole_window_with_labels(stats: WindowStats, calibration: EstimatesCalibration) -> Estimate | None:
    """``with_labels`` of the whole window: inverse-probability-weighted where every draw's probability was
    kept, else plain PPI++ over a uniform sample."""
    if stats.lab_ipw_n == stats.lab_n and stats.pcorrect_n == stats.n:
        est = active_of_stats(stats)
        return None if est is None else replace(est, predictor=calibration.predictor, weighted=True)
    return prediction_powered_of_sums(
        stats.n,
        stats.conf_sum,
        stats.conf_sq_sum,
        stats.lab_n,
        stats.lab_f_sum,
        stats.lab_f_sq_sum,
        stats.lab_y_sum,
        stats.lab_yf_sum,
    )


def window_trust(stats: WindowStats, calibration: EstimatesCalibration) -> Trust | None:
    """The trust signal of a window (:class:`~agent.estimation.estimators.trust.Trust`), or None when the bundle
    has no trust model or the window is empty. Where the estimates are computed too, take it from
    :func:`estimate_window` instead (one ``shift_aware`` computation)."""
    if stats.n <= 0:
        return None
    return trust_of(_shift_aware(stats, calibration))


def trust_of(shift_aware_estimate: Estimate | None) -> Trust | None:
    """The trust signal carried by a ``shift_aware`` estimate (None for another or none)."""
    return shift_aware_estimate.trust if isinstance(shift_aware_estimate, ShiftAwareEstimate) else None


#: The built-in label-free estimators (:func:`estimator_names` also lists ``with_labels`` and any
#: registered later).
ESTIMATORS: tuple[str, ...] = estimator_names(label_free=True)
#: The recommended estimator, the default headline of lowest rank (shown first in reports and dashboards).
RECOMMENDED_ESTIMATOR = default_headline(estimator_names())
_STAND_IN = REGISTRY[RECOMMENDED_ESTIMATOR].fallback
assert _STAND_IN is not None
#: The estimator standing in for the recommended one where it cannot estimate (:func:`headline_of`), and
#: the headline of table bundles whose manifest names none. Table bundles fitted now name the headline
#: chosen from evidence (:mod:`agent.offline.calibration.estimators.headline_choice`): ``shift_aware`` learns from
#: corrupted copies of the calibration inputs passed through the model, which a table does not have.
TABLE_HEADLINE: str = _STAND_IN


def headline_estimator(bundle_headline: str | None, *, with_model: bool = True) -> str:
    """The estimator reports show first: the one a bundle names, else :data:`RECOMMENDED_ESTIMATOR`
    (``with_model=False``, a bundle fitted from a table: :data:`TABLE_HEADLINE`)."""
    return bundle_headline or (RECOMMENDED_ESTIMATOR if with_model else TABLE_HEADLINE)


def headline_of(estimates: Mapping[str, Estimate], headline: str) -> tuple[str, Estimate] | None:
    """The window's headline estimate and the estimator that gave it: ``headline`` (the bundle's), or,
    where it cannot estimate the window, the estimator its spec names as its ``fallback`` (``doc`` for
    ``shift_aware`` of a bundle without a shift calibration: the best estimator that needs only the
    predictions), and so on; a name no estimator is registered under falls back to
    :data:`TABLE_HEADLINE`. Never a weaker one: ``None`` when none of them has an estimate (an empty
    window). What the agent and the fleet evaluator export as ``icos_headline_accuracy_ratio`` /
    ``icos_fleet_headline_accuracy_ratio``."""
    tried: set[str] = set()
    name: str | None = headline
    while name is not None and name not in tried:
        est = estimates.get(name)
        if est is not None:
            return name, est
        tried.add(name)
        spec = REGISTRY.get(name)
        name = spec.fallback if spec is not None else TABLE_HEADLINE
    return None


def estimate_all(stats: WindowStats, calibration: EstimatesCalibration) -> dict[str, Estimate]:
    """All registered estimators on one set of statistics. An empty window gives no estimates."""
    if stats.n <= 0:
        return {}
    out: dict[str, Estimate] = {}
    for name, spec in REGISTRY.items():
        if spec.needs_labels and stats.lab_n <= 0:
            continue
        est = spec.formula(stats, calibration)
        if est is not None:
            out[name] = split_floored(est, calibration) if spec.split_calibrated else est
    return out


@dataclass(frozen=True)
class WindowEstimates:
    """Everything estimated about one window: every estimator's estimate and the trust signal
    (from the same ``shift_aware`` computation; None without a trust model)."""

    stats: WindowStats
    estimates: dict[str, Estimate]
    trust: Trust | None


def estimate_window(stats: WindowStats, calibration: EstimatesCalibration) -> WindowEstimates:
    """A window's estimates and trust signal, each estimator computed once."""
    estimates = estimate_all(stats, calibration)
    trust = next((t for e in estimates.values() if (t := trust_of(e)) is not None), None)
    return WindowEstimates(stats, estimates, trust)
