"""Segments: defined at fit from a table view, the predicted class, the TDI rules and regions of a view; every
prediction counted once per dimension with a few numpy operations; additive across windows; stored in the
bundle's calibration and read back; and the window's segment table that ranks where the drop is."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.segments.segmentation import (
    MAX_LABEL,
    MAX_NAME,
    SEGMENTS_FORMAT,
    Segmentation,
    label_of,
    segmentation_or_none,
    truth_counts,
)
from agent.estimation.segments.table import segment_calibration, segment_estimates, segment_table
from agent.estimation.statistics.items import SEGMENT_STATS, stat_items, stats_from_items
from agent.estimation.statistics.segment_sums import per_segment
from agent.estimation.statistics.window import WindowStats
from agent.fleet.stat_schema import RefusedAnswer, StatSchema
from agent.judging.windows import CountWindow, TimeWindow
from agent.offline.calibration.segments.data import ColumnGroup, SegmentData, ViewShape
from agent.offline.calibration.segments.fitting import define_segments
from agent.offline.calibration.segments.kinds.region import kmeans
from invariants.fit_params import CalibrationPlan
from invariants.tdi import TrainingInvariants

CLASSES = ("no", "yes", "maybe")
COLORS = ("red", "green", "blue")


def table(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A view of a table: a one-hot ``color`` (3 values + unseen), a numeric ``size``, an integer ``code`` of
    three values; the class follows the colour and the size."""
    color = rng.integers(0, 3, n)
    size = rng.normal(0, 1, n)
    code = rng.integers(0, 3, n).astype(np.float64)
    x = np.zeros((n, 6), dtype=np.float32)
    x[np.arange(n), color] = 1.0
    x[:, 4] = size
    x[:, 5] = code
    y = np.where(size > 0.8, 2, color % 2).astype(np.int64)
    return x, y


SHAPE = ViewShape(
    (
        ColumnGroup("color", (0, 1, 2, 3), (*COLORS, "(other)")),
        ColumnGroup("size", (4,)),
        ColumnGroup("code", (5,)),
    ),
    regions=False,
)


def fitted(
    rng: np.random.Generator,
    shape: ViewShape = SHAPE,
    max_segments: int = 64,
    accuracy: float = 0.9,
    confidence: tuple[float, ...] | None = None,
) -> tuple[EstimatorCalibration, SegmentData]:
    """Segments of the table above fitted as ``fit`` does, with a TDI tree and a model right ``accuracy`` of
    the time (its confidence calibrated: ``accuracy`` on average; ``confidence``: per value of ``code`` instead,
    give or take a little noise, whatever the accuracy)."""
    train_x, train_y = table(2000, rng)
    val_x, val_y = table(1500, rng)
    tdi = TrainingInvariants.fit(
        train_x, train_y, feature_names=["color=red", "color=green", "color=blue", "color=(other)", "size", "code"]
    )
    right = rng.uniform(size=len(val_y)) < accuracy
    predicted = np.where(right, val_y, (val_y + 1) % 3)
    top = _confidences(val_x, accuracy, confidence, rng)
    probs = np.repeat(((1 - top) / 2)[:, None], 3, axis=1)
    probs[np.arange(len(val_y)), predicted] = top
    cal_index = np.arange(0, len(val_y), 3)
    verdicts = np.where(rng.uniform(size=len(cal_index)) < 0.1, 2, 0).astype(np.int8)
    data = SegmentData(train_x, train_y, val_x, val_y, probs, predicted, cal_index, verdicts, tdi, CLASSES)
    classic = EstimatorCalibration.fit(probs.max(axis=1)[cal_index], right[cal_index], verdicts != 0)
    seg = define_segments(data, shape, classic, max_segments=max_segments, seed=0)
    return classic.with_segments(seg), data


def _confidences(
    x: np.ndarray, accuracy: float, per_code: tuple[float, ...] | None, rng: np.random.Generator
) -> np.ndarray:
    if per_code is None:
        return np.full(len(x), accuracy)
    return np.clip(np.asarray(per_code)[x[:, 5].astype(int)] + rng.normal(0, 0.03, len(x)), 0.34, 1.0)


