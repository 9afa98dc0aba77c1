"""``icos_agent`` in a notebook: ``fit`` from a data frame writes a bundle that ``load`` reads back to the same
estimates; ``estimate`` over a frame, arrays, a CSV, a Parquet file, a ``.npz`` and a lake gives what ``icos-agent
check`` gives over the same rows; windows of time and of rows; the data frames, figures and the HTML page; the
challenger's windows against ``check --challenger``; and ``icos-agent estimate-lake`` against ``check``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import icos_agent
from agent.cli import main
from agent.data.datasets import Splits
from agent.data.frame_rows import FrameRows, rebatched
from agent.errors import UserError
from agent.model.classifier import default_model_path
from agent.offline.lake import lake_batches, lake_files
from invariants.fit_params import CalibrationPlan
from tests.support.challenger import CHALLENGER_MODEL
from tests.support.digits import digits

COMPARED = ("estimates", "headline_estimate", "trust", "verdicts", "truth", "oracle", "segments", "segment_drop")


def _close(a: Any, b: Any, where: str = "") -> None:
    """Equal documents, numbers within 1e-9."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), where
        for k in a:
            _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and not isinstance(a, bool):
        assert b == pytest.approx(a, abs=1e-9), where
    else:
        assert a == b, where


def _frame(rows: slice) -> pd.DataFrame:
    x, y = digits()
    frame = pd.DataFrame(x[rows], columns=[f"px{i}" for i in range(64)])
    frame["label"] = y[rows]
    return frame


@pytest.fixture(scope="module")
def digits_bundle(digits_logreg: dict[str, Path]) -> icos_agent.Bundle:
    return icos_agent.load(digits_logreg["bundle"], model=digits_logreg["model"])


def _check_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_fit_from_a_frame_saves_a_bundle_that_loads_to_the_same_estimates(tmp_path: Path) -> None:
    from skl2onnx import to_onnx
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression

    x, y = make_classification(n_samples=1000, n_features=5, n_informative=3, flip_y=0.1, random_state=5)
    x = x.astype(np.float32)
    clf = LogisticRegression().fit(x[:400], y[:400])
    onnx = to_onnx(clf, x[:1], options={id(clf): {"zipmap": False}}, target_opset={"": 17, "ai.onnx.ml": 3})
    (tmp_path / "m.onnx").write_bytes(onnx.SerializeToString())
    train = pd.DataFrame(x[:400], columns=list("abcde")).assign(y=y[:400])
    plan = CalibrationPlan(shift_windows=300, clean_windows=40, windows_per_kind=3, bootstrap=20, min_fold_rows=20)
    with pytest.raises(UserError, match="unknown option"):
        icos_agent.fit(tmp_path / "m.onnx", (train, "y"), (x[400:800], y[400:800]), tree=3)
    bundle = icos_agent.fit(
        tmp_path / "m.onnx", (train, "y"), (x[400:800], y[400:800]), trees=10, shift_sets=12, plan=plan, progress=False
    )
    assert bundle.invariants.fit_params["n_estimators"] == 10
    assert bundle.invariants.feature_names == list("abcde")  # the frame's columns, as fit names a table's
    bundle.save(tmp_path / "bundle")
    again = icos_agent.load(tmp_path / "bundle", model=tmp_path / "m.onnx")
    live = pd.DataFrame(x[800:], columns=list("abcde")).assign(y=y[800:])
    first = bundle.estimate(live, window=50, labels="y", progress=False).to_df()
    pd.testing.assert_frame_equal(first, again.estimate(live, window=50, labels="y", progress=False).to_df())
    assert first["n"].tolist() == [50, 50, 50, 50] and first["window_start"].tolist() == [0, 50, 100, 150]
    predicted = np.argmax(clf.predict_proba(x[800:]), axis=1)
    expected = [(predicted[i : i + 50] == y[800 + i : 850 + i]).mean() for i in range(0, 200, 50)]
    assert first["realized"].to_numpy() == pytest.approx(expected)


