"""What the fleet evaluator believes of an answer: the statistic names of its bundle, counter values,
and the relations every window of real predictions keeps; every failure counted under its reason."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from agent.config.settings import AgentSettings
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.layout import LEAF_BINS
from agent.estimation.statistics.items import stat_items
from agent.estimation.statistics.reference import InputReference
from agent.estimation.statistics.window import SampleExtras, WindowStats
from agent.fleet.evaluator import FleetEvaluator
from agent.fleet.prometheus_api import REASONS, PrometheusAPI, Sample
from agent.fleet.stat_schema import RefusedAnswer, StatSchema


def _reference(leaf_bins: int = LEAF_BINS) -> InputReference:
    rng = np.random.default_rng(0)
    return InputReference(
        center=(0.0,) * 4,
        scale=(1.0,),
        basis=((1.0, 0.0, 0.0, 0.0),),
        pca_edges=(0.1, 0.2, 0.3),
        rule_label=tuple(int(v) for v in rng.integers(0, 10, 200)),
        rule_selected=tuple(bool(v) for v in rng.integers(0, 2, 200)),
        leaf_ref=tuple(float(v) for v in rng.dirichlet(np.ones(200))),
        class_conf=(0.9,) * 10,
        leaf_bins=leaf_bins,
    )


def _stats(ref: InputReference, seed: int, n: int = 400) -> WindowStats:
    rng = np.random.default_rng(seed)
    extras = SampleExtras(
        margin=rng.random(n),
        rules=rng.integers(0, ref.n_rules, n),
        agree=rng.random(n) < 0.8,
        covered=rng.random(n) < 0.5,
        pca_error=rng.random(n) * 0.4,
        label=rng.integers(0, 10, n),
    )
    out = WindowStats.of_samples(rng.integers(0, 4, n), rng.random(n), 0.7, extras, ref)
    out.add_class_sums(rng.dirichlet(np.ones(ref.n_classes), n), extras.label)
    return out


REF = _reference()
SCHEMA = StatSchema.of_reference(REF)


def _items(*stats: WindowStats) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in stats:
        for k, v in stat_items(s):
            out[k] = out.get(k, 0.0) + v
    return out


def test_the_windows_of_real_predictions_pass_and_come_back_whole() -> None:
    a, b = _stats(REF, 1), _stats(REF, 2)
    items = _items(a, b)
    assert set(items) <= SCHEMA.names
    got = SCHEMA.window(items, 1e6, "w")
    want = a + b
    assert (got.cbpe_n, got.cbpe_predicted) == (want.cbpe_n, want.cbpe_predicted) and got.cbpe_n == 800
    assert got.cbpe_support == pytest.approx(want.cbpe_support)
    assert (got.n, got.fails, got.cells, got.leaves, got.class_counts) == (
        want.n,
        want.fails,
        want.cells,
        want.leaves,
        want.class_counts,
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(fails=d["n"] + 1), "fails"),
        (lambda d: d.update(conf_sum=-1.0), "sum conf_sum is negative"),
        (lambda d: d.update(conf_sum=d["n"] * 1.5), "confidence sum exceeds n"),
        (lambda d: d.update(conf_sq_sum=d["conf_sum"] * 1.5), "squared confidences"),
        (lambda d: d.update(n=d["n"] + 0.5), "count n"),
        (lambda d: d.update({"cells:0": d["cells:0"] + 1}), "verdict cells"),
        (lambda d: d.update({"fails_by_family:idi": d["fails_by_family:idi"] + 1}), "failures by family"),
        (lambda d: d.update({"leaves:0": d["leaves:0"] + 1}), "leaf bins"),
        (lambda d: d.update({"pca_bins:0": d["pca_bins:0"] + 1}), "PCA error bins"),
        (lambda d: d.update({"class_counts:0": d["class_counts:0"] + 1}), "class counts"),
        (lambda d: d.update({"class_conf:3": d["class_counts:3"] + 5}), "class 3"),
        (lambda d: d.update(tdi_agree=d["n_ext"] + 1), "tdi_agree"),
        (lambda d: d.update(n_ext=d["n"] + 1), "n_ext"),
        (lambda d: d.update(cbpe_n=d["n"] + 1), "cbpe_n"),
        (lambda d: d.update({"cbpe_predicted:0": d["cbpe_predicted:0"] + 1}), "CBPE predictions per class"),
        (lambda d: d.update({"cbpe_true_positive:2": d["cbpe_predicted:2"] + 3}), "true positives of class 2"),
        (lambda d: d.update({"cbpe_support:1": d["cbpe_n"] + 5}), "expected supports"),
    ],
)
def test_a_window_no_predictions_can_have_is_refused(change: object, message: str) -> None:
    items = _items(_stats(REF, 3))
    change(items)  # type: ignore[operator]
    with pytest.raises(RefusedAnswer, match=message) as err:
        SCHEMA.window(items, 1e6, "version 1, window 5m")
    assert err.value.reason == "inconsistent" and "version 1, window 5m" in str(err.value)


def test_float_rounding_of_summed_totals_is_not_a_negative_sum() -> None:
    items = {**_items(_stats(REF, 4)), "pca_sum": -1e-7}
    assert SCHEMA.window(items, 1e6, "w").pca_sum == 0.0


def test_names_are_the_bundles_unknown_ones_ignored_and_indices_beyond_it_refused() -> None:
    assert SCHEMA.known("n") and SCHEMA.known("class_counts:9") and SCHEMA.known(f"leaves:{LEAF_BINS - 1}")
    assert not SCHEMA.known("a_statistic_of_newer_replicas") and not SCHEMA.known("fails_by_family:new")
    for stat in ("class_counts:10", "class_counts:100000000", "class_conf:x", f"leaves:{LEAF_BINS}", "cells:-1"):
        with pytest.raises(RefusedAnswer) as err:
            SCHEMA.known(stat)
        assert err.value.reason == "bad_stat", stat
    assert "export 10 of them" in str(pytest.raises(RefusedAnswer, SCHEMA.known, "class_counts:10").value)


@pytest.mark.parametrize(("stat", "value"), [("n", -1.0), ("n", 1e300), ("n", 2.5), ("conf_sum", 2.0**60)])
def test_counter_values_no_counter_can_hold_are_refused(stat: str, value: float) -> None:
    with pytest.raises(RefusedAnswer) as err:
        SCHEMA.check_value(stat, value)
    assert err.value.reason == "bad_value"
    SCHEMA.check_value("conf_sum", 2.5)  # a sum need not be whole


def test_bundles_before_the_leaf_bins_export_no_inputs_and_are_checked_against_n() -> None:
    old = _reference(leaf_bins=0)
    schema = StatSchema.of_reference(old)
    assert not schema.inputs and not any(k.startswith(("leaves", "pca_bins", "class_")) for k in schema.names)
    items = dict(stat_items(_stats(old, 5), inputs=False))  # n_ext exported as 0, tdi_agree as counted
    assert items["n_ext"] == 0 and items["tdi_agree"] > 0
    assert schema.window(items, 1e6, "w").n == items["n"]
    no_shift = StatSchema.of_reference(None)
    assert "pca_bins:0" in no_shift.names and not any(k.startswith(("leaves", "class_")) for k in no_shift.names)


def _settings(url: str) -> AgentSettings:
    return AgentSettings.model_validate(
        {"mode": "fleet", "model": {"name": "m"}, "bundle": {"path": "."}, "fleet": {"prometheus_url": url}}
    )


CAL = EstimatorCalibration.from_dict(
    {"tpr": 0.8, "fpr": 0.05, "n_wrong": 10, "n_right": 90, "accuracy": 0.9, "avg_conf": 0.9, "atc_threshold": 0.7}
)


def test_an_unreachable_api_is_counted_and_shown() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    ev = FleetEvaluator(_settings(url), CAL, "b", PrometheusAPI(url, 5))
    assert not ev.refresh()
    assert ev.errors["unreachable"] == 1 and ev.errors_total == 1 and set(ev.errors) == set(REASONS)
    assert ev.last_error_reason == "unreachable" and ev.last_error.startswith("unreachable: ")  # type: ignore[union-attr]
    assert ev.snapshot().errors["unreachable"] == 1 and ev.estimates()["fleet"]["query_errors"] == {"unreachable": 1}


class _FailingAPI(PrometheusAPI):
    """An API whose answers make the evaluator fail in a way no check foresaw (a bug)."""

    async def vector(self, expr: str, at: float) -> list[Sample]:
        raise ZeroDivisionError("a bug")


def test_an_exception_no_check_foresaw_is_counted_as_internal() -> None:
    ev = FleetEvaluator(_settings("http://127.0.0.1:1"), CAL, "b", _FailingAPI("http://127.0.0.1:1", 5))
    assert not ev.refresh()
    assert ev.errors["internal"] == 1 and ev.last_error == "internal: ZeroDivisionError: a bug"


def test_a_schema_is_built_from_a_calibration_without_shift_part() -> None:
    assert StatSchema.of_bundle(CAL) == StatSchema.of_reference(None)
    # the model's classes size its per-class sums (the replicas export them up to their class cap)
    three = StatSchema.of_bundle(CAL, 3)
    assert three.known("cbpe_support:2") and "cbpe_predicted:2" in three.counts
    with pytest.raises(RefusedAnswer) as err:
        three.known("cbpe_support:3")
    assert err.value.reason == "bad_stat"
