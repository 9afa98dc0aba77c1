"""The flag "this number may be wrong": the class-adjusted test, the model, its fit and what every surface says."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.registry import WindowEstimates, estimate_window, headline_of
from agent.estimation.estimators.trust import Trust
from agent.estimation.flag.assessment import NO_FLAG_NOTE, TRUST_REMOVED_IN, assess
from agent.estimation.flag.class_mix import CLASS_Z, MIX_Z, N_REDUCED, ClassReference, MixTest, per_sample_quantities
from agent.estimation.flag.model import (
    FEATURES,
    MODEL_FEATURES,
    REASONS,
    RISK,
    TABLE_FEATURES,
    TOLERANCE,
    FlagModel,
    WindowEvidence,
    feature_row,
    flag_or_none,
    inputs_beyond_confidence,
)
from agent.estimation.intervals import Estimate
from agent.estimation.statistics.window import WindowStats
from agent.offline.calibration.corruptions import corruption_groups
from agent.offline.calibration.flag.fitting import FlagWindow, fit_flag_model, isotonic_steps, monotone_logistic
from agent.offline.calibration.judged import JudgedSet
from agent.offline.calibration.shift_windows import tilt_coordinates
from agent.results.window import flag_sections, snapshot_points, window_entry
from exporters.prometheus import EstimatesCollector, Snapshot


def _split(n: int = 3000, k: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A calibration split whose classes differ in confidence: class 0 sure, class 2 unsure."""
    rng = np.random.default_rng(seed)
    pred = rng.integers(0, k, n)
    conf = np.clip(rng.normal(0.97 - 0.15 * pred, 0.03), 0.34, 1.0)
    verdicts = (rng.uniform(size=n) < 0.02 + 0.1 * pred).astype(np.int64) * 2
    return pred, conf, verdicts


def _window(pred: np.ndarray, conf: np.ndarray, verdicts: np.ndarray, k: int = 3) -> WindowStats:
    stats = WindowStats.of_samples(verdicts, conf, 0.5)
    stats.cbpe_n = len(pred)
    stats.cbpe_predicted = np.bincount(pred, minlength=k).tolist()
    return stats


def _reference() -> ClassReference:
    pred, conf, verdicts = _split()
    return ClassReference.fit(per_sample_quantities(verdicts, conf, None, ()), pred, 3)


def test_a_change_of_class_mix_alone_is_told_from_a_covariate_shift() -> None:
    """Windows drawn mostly from the unsure class: their mean confidence falls, but exactly as the class mix
    predicts (class_z large, z within noise); the same mix with every confidence lowered by 0.1 is not."""
    ref = _reference()
    assert ref.width == N_REDUCED
    pred, conf, verdicts = _split(seed=1)
    same = ref.test(_window(pred[:1000], conf[:1000], verdicts[:1000]))
    assert same is not None and same.z < MIX_Z and not same.changed
    unsure = np.flatnonzero(pred == 2)[:700]
    rows = np.r_[unsure, np.flatnonzero(pred == 0)[:100]]
    mix = ref.test(_window(pred[rows], conf[rows], verdicts[rows]))
    assert mix is not None and mix.class_z > CLASS_Z and mix.z <= MIX_Z and mix.mix_only
    shifted = ref.test(_window(pred[rows], np.clip(conf[rows] - 0.1, 0.34, 1), verdicts[rows]))
    assert shifted is not None and shifted.z > 3 * MIX_Z and not shifted.mix_only
    assert shifted.largest_group == "confidence_shifted" and shifted.effect > mix.effect
    # a window without its class mix (a fleet's sums above the class cap) compares with the split's mix
    blind = WindowStats.of_samples(verdicts[rows], conf[rows], 0.5)
    unknown = ref.test(blind)
    assert unknown is not None and not unknown.classes_known and unknown.class_z == 0.0 and not unknown.mix_only


