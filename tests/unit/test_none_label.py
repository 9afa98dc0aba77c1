"""Labels of inputs that belong to none of the model's classes: one spelling, ``"__none__"``, counted as wrong,
reported as their own share."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agent.commands.label_studio import NONE_CHOICE, labeling_config, labels_of_export
from agent.core.label_values import NONE_INDEX, NONE_LABEL
from agent.data.files import label_indices
from agent.data.limits import DataError
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.statistics.class_metrics import realized_class_metrics
from agent.labels.intake import parse_labels, resolve_label
from agent.labels.realized import realized_window
from agent.labels.rows import LabeledRows, onehot_errors
from exporters.label_metrics import RealizedCollector, RealizedPoint, RealizedSnapshot

CAL = EstimatorCalibration(tpr=0.6, fpr=0.05, n_wrong=100, n_right=900, accuracy=0.9, avg_conf=0.92, atc_threshold=0.7)


def test_the_api_takes_none_of_the_classes_and_a_class_of_that_name_wins() -> None:
    assert resolve_label(NONE_LABEL, ["cat", "dog"]) == NONE_INDEX
    assert resolve_label(NONE_LABEL, ["cat", NONE_LABEL]) == 1
    parsed = parse_labels({"labels": [{"id": "a:0", "label": "__none__"}, {"id": "a:1", "label": "none"}]}, ["cat"], 10)
    assert parsed.labels == [("a:0", NONE_INDEX)] and parsed.invalid == 1
    assert "'__none__' (none of the model's classes)" in parsed.problems[0]["error"]


def test_check_reads_it_and_fit_refuses_it() -> None:
    y = np.array(["cat", "__none__", "dog"])
    assert label_indices(y, ["cat", "dog"], allow_none=True).tolist() == [0, NONE_INDEX, 1]
    with pytest.raises(DataError, match="is for check, not fit"):
        label_indices(y, ["cat", "dog"])


def test_a_none_label_is_wrong_for_accuracy_and_a_false_positive_of_the_class_predicted() -> None:
    """Predictions 0, 0, 1, 1 with truths 0, none, 1, none: class 0's precision 1/2, recall 1/1; class 1's the
    same; the none labels are no class's support."""
    m = realized_class_metrics(np.array([0, NONE_INDEX, 1, NONE_INDEX]), np.array([0, 0, 1, 1]), 2, ["a", "b"])
    for c in ("a", "b"):
        assert m["per_class"][c]["precision"] == 0.5 and m["per_class"][c]["recall"] == 1.0
        assert m["per_class"][c]["support"] == 1.0
    # against the one-hot truth a none label is all zeros: the whole probability is error
    assert onehot_errors(np.array([0.7, 0.3]), NONE_INDEX) == pytest.approx((1.0, 0.58))


def test_the_realized_window_reports_the_none_share() -> None:
    n = 10
    label = np.array([0, 1, NONE_INDEX, NONE_INDEX, 0, 1, 0, 1, NONE_INDEX, 0])
    predicted = np.array([0, 1, 0, 1, 0, 1, 1, 1, 0, 0])
    rows = LabeledRows(
        timestamp=np.arange(n, dtype=np.float64),
        verdict=np.zeros(n, np.int8),
        confidence=np.full(n, 0.9),
        correct=predicted == label,
        abs_err=np.zeros(n),
        sq_err=np.zeros(n),
        n_classes=np.full(n, 2),
        predicted=predicted,
        label=label,
    )
    w = realized_window(rows, CAL, ["a", "b"])
    assert w is not None and w.correct == 6 and w.accuracy.value == 0.6
    assert w.none_of_the_classes == 3 and w.to_dict()["none_of_the_classes"] == {"n": 3, "share": 0.3}
    reg = CollectorRegistry()
    reg.register(RealizedCollector(lambda: RealizedSnapshot("m", "1", [RealizedPoint("1h", n, 0.6, none_share=0.3)])))
    assert 'icos_realized_none_ratio{model="m",version="1",window="1h"} 0.3' in generate_latest(reg).decode()


def test_label_studio_offers_the_choice_and_imports_it() -> None:
    config = labeling_config("image", ["cat", "dog"])
    assert f'<Choice value="{NONE_CHOICE}" alias="__none__"/>' in config
    assert "alias" not in labeling_config("image", ["cat", "__none__"])  # a class of that name is the class
    tasks = [
        {"data": {"icos_id": f"a:{i}"}, "annotations": [{"result": [{"type": "choices", "value": {"choices": [c]}}]}]}
        for i, c in enumerate(["__none__", NONE_CHOICE, "dog"])
    ]
    labels, counts = labels_of_export(tasks, ["cat", "dog"])
    assert [x["label"] for x in labels] == ["__none__", "__none__", "dog"] and counts["labeled"] == 3