def test_fit_defines_readable_bounded_segments_of_every_kind() -> None:
    cal, _ = fitted(np.random.default_rng(0))
    seg = cal.segments
    assert seg is not None
    kinds = [d.kind for d in seg.dimensions]
    assert kinds[0] == "predicted" and kinds[-1] == "rule" and kinds.count("column") == 3
    names = seg.names()
    assert names[:3] == ["predicted=no", "predicted=yes", "predicted=maybe"]
    assert {"color=red", "color=green", "color=blue", "color unseen at fit"} <= set(names)
    assert {"code=0.0", "code=1.0", "code=2.0", "code=other values"} <= set(names)
    assert any(n.startswith("size < ") for n in names) and any(n.startswith("size >= ") for n in names)
    assert any(n.startswith("TDI rule ") and "=>" in n for n in names)
    assert names[-1] == "no selected TDI rule"
    # the reference holds every validation prediction once in each dimension
    for _, a, b in seg.spans():
        assert sum(seg.reference.n[a:b]) == 1500
    bounded, _ = fitted(np.random.default_rng(0), max_segments=12)
    assert bounded.segments is not None and bounded.segments.size <= 12


def test_names_made_of_hostile_data_are_bounded_distinct_and_single_line() -> None:
    """A categorical column of 5,000 values (some 10,000 characters long, with quotes, backslashes, newlines
    and markup) and long class names: at most ``segment_values`` segments for the column and ``max_segments``
    in all, names of at most :data:`MAX_NAME` characters on one line, all distinct, and distinct labels of at
    most :data:`MAX_LABEL` characters (names alike up to the cut keep apart)."""
    rng = np.random.default_rng(3)
    long = "v" * 10_000
    hostile = [long + "a", long + "b", 'say "hi"\n', "</script>{}", "new\nline"]
    values = (*hostile, *(f"value {i}" for i in range(5000 - len(hostile))), "(other)")
    n = 3000
    pick = np.concatenate([np.repeat(np.arange(5), 300), rng.integers(0, len(values) - 1, n - 1500)])
    x = np.zeros((n, len(values)), dtype=np.float32)
    x[np.arange(n), pick] = 1.0
    y = (pick % 3).astype(np.int64)
    classes = (long + "1", long + "2", "\n\n\\")
    probs = np.full((n, 3), 0.1)
    probs[np.arange(n), y] = 0.8
    shape = ViewShape((ColumnGroup(long, tuple(range(len(values))), values),), regions=False)
    data = SegmentData(x, y, x, y, probs, y, np.arange(0, n, 3), np.zeros(1000, np.int8), None, classes)
    classic = EstimatorCalibration.fit(probs.max(axis=1)[::3], np.ones(1000, bool), np.zeros(1000, bool))
    seg = define_segments(data, shape, classic, max_segments=20, seed=0)
    assert seg is not None and seg.size <= 20
    column = next(d for d in seg.dimensions if d.kind == "column")
    assert len(column.segments) <= CalibrationPlan().segment_values
    names, labels = seg.names(), seg.labels()
    assert all(len(t) <= MAX_NAME and "\n" not in t for t in [*names, *(d.name for d in seg.dimensions)])
    assert len(set(names)) == len(names)
    assert all(len(t) <= MAX_LABEL and "\n" not in t for t in labels) and len(set(labels)) == len(labels)
    assert label_of(long + "a") != label_of(long + "b") and len(label_of(long + "a")) == MAX_LABEL
    again = segmentation_or_none(json.loads(json.dumps(seg.to_dict())))
    assert again is not None and again.names() == names