def test_the_class_reference_round_trips_with_only_the_classes_it_saw() -> None:
    pred, conf, verdicts = _split()
    pred = np.where(pred == 1, 4, pred)  # classes 1 and 3 of 5 never predicted
    ref = ClassReference.fit(per_sample_quantities(verdicts, conf, None, ()), pred, 5)
    d = json.loads(json.dumps(ref.to_dict()))
    assert d["classes"] == [0, 2, 4]
    back = ClassReference.from_dict(d)
    np.testing.assert_allclose(back.mean, ref.mean)
    np.testing.assert_allclose(back.var, ref.var)
    np.testing.assert_allclose(back.counts, ref.counts)


#: The features of a model bundle fitted before ``inputs_beyond_confidence``: such bundles keep deciding by them.
EARLIER_FEATURES = ("log_distance", "log_shift", "disagreement", "drop", "small_window")
N_TABLE = len(TABLE_FEATURES)


def _model(**kw: object) -> FlagModel:
    base: dict[str, object] = dict(
        features=EARLIER_FEATURES,
        mean=(0.0,) * 5,
        scale=(1.0,) * 5,
        coef=(1.0, 2.0, 0.0, 1.0, 0.0),
        intercept=-3.0,
        threshold=0.0,
        z_gate=2.0,
        steps=(-1.0, 0.5),
        levels=(0.01, 0.2, 0.8),
        below=(0.1, 0.2, 0.3),
        above=(0.05, 0.1, 0.15),
        reference=_reference(),
    )
    base.update(kw)
    return FlagModel(**base)  # type: ignore[arg-type]


def test_the_flag_is_raised_with_its_reasons_and_widens_by_its_band() -> None:
    """Score −3 + log 4 + 2·log(1 + 1.5) = 0.22 ≥ 0: raised, probability 0.2 (band 1), the distance and the
    input shift named, the largest term first."""
    mix = MixTest(z=6.0, effect=1.5, class_z=0.0, groups={"confidence_shifted": 1.0, "inputs_unlike_reference": 7.0})
    ev = WindowEvidence(n=1000, headline=0.8, distance=4.0, mix=mix, disagreement=0.0, drop=0.0)
    d = _model().decide(ev)
    assert d.raised and d.probability == 0.2
    assert d.reasons == ("inputs_unlike_reference", "outside_calibrated_range")
    assert (d.below, d.above) == (0.2, 0.1)
    # the same evidence without a shift beyond the gate: down (no covariate shift, no flag)
    calm = WindowEvidence(n=1000, headline=0.8, distance=0.9, mix=MixTest(1.0, 1.5, 0.0), disagreement=0.0, drop=0.0)
    assert not _model().decide(calm).raised
    # a change of class mix alone keeps it down and says so
    label = MixTest(z=1.5, effect=1.5, class_z=40.0)
    d2 = _model(z_gate=0.0).decide(WindowEvidence(1000, 0.8, 4.0, label, 0.0, 0.0))
    assert not d2.raised and d2.reasons == ("class_mix_changed",) and (d2.below, d2.above) == (0.0, 0.0)
    assert set(d.reasons + d2.reasons) <= set(REASONS)


