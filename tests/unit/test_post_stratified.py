"""``with_labels`` post-stratified on a segment dimension, on a window where one segment is confidently wrong:
with draws of equal probability it is narrower than the whole window's inverse-probability-weighted estimate
(the broken segment's rectifiers no longer count as noise around the window's) and, whichever the draws
(equal, or following the broken segment at forty times the others' probability), the estimate ``with_labels``
reports covers the window's accuracy as often as a 95% interval should. Unknown segments or too few labels
leave ``with_labels`` to the whole-window estimate; strata of few labels are pooled."""

from __future__ import annotations

import numpy as np
import pytest

from agent.estimation.estimators.active import active_of_stats
from agent.estimation.estimators.post_stratified import MIN_LABELS, PostStratifiedEstimate, post_stratified
from agent.estimation.statistics.window import WindowStats

N = 20_000
#: dimension ``city``: segments 0-3 (segment 0 broken); dimension ``plan``: segments 4-6, unrelated
STRATA = (("city", 0, 4), ("plan", 4, 7))
SIZE = 7


def population(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every prediction's segment numbers ``[2, N]``, top-class probability and whether it is right."""
    city = rng.choice(4, N, p=[0.1, 0.3, 0.3, 0.3])
    plan = 4 + rng.integers(0, 3, N)
    f = np.clip(rng.beta(8, 2, N), 0.3, 1.0)
    right = rng.random(N) < f
    broken = city == 0
    f[broken] = np.clip(rng.beta(20, 1, int(broken.sum())), 0.3, 1.0)  # confident …
    right[broken] = rng.random(int(broken.sum())) < 0.3  # … and mostly wrong
    return np.stack([city, plan]), f, right


def window(
    ids: np.ndarray, f: np.ndarray, right: np.ndarray, pi: np.ndarray, drawn: np.ndarray, *, segments: bool = True
) -> WindowStats:
    """The window's sums with the labels of the ``drawn`` predictions, as the agent adds them."""
    stats = WindowStats(n=N, conf_sum=float(f.sum()), conf_sq_sum=float((f * f).sum()))
    stats.add_segment_sums(ids, SIZE, f, np.zeros(N, dtype=np.int8), None)
    stats.pcorrect_n, stats.pcorrect_sum = N, float(f.sum())
    lab = WindowStats.of_labeled_sample(f[drawn], right[drawn], predicted_correct=f[drawn], draw_probability=pi[drawn])
    if segments:
        lab.add_segment_labels(ids[:, drawn], SIZE, f[drawn], right[drawn], pi[drawn])
    return stats + lab


def whole_window(stats: WindowStats) -> tuple[float, float, float]:
    est = active_of_stats(stats)
    assert est is not None
    return est.value, est.lower, est.upper


@pytest.mark.parametrize("design", ["equal", "focus"])
def test_post_stratified_labels_are_honest_and_tighter_where_segments_differ(design: str) -> None:
    rng = np.random.default_rng(4)
    ids, f, right = population(rng)
    truth = float(right.mean())
    pi = np.full(N, 0.025) if design == "equal" else np.where(ids[0] == 0, 0.2, 0.005)
    reps = 300
    chosen, covered, widths, whole_widths = 0, 0, [], []
    for _ in range(reps):
        drawn = np.flatnonzero(rng.random(N) < pi)
        stats = window(ids, f, right, pi, drawn)
        est = post_stratified(stats, STRATA)
        assert isinstance(est, PostStratifiedEstimate) and est.strata >= 2
        _, lo, hi = whole_window(stats)
        widths.append(est.upper - est.lower)
        whole_widths.append(hi - lo)
        reported = (est.lower, est.upper) if est.upper - est.lower < hi - lo else (lo, hi)  # the registry's choice
        chosen += est.upper - est.lower < hi - lo
        covered += reported[0] <= truth <= reported[1]
    print(
        f"{design}: post-stratified mean width {np.mean(widths):.4f}, whole window {np.mean(whole_widths):.4f}; "
        f"post-stratified reported in {chosen}/{reps}, coverage of the reported {covered / reps:.3f}"
    )
    assert covered / reps >= 0.92
    if design == "equal":
        assert np.mean(widths) < 0.95 * np.mean(whole_widths)


def test_unknown_segments_or_too_few_labels_leave_the_whole_window() -> None:
    rng = np.random.default_rng(5)
    ids, f, right = population(rng)
    pi = np.where(ids[0] == 0, 0.2, 0.005)
    drawn = np.flatnonzero(rng.random(N) < pi)
    assert post_stratified(window(ids, f, right, pi, drawn, segments=False), STRATA) is None
    few = drawn[np.isin(drawn, np.flatnonzero(ids[0] != 0))][: MIN_LABELS - 1]  # one stratum cannot stand
    some = np.concatenate([drawn[ids[0, drawn] == 0], few])
    assert post_stratified(window(ids, f, right, pi, some), STRATA[:1]) is None


def test_strata_with_few_labels_are_pooled() -> None:
    rng = np.random.default_rng(6)
    ids, f, right = population(rng)
    pi = np.where(ids[0] == 0, 0.2, 0.005)
    drawn = np.flatnonzero(rng.random(N) < pi)
    stats = window(ids, f, right, pi, drawn)
    labels_in = np.bincount(ids[0, drawn], minlength=4)
    assert (labels_in >= MIN_LABELS).all()
    est = post_stratified(stats, STRATA)
    assert est is not None and est.strata == 4
    city = ids[0, drawn]
    keep = drawn[(city < 2) | ((city == 2) & (np.cumsum(city == 2) <= 3)) | ((city == 3) & (np.cumsum(city == 3) <= 3))]
    pooled = post_stratified(window(ids, f, right, pi, keep), STRATA[:1])
    assert pooled is not None and pooled.strata == 3  # cities 2 and 3, three labels each, pooled into one
    alone = keep[(ids[0, keep] != 2)]  # city 3's three labels cannot stand, alone or pooled
    assert post_stratified(window(ids, f, right, pi, alone), STRATA[:1]) is None
    assert pooled.to_dict()["post_stratified"] == "city"