def test_ids_put_every_prediction_in_one_segment_per_dimension_and_unknowns_in_the_last() -> None:
    cal, data = fitted(np.random.default_rng(1))
    seg = cal.segments
    assert seg is not None
    x = np.zeros((4, 6), dtype=np.float32)
    x[0, 0] = 1  # red
    x[1, 3] = 1  # a colour never seen at fit
    x[2, 2] = 1
    x[3, 1] = 1
    x[:, 4] = [-5.0, 0.0, 0.5, 9.0]
    x[:, 5] = [0, 1, 2, 7]  # 7: no code seen at fit
    predicted = np.array([0, 2, 1, 9])  # 9: no such class
    rules = data.tdi.rule_index(x) if data.tdi is not None else None
    ids = seg.ids(x, predicted, rules, 4)
    assert ids.shape == (len(seg.dimensions), 4)
    names = seg.names()
    by_dim = {d.name: [names[i] for i in row] for d, row in zip(seg.dimensions, ids, strict=True)}
    assert by_dim["color"] == ["color=red", "color unseen at fit", "color=blue", "color=green"]
    assert by_dim["code"] == ["code=0.0", "code=1.0", "code=2.0", "code=other values"]
    assert by_dim["size"][0].startswith("size < ") and by_dim["size"][3].startswith("size >= ")
    assert by_dim["predicted class"][:3] == ["predicted=no", "predicted=maybe", "predicted=yes"]
    assert by_dim["predicted class"][3] == "predicted=maybe"  # the last segment: unknown classes
    # without TDI leaves the rule dimension counts nowhere
    assert (seg.ids(x, predicted, None, 4)[-1] == seg.size).all()


def test_segment_sums_are_the_per_sample_counts_and_add_across_windows() -> None:
    rng = np.random.default_rng(2)
    cal, data = fitted(rng)
    seg = cal.segments
    assert seg is not None
    x, _ = table(300, rng)
    predicted = rng.integers(0, 3, 300)
    conf = rng.uniform(0.4, 1.0, 300)
    verdicts = rng.choice(4, 300, p=[0.8, 0.05, 0.1, 0.05]).astype(np.int8)
    rules = data.tdi.rule_index(x) if data.tdi is not None else None
    whole = WindowStats.from_batch(verdicts, conf, cal, labels=predicted, features=x, tdi_rules=rules)
    ids = seg.ids(x, predicted, rules, 300)
    for s in range(seg.size):
        d = seg.dimension_of(s)
        member = ids[d] == s
        assert whole.seg_n[s] == int(member.sum())
        assert whole.seg_fails[s] == int((verdicts[member] != 0).sum())
        assert whole.seg_conf[s] == pytest.approx(conf[member].sum())
        assert whole.seg_conf_sq[s] == pytest.approx((conf[member] ** 2).sum())
    halves = [
        WindowStats.from_batch(verdicts[p], conf[p], cal, labels=predicted[p], features=x[p], tdi_rules=rules[p])
        for p in (slice(0, 120), slice(120, 300))
    ]
    summed = halves[0] + halves[1]
    assert summed.seg_n == whole.seg_n and summed.seg_fails == whole.seg_fails
    assert summed.seg_conf == pytest.approx(whole.seg_conf)
    bucket = TimeWindow(60)
    for h in halves:
        bucket.add(h, now=100.0)
    assert bucket.stats(100.0).seg_n == whole.seg_n
    # exported and read back as the fleet does
    back = stats_from_items(dict(stat_items(whole)))
    assert back.seg_n == whole.seg_n and back.seg_conf == pytest.approx(whole.seg_conf)