def test_a_class_mix_keeps_the_flag_down_only_where_the_residual_is_within_noise() -> None:
    """The evidence of MNIST with a fifth of the digits inverted: the class mix moved (class_z 6) and the
    class-adjusted residual far beyond noise (z 12.8), inside the calibrated range, the score below the
    threshold. The change of mix explains nothing of the residual: the flag is raised, naming what moved, not
    ``class_mix_changed``. The same mix with a residual within noise (z at most the gate) keeps it down."""
    model = _model(threshold=5.0, z_gate=3.0)
    moved = MixTest(z=12.8, effect=0.5, class_z=6.0, groups={"confidence_shifted": 12.8, "inputs_unlike_reference": 3})
    ev = WindowEvidence(n=1000, headline=0.92, distance=0.9, mix=moved, disagreement=0.0, drop=0.0)
    assert model.score(feature_row(ev, model.features)) < model.threshold
    d = model.decide(ev)
    assert d.raised and "class_mix_changed" not in d.reasons and d.reasons[0] == "confidence_shifted"
    assert d.below > 0.0 and d.above > 0.0  # its interval widens
    # the same without the class mix moving: the score decides, and it is below the threshold
    assert not model.decide(WindowEvidence(1000, 0.92, 0.9, MixTest(12.8, 0.5, 0.0, moved.groups), 0.0, 0.0)).raised
    # the mix moved, the residual beyond MIX_Z but within the gate: within noise, the mix may keep it down
    near = MixTest(z=2.9, effect=0.1, class_z=6.0, groups=moved.groups)
    d2 = model.decide(WindowEvidence(1000, 0.92, 0.9, near, 0.0, 0.0))
    assert not near.mix_only and not d2.raised and d2.reasons == ("class_mix_changed",)
    # a model fitted with inputs_beyond_confidence (0 here: the confidence moved most): its score decides
    k = len(MODEL_FEATURES)
    current = _model(threshold=5.0, z_gate=3.0, features=MODEL_FEATURES, mean=(0.0,) * k, scale=(1.0,) * k)
    current = replace(current, coef=(1.0, 2.0, 0.0, 1.0, 0.0, 1.0))
    assert current.score(feature_row(ev, current.features)) == model.score(feature_row(ev, model.features))
    d3 = current.decide(ev)
    assert not d3.raised and d3.reasons == ("class_mix_changed",)


def test_the_flag_model_round_trips_and_old_bundles_have_none() -> None:
    model = _model(threshold=math.inf)
    back = FlagModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert back.features == model.features and back.threshold == math.inf and back.coef == model.coef
    always = FlagModel.from_dict(json.loads(json.dumps(_model(threshold=-math.inf).to_dict())))
    assert always.threshold < -1e300  # raised on every window, as before the round trip
    assert flag_or_none(None) is None and flag_or_none({"features": ["from_the_future"]}) is None
    cal = EstimatorCalibration(0.8, 0.1, 25, 100, 0.8, 0.8, 0.7).with_flag(model)
    again = EstimatorCalibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert again.flag is not None and again.flag.features == EARLIER_FEATURES
    assert EstimatorCalibration.from_dict(EstimatorCalibration(0.8, 0.1, 25, 100, 0.8, 0.8, 0.7).to_dict()).flag is None


def test_a_bundle_without_a_flag_falls_back_to_the_trust_distance_and_says_so() -> None:
    stats = WindowStats.of_samples(np.zeros(100, dtype=np.int64), np.full(100, 0.9), 0.7)
    cal = EstimatorCalibration(0.8, 0.1, 5, 100, 0.95, 0.9, 0.7)
    est = {"doc": Estimate(0.9, 0.85, 0.95, 100)}
    window = WindowEstimates(stats, est, Trust(1.7, False, 3.0, 0.2))
    a = assess(window, ("doc", est["doc"]), cal)
    assert a is not None and a.raised and a.basis == "trust_distance"
    assert a.reasons == ("outside_calibrated_range", "few_calibration_errors")  # 5 wrong in the split
    d = a.to_dict()
    assert d["note"] == NO_FLAG_NOTE and d["in_calibrated_range"] is False and "probability" not in d
    assert a.headline == ("doc", est["doc"]) and not a.widened
    assert assess(WindowEstimates(stats, est, None), ("doc", est["doc"]), cal) is None  # no trust model: no section