def test_estimate_over_every_kind_of_data_is_checks_report(
    digits_bundle: icos_agent.Bundle, digits_logreg: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    frame = _frame(slice(1400, 1797))
    frame.to_csv(tmp_path / "live.csv", index=False)
    frame.to_parquet(tmp_path / "live.parquet", index=False)
    x, y = frame.drop(columns=["label"]).to_numpy(np.float32), frame["label"].to_numpy()
    np.savez(tmp_path / "live.npz", x=x, y=y)
    check = _check_json(
        capsys,
        ["check", "--model", str(digits_logreg["model"]), "--bundle", str(digits_logreg["bundle"])]
        + ["--data", str(tmp_path / "live.parquet"), "--label-column", "label"],
    )
    given: list[tuple[Any, Any]] = [
        (frame, "label"),
        (x, y),
        (tmp_path / "live.csv", "label"),
        (str(tmp_path / "live.parquet"), "label"),
        (tmp_path / "live.npz", "y"),
        (iter([frame.iloc[:100], frame.iloc[100:]]), "label"),
    ]
    for data, labels in given:
        report = digits_bundle.estimate(data, labels=labels, batch_rows=128, progress=False).report()
        assert report["n"] == check["n"] == len(frame)
        _close({k: check[k] for k in COMPARED}, {k: report[k] for k in COMPARED}, type(data).__name__)


def test_time_windows_and_what_each_row_says(digits_bundle: icos_agent.Bundle) -> None:
    frame = _frame(slice(1400, 1700))
    frame["ts"] = pd.Timestamp("2026-02-01 09:30", tz="UTC") + pd.to_timedelta(np.arange(300) * 30, unit="s")
    est = digits_bundle.estimate(frame, timestamp="ts", window="1h", labels="label", progress=False)
    df = est.to_df()
    starts = pd.to_datetime(["2026-02-01 09:00", "2026-02-01 10:00", "2026-02-01 11:00"], utc=True)
    assert df["window_start"].tolist() == starts.tolist() and df["n"].tolist() == [60, 120, 120]
    assert (df["window_end"] - df["window_start"] == pd.Timedelta("1h")).all()
    for col in ("value", "lower", "upper", "realized", "flag_raised", "flag_reasons", "alert", "cbpe_value"):
        assert col in df.columns, col
    assert (df["lower"] <= df["value"]).all() and (df["value"] <= df["upper"]).all()
    report = est.report()
    for row, window in zip(df.itertuples(), report["windows"], strict=True):
        assert row.flag_raised is (not window["trust"]["calibrated"])
        assert row.flag_reasons == ";".join(window["trust"]["reasons"])
        assert row.realized == pytest.approx(window["truth"]["accuracy"])
        assert row.alert is bool(row.value + 0.05 < row.reference_accuracy and row.upper < row.reference_accuracy)
    assert df["reference_accuracy"].iloc[0] == pytest.approx(est.windowed.calibration.accuracy)
    segments = est.segments_df()
    assert set(segments["window_start"]) == set(df["window_start"])
    assert segments.groupby("window_start")["rank"].min().tolist() == [1, 1, 1]
    with pytest.raises(UserError, match="timestamps"):
        digits_bundle.estimate(frame.drop(columns=["ts"]), window="1h", labels="label", progress=False)


def test_segments_say_what_changed_and_whether_across_the_traffic(digits_bundle: icos_agent.Bundle) -> None:
    """``segments_df`` says, without labels, which segments' inputs changed and which inputs moved, and whether the
    window's change is across the traffic. Half the bundle's own validation rows: nothing changed. The digits after
    them, written by other hands: a few segments changed, ranked first, where the labels say the model lost
    accuracy that no label-free estimate shows. Every image inverted in its pixel range: across the traffic."""
    same = digits_bundle.estimate(_frame(slice(900, 1400, 2)), labels="label", progress=False)
    clean = same.segments_df(every_row=True)
    for col in ("changed", "change_score", "changed_columns", "status", "shares_moved", "widespread"):
        assert col in clean.columns, col
    assert not clean["changed"].any() and not clean["widespread"].any() and not clean["shares_moved"].any()
    assert set(clean["status"]) <= {"ok", "dropping"}
    assert (clean["change_score"] == 0).all() and (clean["changed_columns"] == "").all()

    frame = _frame(slice(1400, 1797))
    later = digits_bundle.estimate(frame, labels="label", progress=False).segments_df(every_row=True)
    changed, rest = later[later["changed"]], later[~later["changed"]]
    assert 0 < len(changed) < len(later) and not later["widespread"].any()
    assert changed["rank"].max() < rest["rank"].min()
    assert (changed["change_score"] > 0).all() and (changed["changed_columns"] != "").all()
    assert set(changed["status"]) <= {"changed", "changed_cost_unknown", "dropping"}
    assert (later.groupby("dimension")["shares_moved"].nunique() == 1).all()
    lost = np.average(changed["reference_accuracy"] - changed["truth_accuracy"], weights=changed["n"])
    unseen = np.average(changed["reference_accuracy"] - changed["value"], weights=changed["n"])
    assert lost > 0.03 and unseen < lost / 2, (lost, unseen)

    inverted = frame.copy()
    pixels = [c for c in frame.columns if c.startswith("px")]
    inverted[pixels] = 16.0 - inverted[pixels]
    moved = digits_bundle.estimate(inverted, labels="label", progress=False).segments_df(every_row=True)
    assert moved["widespread"].all() and moved["changed"].iloc[0]
    changed = moved[moved["changed"]]
    assert (changed["change_score"] > 0).all() and (changed["changed_columns"] != "").all()


def test_figures_and_the_page_fetch_nothing(digits_bundle: icos_agent.Bundle, tmp_path: Path) -> None:
    frame = _frame(slice(1400, 1600))
    est = digits_bundle.estimate(frame, window=50, labels="label", progress=False)
    for kind in ("accuracy", "segments"):
        fig = est.plot(kind)
        assert fig.axes and fig.axes[0].get_title()
    with pytest.raises(UserError, match="no challenger"):
        est.plot("challenger")
    with pytest.raises(UserError, match="plot kind"):
        est.plot("roc")
    page = est.save_html(tmp_path / "report.html").read_text(encoding="utf-8")
    assert page.count('src="data:image/png;base64,') == 2
    assert "<script" not in page and "http://" not in page and "https://" not in page


def test_lake_batches_are_bounded_and_estimate_lake_is_check(
    digits_logreg: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    frame = _frame(slice(1400, 1797))
    lake = tmp_path / "lake" / "day=1"
    lake.mkdir(parents=True)
    for i, (a, b) in enumerate([(0, 150), (150, 151), (151, 397)]):
        frame.iloc[a:b].to_parquet(lake / f"part-{i}.parquet", index=False, row_group_size=40)
    (lake / "_SUCCESS").write_text("")
    frame.to_parquet(tmp_path / "all.parquet", index=False)
    files = lake_files(tmp_path / "lake")
    assert [f.name for f in files] == ["part-0.parquet", "part-1.parquet", "part-2.parquet"]
    assert lake_files(str(tmp_path / "lake" / "*" / "*.parquet")) == files
    batches: list[FrameRows] = list(lake_batches(files, ["x"], label_column="label", batch_rows=25))
    assert max(len(b) for b in batches) <= 25 and sum(len(b) for b in batches) == len(frame)
    assert [len(b) for b in rebatched(iter(batches), 100)] == [100, 100, 100, 97]
    model = ["--model", str(digits_logreg["model"]), "--bundle", str(digits_logreg["bundle"])]
    check = _check_json(capsys, ["check", *model, "--data", str(tmp_path / "all.parquet"), "--label-column", "label"])
    argv = ["estimate-lake", *model, "--data", str(tmp_path / "lake"), "--label-column", "label"]
    lake_report = _check_json(capsys, [*argv, "--batch-rows", "64", "--window", "100"])
    _close({k: check[k] for k in COMPARED}, {k: lake_report[k] for k in COMPARED})
    assert lake_report["files"] == 3 and [w["n"] for w in lake_report["windows"]] == [100, 100, 100, 97]
    assert main([*argv, "--window", "1h"]) == 2
    assert "needs --timestamp" in capsys.readouterr().err


def test_the_challengers_windows_are_check_challengers(
    mnist_bundle_dir: Path, challenger_bundle_dir: Path, mnist_splits: Splits, tmp_path: Path
) -> None:
    from agent.model.classifier import OnnxClassifier
    from agent.offline.check import check_report
    from agent.offline.paired_check import ChallengerCheck
    from invariants.bundle import Bundle

    champion = icos_agent.load(mnist_bundle_dir, model=default_model_path())
    challenger = icos_agent.load(challenger_bundle_dir, model=CHALLENGER_MODEL)
    x, y = mnist_splits.test.x[:400], mnist_splits.test.y[:400]
    est = champion.estimate(x, labels=y, challenger=challenger, progress=False)
    rows = est.challenger_df()
    assert len(rows) == 1
    model = OnnxClassifier.load(CHALLENGER_MODEL)
    bundle = Bundle.load(challenger_bundle_dir)
    model.decision_threshold = bundle.decision_threshold
    from agent.data.files import Dataset

    report = check_report(
        champion.model,
        champion.invariants,
        Dataset(x, y),
        companions=[ChallengerCheck(model, bundle, str(challenger_bundle_dir))],
    )["challenger"]
    row = rows.iloc[0]
    assert row["n"] == 400 and row["disagreements"] == report["disagreements"]
    assert row["value"] == pytest.approx(report["difference"]["value"], abs=1e-9)
    assert row["realized"] == pytest.approx(report["truth"]["difference"], abs=1e-12)
    windows = champion.estimate(x, window=100, challenger=challenger, progress=False).challenger_df()
    assert windows["n"].tolist() == [100, 100, 100, 100]
    assert "challenger" in est.plot("challenger").axes[0].get_title().lower()