def test_the_count_window_keeps_every_predictions_segments_and_restores_them() -> None:
    """Its per-segment sums, the change sums among them (kept as each prediction's change columns), are those of
    its last predictions read at once, and survive a restart."""
    rng = np.random.default_rng(3)
    cal, data = fitted(rng)
    seg = cal.segments
    assert seg is not None
    w = CountWindow(50)
    xs, ps, cs, vs = [], [], [], []
    for n in (20, 25, 30):
        x, _ = table(n, rng)
        p = rng.integers(0, 3, n)
        c = rng.uniform(0.5, 1.0, n)
        v = np.zeros(n, np.int8)
        rules = data.tdi.rule_index(x) if data.tdi is not None else None
        w.add(v, c, labels=p, segments=seg.ids(x, p, rules, n), change=seg.change_values(x))
        xs, ps, cs, vs = [*xs, x], [*ps, p], [*cs, c], [*vs, v]
    x, p, c, v = (np.concatenate(a)[-50:] for a in (xs, ps, cs, vs))
    rules = data.tdi.rule_index(x) if data.tdi is not None else None
    expected = WindowStats.from_batch(v, c, cal, labels=p, features=x, tdi_rules=rules)
    assert expected.change_n and sum(expected.change_n) == 50 * len(seg.dimensions)
    restored = CountWindow.from_dict(json.loads(json.dumps(w.to_dict())))
    for got in (w.stats(cal), restored.stats(cal)):
        assert got.seg_n == expected.seg_n and got.seg_conf == pytest.approx(expected.seg_conf)
        assert got.change_n == expected.change_n  # the change columns are kept in float32
        assert got.change_sum == pytest.approx(expected.change_sum, rel=1e-5)
        assert got.change_sq == pytest.approx(expected.change_sq, rel=1e-5)
        assert got.change_cross == pytest.approx(expected.change_cross, rel=1e-5)


def test_segments_are_stored_with_the_calibration_and_older_bundles_have_none() -> None:
    cal, _ = fitted(np.random.default_rng(4))
    d = json.loads(json.dumps(cal.to_dict()))
    assert d["segments"]["kind"] == SEGMENTS_FORMAT
    back = EstimatorCalibration.from_dict(d)
    assert back.segments == cal.segments
    older = {k: v for k, v in d.items() if k != "segments"}
    assert EstimatorCalibration.from_dict(older).segments is None
    assert segmentation_or_none({**d["segments"], "kind": "segments_v0"}) is None
    assert segmentation_or_none({"kind": SEGMENTS_FORMAT}) is None  # unreadable: no segments, not an error
    assert isinstance(Segmentation.from_dict(d["segments"]), Segmentation)


def live(
    cal: EstimatorCalibration,
    data: SegmentData,
    rng: np.random.Generator,
    n: int,
    hurt: str | None = None,
    confidence: tuple[float, ...] | None = None,
) -> tuple[WindowStats, tuple[list[int], list[int]]]:
    """A window of ``n`` predictions like the validation data (``confidence`` as :func:`fitted` had it); ``hurt``:
    the predictions of that segment lose confidence (and accuracy) as a shifted input does."""
    seg = cal.segments
    assert seg is not None
    x, y = table(n, rng)
    rules = data.tdi.rule_index(x) if data.tdi is not None else None
    right = rng.uniform(size=n) < 0.9
    predicted = np.where(right, y, (y + 1) % 3)
    conf = _confidences(x, 0.9, confidence, rng)
    if hurt is not None:
        ids = seg.ids(x, predicted, rules, n)
        target = seg.names().index(hurt)
        member = ids[seg.dimension_of(target)] == target
        conf[member] = 0.55
        right[member] = rng.uniform(size=int(member.sum())) < 0.55
    verdicts = np.zeros(n, np.int8)
    stats = WindowStats.from_batch(verdicts, conf, cal, labels=predicted, features=x, tdi_rules=rules)
    return stats, truth_counts(seg.ids(x, predicted, rules, n), seg.size, right)


def test_the_hurt_segment_is_ranked_first_and_a_clean_window_has_no_contribution() -> None:
    rng = np.random.default_rng(5)
    cal, data = fitted(rng)
    stats, truth = live(cal, data, rng, 3000, hurt="color=green")
    table_ = segment_table(stats, cal, truth=truth)
    assert table_ is not None
    top = table_.rows[0]
    assert top.name == "color=green" and top.kind == "column" and top.dimension == "color"
    assert top.contribution > 0.05
    assert top.estimate is not None and abs(top.estimate.value - 0.55) < 0.05
    assert top.truth_accuracy is not None and abs(top.truth_accuracy - 0.55) < 0.06
    assert top.estimate.lower < top.estimate.value < top.estimate.upper
    color = next(d for d in table_.dimensions if d.dimension == "color")
    assert color.within == pytest.approx(
        sum(
            r.share * (r.reference_accuracy - r.estimate.value)
            for r in table_.rows
            if r.dimension == "color" and r.estimate
        )
    )
    clean, _ = live(cal, data, rng, 3000)
    quiet = segment_table(clean, cal)
    assert quiet is not None and max(r.contribution for r in quiet.rows) <= 0.0