def _fit_windows(seed: int = 0) -> list[FlagWindow]:
    """Windows whose headline error grows with the input shift: error ≈ 0.06·effect + noise."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(600):
        effect = float(rng.uniform(0, 3)) if i % 4 else float(rng.uniform(0, 0.3))
        kind = "corruption" if i % 4 else "clean"
        mix = MixTest(z=effect * 10, effect=effect, class_z=0.0, groups={"inputs_unlike_reference": effect * 10})
        h = 0.9 - 0.01 * effect
        truth = h - 0.06 * effect + float(rng.normal(0, 0.01))
        n = int(rng.integers(300, 1600))
        ev = WindowEvidence(n, h, None, mix, disagreement=float(rng.uniform(0, 0.02)), drop=0.0)
        out.append(FlagWindow(ev, kind, truth))
    return out


def test_the_fitted_flag_leaves_few_misses_down_and_names_the_shift() -> None:
    windows = _fit_windows()
    ref = _reference()
    model = fit_flag_model(windows, ref, TABLE_FEATURES, "cbpe")
    assert model is not None and all(c >= 0 for c in model.coef)
    assert model.coef[model.features.index("log_shift")] > 0
    decisions = [model.decide(w.evidence) for w in windows]
    err = np.array([abs(w.evidence.headline - w.truth) for w in windows])
    up = np.array([d.raised for d in decisions])
    assert up.any() and not up.all()
    assert float(np.mean(err[~up] > TOLERANCE)) <= RISK + 1e-9  # the rule's own definition, on its windows
    assert float(np.mean(up[err > 0.1])) > 0.9
    assert all(d.reasons[0] == "inputs_unlike_reference" for d in decisions if d.raised)
    flagged = [(w, d) for w, d in zip(windows, decisions, strict=True) if d.raised]
    held = [w.evidence.headline - d.below <= w.truth <= w.evidence.headline + d.above for w, d in flagged]
    assert np.mean(held) >= 0.9  # the widened interval holds the truth of the windows it was measured on
    # nothing random in the fit: the same windows give the same model
    assert fit_flag_model(windows, ref, TABLE_FEATURES, "cbpe") == model


def test_inputs_beyond_confidence_is_what_the_confidence_does_not_follow() -> None:
    def value(conf: float, inputs: float) -> float | None:
        mix = MixTest(6.0, 0.5, 0.0, {"confidence_shifted": conf, "inputs_unlike_reference": inputs})
        return inputs_beyond_confidence(mix)

    assert value(12.0, 12.0) == 0.0 and value(12.0, 3.0) == 0.0  # the confidence moved as much or more
    assert value(1.0, 1.0) == 0.0 and value(1.0, 15.0) == pytest.approx(math.log(8.0))
    # the same shift in a window ten times larger (both z about √10 times larger): about the same value, the log
    # of the ratio of the two moves
    small, large = value(3.0, 15.0), value(3.0 * math.sqrt(10), 15.0 * math.sqrt(10))
    assert small == pytest.approx(math.log(5.0), abs=0.25) and large == pytest.approx(math.log(5.0), abs=0.25)
    assert inputs_beyond_confidence(MixTest(6.0, 0.5, 0.0, {"confidence_shifted": 1.0})) is None  # no inputs
    assert inputs_beyond_confidence(None) is None


def _confident_windows(seed: int = 0) -> list[FlagWindow]:
    """Shifts of every size, half of them followed by the confidence (the headline drops with the truth and
    holds it), half not (the model stays confident on inputs unlike the reference: the headline stays put
    while the truth falls by 0.15·effect); a fifth clean."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(800):
        clean = i % 5 == 0
        effect = float(rng.uniform(0, 0.1) if clean else rng.uniform(0, 1.5))
        moved = 1.0 + 10.0 * effect
        confident = not clean and i % 2 == 1
        groups = {"confidence_shifted": 1.0 if confident else moved, "inputs_unlike_reference": moved}
        truth = 0.9 - 0.15 * effect + float(rng.normal(0, 0.005))
        head = 0.9 if confident else truth + float(rng.normal(0, 0.01))
        ev = WindowEvidence(
            int(rng.integers(300, 1600)), head, None, MixTest(moved, effect, 0.0, groups), 0.0, max(0.9 - head, 0.0)
        )
        out.append(FlagWindow(ev, "clean" if clean else "corruption", truth))
    return out


def test_the_flag_tells_a_confident_model_on_moved_inputs_from_a_shift_the_confidence_follows() -> None:
    """Both kinds of shift move the inputs alike; only the one the confidence does not follow leaves the
    headline wrong. With ``inputs_beyond_confidence`` the flag raises on it and not on the other; with the
    features of earlier bundles it cannot tell them apart."""
    windows = _confident_windows()
    ref = _reference()
    mid = [w for w in windows if 0.5 < w.evidence.mix.effect and w.kind != "clean"]  # type: ignore[union-attr]
    confident = [w.evidence.headline == 0.9 for w in mid]

    def raised(features: tuple[str, ...]) -> tuple[float, float]:
        model = fit_flag_model(windows, ref, features, "cbpe")
        assert model is not None
        up = np.array([model.decide(w.evidence).raised for w in mid])
        return float(up[np.array(confident)].mean()), float(up[~np.array(confident)].mean())

    model = fit_flag_model(windows, ref, TABLE_FEATURES, "cbpe")
    assert model is not None and model.coef[model.features.index("inputs_beyond_confidence")] > 0
    on_confident, on_followed = raised(TABLE_FEATURES)
    assert on_confident >= 0.95 and on_followed <= 0.05
    reasons = [model.decide(w.evidence).reasons for w, c in zip(mid, confident, strict=True) if c]
    assert all(r[0] == "inputs_unlike_reference" for r in reasons)
    earlier = tuple(f for f in EARLIER_FEATURES if f != "log_distance")
    on_confident, on_followed = raised(earlier)
    assert on_confident < 0.95 or on_followed > 0.05


def test_monotone_logistic_never_gives_a_negative_weight() -> None:
    rng = np.random.default_rng(0)
    z = rng.normal(size=(500, 2))
    y = z[:, 0] - 2 * z[:, 1] + rng.normal(size=500) > 0  # the second feature lowers the risk
    coef, _ = monotone_logistic(z, y)
    assert coef[0] > 0.5 and coef[1] == 0.0
    steps, levels = isotonic_steps(z[:, 0], y)
    assert levels == sorted(levels) and len(steps) == len(levels) - 1


def test_every_feature_names_a_known_reason() -> None:
    assert set(TABLE_FEATURES) < set(MODEL_FEATURES) == set(FEATURES)
    for f in FEATURES.values():
        assert f.reason is None or f.reason in REASONS


def test_related_corruptions_are_held_out_together() -> None:
    names = ["elastic", "zoom_shear", "audit:rotation", "gamma", "fog", "audit:blur", "pixelate", "text:typos"]
    groups = corruption_groups(names, 3)
    assert ("audit:rotation", "elastic", "zoom_shear") in groups and ("fog", "gamma") in groups
    assert ("audit:blur", "pixelate") in groups and ("text:typos",) in groups
    tables = corruption_groups(["table:audit:noise", "table:heavy_noise", "table:swap", "table:dropout"], 3)
    assert ("table:audit:noise", "table:heavy_noise") in tables and len(tables) == 3


def _fixed_flag(threshold: float) -> tuple[WindowStats, EstimatorCalibration, FlagModel]:
    """A darkened window, its calibration and a flag model over the table features whose decision is fixed by
    ``threshold`` (−inf: always raised, +inf: never) with no gate."""
    pred, conf, verdicts = _split(seed=2)
    stats = _window(pred[:500], np.clip(conf[:500] - 0.2, 0.34, 1), verdicts[:500])
    cal = EstimatorCalibration.fit(conf, np.random.default_rng(0).uniform(size=len(conf)) < conf, verdicts != 0)
    ones, zeros = (1.0,) * N_TABLE, (0.0,) * N_TABLE
    model = _model(features=TABLE_FEATURES, mean=zeros, scale=ones, coef=ones, threshold=threshold, z_gate=0.0)
    return stats, cal, model