def test_sums_rebuilt_from_an_export_of_the_touched_segments_give_the_same_table() -> None:
    """A replica exports the sums of the segments with a prediction only: the fleet's rebuilt statistics end at
    the last of them, and the table reads the segments past it as empty."""
    rng = np.random.default_rng(8)
    cal, data = fitted(rng)
    stats, _ = live(cal, data, rng, 2000, hurt="color=green")
    assert cal.segments is not None and len(stats.seg_n) == cal.segments.size
    k = cal.segments.size - 3  # the last segment with a prediction
    zeroed = replace(stats, **{f: [v if i <= k else 0 for i, v in enumerate(getattr(stats, f))] for f in SEGMENT_STATS})
    cut = replace(zeroed, **{f: getattr(zeroed, f)[: k + 1] for f in SEGMENT_STATS})
    whole = segment_table(zeroed, cal)
    assert whole is not None and segment_table(cut, cal) == whole
    longer = replace(stats, **{f: [*getattr(stats, f), 0] for f in SEGMENT_STATS})
    assert segment_table(longer, cal) is None  # statistics of another segmentation


def test_a_change_of_mix_alone_is_the_mix_part_not_a_contribution() -> None:
    rng = np.random.default_rng(6)
    cal, data = fitted(rng)
    seg = cal.segments
    assert seg is not None
    x, y = table(6000, rng)
    keep = np.flatnonzero(x[:, 0] == 1)[:1500]  # only red
    x, y = x[keep], y[keep]
    rules = data.tdi.rule_index(x) if data.tdi is not None else None
    stats = WindowStats.from_batch(
        np.zeros(len(y), np.int8), np.full(len(y), 0.9), cal, labels=y, features=x, tdi_rules=rules
    )
    table_ = segment_table(stats, cal)
    assert table_ is not None
    red = next(r for r in table_.rows if r.name == "color=red")
    assert red.share == 1.0 and red.reference_share == pytest.approx(1 / 3, abs=0.05)
    assert max(r.contribution for r in table_.rows) <= 0.0


def test_segment_estimates_are_the_on_segments_estimators_with_the_segments_reference() -> None:
    rng = np.random.default_rng(7)
    cal, data = fitted(rng)
    seg = cal.segments
    assert seg is not None
    stats, _ = live(cal, data, rng, 2000)
    index = seg.names().index("color=blue")
    estimates = segment_estimates(stats, cal, index)
    assert set(estimates) == {"icos", "icos_corrected", "avg_conf", "doc"}
    own = segment_calibration(cal, index)
    ref = seg.reference
    assert own.accuracy == pytest.approx((ref.correct[index] + 5 * 0.9) / (ref.n[index] + 5), abs=0.02)
    assert estimates["avg_conf"].value == pytest.approx(0.9)


def test_the_fleet_schema_knows_the_segments_and_refuses_impossible_sums() -> None:
    rng = np.random.default_rng(8)
    cal, data = fitted(rng)
    seg = cal.segments
    assert seg is not None
    schema = StatSchema.of_bundle(cal, 3)
    assert {f"seg_n:{i}" for i in range(seg.size)} <= schema.names
    assert f"seg_n:{seg.size}" not in schema.names
    stats, _ = live(cal, data, rng, 400)
    items = dict(stat_items(stats))
    assert schema.window(items, 1000.0, "w").seg_n == stats.seg_n
    bad = dict(items)
    bad["seg_n:0"] = items["seg_n:0"] + stats.n  # one dimension then holds more than every prediction
    with pytest.raises(RefusedAnswer, match="segments"):
        schema.window(bad, 1000.0, "w")
    with pytest.raises(RefusedAnswer):
        schema.known(f"seg_n:{seg.size}")


def test_regions_cluster_a_view_and_name_their_class_mix() -> None:
    rng = np.random.default_rng(9)
    centres = np.array([[0.0, 0.0], [8.0, 0.0], [0.0, 8.0]])
    y = rng.integers(0, 3, 900)
    x = (centres[y] + rng.normal(0, 0.5, (900, 2))).astype(np.float32)
    found, assigned = kmeans(x.astype(np.float64), 3, rng)
    assert len(found) == 3 and len(np.unique(assigned)) == 3
    cal = EstimatorCalibration(tpr=0.5, fpr=0.1, n_wrong=50, n_right=250, accuracy=0.9, avg_conf=0.9, atc_threshold=0.5)
    data = SegmentData(
        x, y, x[:300], y[:300], np.eye(3)[y[:300]], y[:300], np.arange(100), np.zeros(100), None, CLASSES
    )
    plan = CalibrationPlan(segment_regions=3)
    seg = define_segments(data, ViewShape((), regions=True), cal, max_segments=64, plan=plan)
    assert seg is not None
    region = next(d for d in seg.dimensions if d.kind == "region")
    assert sorted(n.split(": ")[1] for n in region.segments) == ["maybe 100%", "no 100%", "yes 100%"]
    ids = seg.ids(x, y, None, 900)[seg.dimensions.index(region)]
    names = [seg.names()[i] for i in ids]
    assert all(n.endswith(f"{CLASSES[c]} 100%") for n, c in zip(names, y, strict=True))


def test_one_rendering_carries_the_segments_to_every_surface() -> None:
    from agent.results.window import snapshot_points, window_entry

    rng = np.random.default_rng(10)
    cal, data = fitted(rng)
    stats, _ = live(cal, data, rng, 2000, hurt="color=green")
    entry = window_entry("1h", stats, cal, "doc", CLASSES, per_class_cap=20)
    body = entry.to_json(cal)
    assert body["segments"][0]["name"] == "color=green"
    assert set(body["segment_drop"]["dimensions"]) == {d.name for d in cal.segments.dimensions}  # type: ignore[union-attr]
    points = entry.points().segments
    assert len(points) == cal.segments.size  # type: ignore[union-attr]
    top = points[0]
    assert (top.window, top.kind, top.segment) == ("1h", "column", "color=green")
    assert top.contribution == pytest.approx(body["segments"][0]["contribution"], abs=1e-6)
    assert snapshot_points([entry]).segments == points
    # a bundle without segments (fitted before them) reports none, and nothing breaks
    older = EstimatorCalibration.from_dict({k: v for k, v in cal.to_dict().items() if k != "segments"})
    plain = window_entry("1h", stats, older, "doc", CLASSES, per_class_cap=20)
    assert "segments" not in plain.to_json(older) and plain.points().segments == []
    assert segment_table(WindowStats.from_batch(np.zeros(3, np.int8), np.ones(3), older), older) is None


def test_a_segment_predicted_less_confidently_is_no_change_in_windows_like_the_reference() -> None:
    """The change test reads each segment's own confidence at fit. The segments' estimators pull it toward the
    dimension's by as much as the dimension's segments differ little in accuracy (up to thousands of
    pseudo-rows): against that figure, a segment the model always predicts less confidently, as accurately as
    the others, read as a fall in every window."""
    rng = np.random.default_rng(11)
    confidence = (0.93, 0.78, 0.93)
    cal, data = fitted(rng, confidence=confidence)
    assert cal.segments is not None
    code = [d.name for d in cal.segments.dimensions].index("code")
    assert cal.segments.priors[code].strength > 1000  # accuracies alike: a strong pull
    changed = []
    for _ in range(8):
        stats, _ = live(cal, data, rng, 2000, confidence=confidence)
        table_ = segment_table(stats, cal)
        assert table_ is not None
        changed += [r.name for r in table_.rows if r.change.changed]
    assert changed == []
    stats, _ = live(cal, data, rng, 2000, hurt="color=green", confidence=confidence)
    table_ = segment_table(stats, cal)
    assert table_ is not None and "color=green" in [r.name for r in table_.rows if r.change.changed]