def test_the_flag_reaches_the_window_json_and_the_metrics() -> None:
    """A bundle whose flag is always raised (threshold −inf, gate 0): the window's flag says so, its
    headline's interval is widened and says so, and ``icos_estimate_flagged`` is 1 with the main reason."""
    stats, cal, model = _fixed_flag(-math.inf)
    cal = cal.with_flag(model)
    entry = window_entry("5m", stats, cal, "cbpe", per_class_cap=10)
    doc = entry.to_json(cal)
    assert doc["flag"]["raised"] is True and doc["flag"]["basis"] == "flag"
    assert doc["flag"]["reasons"][0] == "confidence_shifted"
    head = doc["headline"]
    own = head["own_interval"]
    assert head["flag_raised"] is True and "may be off by more than 0.05" in head["may_be_wrong"]
    assert head["lower"] < own["lower"] and head["upper"] >= own["upper"]
    plain = headline_of(estimate_window(stats, cal).estimates, "cbpe")
    assert plain is not None and (own["lower"], own["upper"]) == (plain[1].lower, plain[1].upper)
    points = snapshot_points([entry])
    reg = CollectorRegistry()
    reg.register(
        EstimatesCollector(lambda: Snapshot("m", "1", points.estimates, points.windows, headline=points.headline))
    )
    text = generate_latest(reg).decode()
    assert 'icos_estimate_flagged{model="m",reason="confidence_shifted",version="1",window="5m"} 1.0' in text
    assert (
        f'icos_headline_accuracy_ratio_lower{{estimator="cbpe",model="m",version="1",window="5m"}} {head["lower"]}'
        in text
    )


@pytest.mark.parametrize("n", [300, 1500])
def test_table_flag_on_a_split_with_shifts(n: int) -> None:
    """The flag of a bundle without shift_aware: fitted on simulated shifts of held-out folds."""
    from agent.offline.calibration.flag.fitting import table_flag

    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, n)
    x = rng.normal(size=(n, 3)) + y[:, None]
    conf = np.clip(0.6 + 0.1 * x[:, 0] + rng.normal(0, 0.05, n), 0.34, 1.0)
    correct = rng.uniform(size=n) < conf
    pred = np.where(correct, y, (y + 1) % 3)
    clean = JudgedSet("clean", np.where(rng.uniform(size=n) < 0.1, 2, 0), conf, correct, y)
    model = table_flag(clean, pred, "cbpe", tilt_coordinates(x), 3, seed=0)
    assert model is not None and model.features == TABLE_FEATURES and model.headline == "cbpe"
    assert model.windows == 2 * 7 * 40 and model.reference.width == N_REDUCED


@pytest.mark.parametrize("threshold", [-math.inf, math.inf])
def test_the_deprecated_trust_section_is_emitted_beside_the_flag_and_agrees_with_it(threshold: float) -> None:
    """Until 0.2.0 every document carries the former ``trust`` section (``calibrated`` = not ``raised``) and the
    headline its former ``calibrated``, beside ``flag`` and ``flag_raised``: a flag always raised and one never
    raised, in a window's JSON and in ``check``'s sections."""
    stats, cal, model = _fixed_flag(threshold)
    cal = cal.with_flag(model)
    entry = window_entry("5m", stats, cal, "cbpe", per_class_cap=10)
    doc = entry.to_json(cal)
    checked = flag_sections(estimate_window(stats, cal), "cbpe", cal)
    raised = threshold < 0
    for flag, trust, head in (
        (doc["flag"], doc["trust"], doc["headline"]),
        (checked["flag"], checked["trust"], checked["headline_estimate"]),
    ):
        assert flag["raised"] is raised and trust["calibrated"] is (not raised)
        assert head["flag_raised"] is raised and head["calibrated"] is (not raised)
        assert {k: v for k, v in trust.items() if k not in ("calibrated", "deprecated")} == {
            k: v for k, v in flag.items() if k != "raised"
        }
        assert "raised" not in trust and "calibrated" not in flag
        assert TRUST_REMOVED_IN in trust["deprecated"] and TRUST_REMOVED_IN == "0.2.0"