@pytest.mark.parametrize("bin_name", ["size < -0.632421", "size in [0.0430161, 0.70013)"])
def test_a_column_stuck_inside_a_bin_of_its_own_is_found_there(bin_name: str) -> None:
    """A numeric column stuck at one of its values in the rows of one of its own bins keeps them in the bin and
    its mean about where it was; its spread there collapsed. The bin's own spread is far narrower than the
    column's, and read against the column's it looked like noise: the bin must be changed, and first."""
    rng = np.random.default_rng(5)
    cal, data = fitted(rng)
    seg = cal.segments
    assert seg is not None and bin_name in seg.names()
    target = seg.names().index(bin_name)
    n = 3000
    x, y = table(n, rng)
    right = rng.uniform(size=n) < 0.9
    predicted = np.where(right, y, (y + 1) % 3)
    rules = data.tdi.rule_index(x) if data.tdi is not None else None
    member = seg.ids(x, predicted, rules, n)[seg.dimension_of(target)] == target
    x[member, 4] = np.median(x[member, 4])
    stats = WindowStats.from_batch(
        np.zeros(n, np.int8), np.full(n, 0.9), cal, labels=predicted, features=x, tdi_rules=rules
    )
    table_ = segment_table(stats, cal)
    assert table_ is not None
    assert table_.rows[0].name == bin_name and table_.rows[0].change.changed
    assert table_.rows[0].change.names[0] == "size"


def test_a_change_of_every_row_is_across_the_traffic_and_a_change_in_one_segment_is_not() -> None:
    """A column offset in every row changes segments holding most of the predictions in every dimension: the
    table says the change is across the traffic, on every surface, rather than in its first segment. A fault in
    one colour leaves the other colours unchanged, so the colour dimension isolates it."""
    from agent.results.segments import segment_lines
    from agent.results.served import TopSegment
    from agent.results.window import window_entry

    rng = np.random.default_rng(12)
    cal, data = fitted(rng)
    n = 3000
    x, y = table(n, rng)
    x[:, 4] += 2.0  # every row's size, as a unit changed upstream
    right = rng.uniform(size=n) < 0.9
    predicted = np.where(right, y, (y + 1) % 3)
    rules = data.tdi.rule_index(x) if data.tdi is not None else None
    stats = WindowStats.from_batch(
        np.zeros(n, np.int8), np.full(n, 0.9), cal, labels=predicted, features=x, tdi_rules=rules
    )
    body = window_entry("1h", stats, cal, "doc", CLASSES, per_class_cap=20).to_json(cal)
    drop = body["segment_drop"]
    assert drop["widespread"] is True
    assert min(d["changed_share"] for d in drop["dimensions"].values()) >= 0.5
    lines = segment_lines(body)
    assert lines[0].startswith("where the drop is: across the traffic, in no one segment")
    top = TopSegment.of_rows(body["segments"], drop)
    assert top is not None and top.to_text().startswith("across the traffic: segments whose inputs changed hold")
    assert exported_widespread(window_entry("1h", stats, cal, "doc", CLASSES, per_class_cap=20)) == {"1h": 1.0}

    local, _ = live(cal, data, rng, 3000, hurt="color=green")
    body = window_entry("1h", local, cal, "doc", CLASSES, per_class_cap=20).to_json(cal)
    drop = body["segment_drop"]
    assert body["segments"][0]["name"] == "color=green" and drop["widespread"] is False
    assert drop["dimensions"]["color"]["changed_share"] == pytest.approx(body["segments"][0]["share"], abs=1e-6)
    assert segment_lines(body)[0].startswith("where the drop is (segments by evidence of a drop")
    top = TopSegment.of_rows(body["segments"], drop)
    assert top is not None and top.across is None and top.to_text().startswith("color=green")
    assert exported_widespread(window_entry("1h", local, cal, "doc", CLASSES, per_class_cap=20)) == {"1h": 0.0}
    clean, _ = live(cal, data, rng, 3000)
    body = window_entry("1h", clean, cal, "doc", CLASSES, per_class_cap=20).to_json(cal)
    assert body["segment_drop"]["widespread"] is False
    assert all(d["changed_share"] == 0.0 for d in body["segment_drop"]["dimensions"].values())


def exported_widespread(entry: Any) -> dict[str, float]:
    """``icos_segment_change_widespread`` as a window entry's segment points export it: value per window."""
    from exporters.segment_metrics import segment_families

    families = segment_families("icos_", [(("m", "1"), p) for p in entry.points().segments], "in the window")
    (family,) = [f for f in families if f.name == "icos_segment_change_widespread"]
    return {s.labels["window"]: s.value for s in family.samples}


def test_a_rule_segment_of_many_conditions_is_abbreviated_in_one_line_and_named_in_full_elsewhere() -> None:
    """The demo's "where the drop is" line names a deep rule by its first conditions and how many more; the
    segment's name, its identity in JSON and metrics, keeps every condition. A short rule reads in full."""
    from agent.estimation.segments.kinds.rule import abbreviated
    from agent.offline.calibration.segments.kinds.rule import rule_name
    from agent.results.served import TopSegment
    from invariants.tdi import TdiRule

    names = [f"f{j}" for j in range(10)] + ["city=paris"]
    conditions = tuple((j, "<=" if j % 2 else ">", 0.5 + j) for j in range(7)) + ((10, "<=", 0.5),)
    deep = rule_name(2, TdiRule(5, 1, 40, 0.9, True, conditions, ""), names, frozenset({10}), ["no", "yes"])
    assert deep == (
        "TDI rule 2: f0 > 0.5 & f1 <= 1.5 & f2 > 2.5 & f3 <= 3.5 & f4 > 4.5 & f5 <= 5.5 & f6 > 6.5 & city!=paris => yes"
    )
    assert abbreviated(deep) == "TDI rule 2: f0 > 0.5 & f1 <= 1.5 & f2 > 2.5 & 5 more => yes"
    short = rule_name(3, TdiRule(6, 0, 40, 0.9, True, conditions[:4], ""), names, frozenset({10}), ["no", "yes"])
    assert abbreviated(short) == short
    empty = rule_name(4, TdiRule(7, 0, 40, 0.9, True, (), ""), names, frozenset(), ["no", "yes"])
    assert empty == "TDI rule 4: => no" and abbreviated(empty) == empty
    assert abbreviated("city=paris") == "city=paris" and abbreviated("other rules => 3") == "other rules => 3"

    row = {"kind": "rule", "name": deep, "share": 0.05, "contribution": 0.01, "reference_accuracy": 0.9}
    top = TopSegment.of_rows([row])
    assert top is not None and top.name == deep and top.to_json()["name"] == deep
    assert top.to_text().startswith("TDI rule 2: f0 > 0.5 & f1 <= 1.5 & f2 > 2.5 & 5 more => yes (a rule segment")


@pytest.mark.parametrize(("dims", "size", "k"), [(10, 44, 63), (3, 400, 2), (2, 6, 1)])
def test_per_segment_sums_are_the_rows_sums_whichever_way_they_are_added(dims: int, size: int, k: int) -> None:
    """Few segments against the sums a row adds are summed by one product with the rows' membership, many by one
    ``np.bincount``: either way each segment's sums over its own rows; a number at or beyond ``size`` counts nowhere,
    and a non-finite value stays in its own segment."""
    rng = np.random.default_rng(dims * size)
    n = 300
    # each dimension numbers its own segments; a tenth of the rows read nowhere in it (a number at ``size``)
    ids = np.stack([rng.integers(d * size // dims, (d + 1) * size // dims, n) for d in range(dims)])
    ids[rng.uniform(size=ids.shape) < 0.1] = size
    values = rng.normal(size=(n, k))
    got = per_segment(ids, size, values).reshape(size, k)
    want = np.zeros((size, k))
    for d in range(dims):
        for row in range(n):
            if ids[d, row] < size:
                want[ids[d, row]] += values[row]
    assert np.allclose(got, want, rtol=1e-12, atol=1e-12)
    values[0, 0] = np.nan
    spoiled = per_segment(ids, size, values).reshape(size, k)
    hit = {int(s) for s in ids[:, 0] if s < size}
    assert all(np.isnan(spoiled[s, 0]) == (s in hit) for s in range(size))
