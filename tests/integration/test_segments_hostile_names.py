"""Segment names made of hostile data: a real scikit-learn table model (exported with skl2onnx) whose categorical
values and class names hold quotes, backslashes, newlines, ``</script>``, braces and 10,000-character strings,
fitted through the command line and served by a real agent (uvicorn). The segments stay bounded in count
(``max_segments``, the category cap) and length (``MAX_NAME``, ``MAX_LABEL``, distinct labels); ``/metrics``
parses with prometheus_client's own parser, ``/v1/estimates`` is strict JSON, and the demo report's HTML holds
the names as text only."""

from __future__ import annotations

import json
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from agent.cli import main as cli_main
from agent.config.settings import load_settings
from agent.estimation.segments.segmentation import MAX_LABEL, MAX_NAME, segmentation_or_none
from agent.server.app import create_app
from invariants.bundle import Bundle
from tests.support.inprocess import RunningServer
from tests.support.waiting import poll

LONG = "x" * 10_000
SCRIPT = "</script><script>alert(1)</script>"
HOSTILE = [
    'say "hi"',
    "back\\slash",
    "new\nline",
    SCRIPT,
    "{}{{x}}",
    LONG,
    LONG[:-1] + "y",
]
#: the class names (six of the hostile strings) and the categories (all of them, and plain ones up to the
#: category cap of a table view, 32)
CLASSES = HOSTILE[:6]
VALUES = [*HOSTILE, *(f"v{i}" for i in range(25))]
MAX_SEGMENTS = 24


def _rows(n: int, rng: np.random.Generator) -> Any:
    import pandas as pd

    p = np.array([0.09] * len(HOSTILE) + [0.37 / (len(VALUES) - len(HOSTILE))] * (len(VALUES) - len(HOSTILE)))
    kind = np.array(VALUES, dtype=object)[rng.choice(len(VALUES), n, p=p / p.sum())]  # the hostile ones first
    kind[: len(VALUES)] = VALUES
    x = rng.normal(0, 1, n).astype(np.float32)
    index = np.array([VALUES.index(k) for k in kind])
    y = np.array(CLASSES, dtype=object)[(index + (x > 0) * 3 + rng.integers(0, 2, n)) % len(CLASSES)]
    return pd.DataFrame({"kind": kind, "x": x}), y


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The model (``kind``: string, ``x``: float; ZipMap of the class names) and its bundle."""
    from skl2onnx import to_onnx
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder

    root = tmp_path_factory.mktemp("hostile-names")
    rng = np.random.default_rng(0)
    train, y = _rows(1200, rng)
    pre = ColumnTransformer([("c", OneHotEncoder(handle_unknown="ignore"), ["kind"]), ("n", "passthrough", ["x"])])
    pipe = Pipeline([("pre", pre), ("clf", LogisticRegression(max_iter=300))]).fit(train, y)
    model = root / "model.onnx"
    model.write_bytes(to_onnx(pipe, train[:1]).SerializeToString())
    train.assign(label=y).to_csv(root / "train.csv", index=False)
    val, val_y = _rows(600, rng)
    val.assign(label=val_y).to_csv(root / "val.csv", index=False)
    bundle = root / "bundle"
    argv = ["fit", "--model", str(model), "--train", str(root / "train.csv"), "--val", str(root / "val.csv")]
    argv += ["--label-column", "label", "--trees", "10", "--max-segments", str(MAX_SEGMENTS)]
    assert cli_main([*argv, "--out", str(bundle), "--json"]) == 0
    return {"model": model, "bundle": bundle, "val": root / "val.csv"}


def test_segments_made_of_hostile_data_are_bounded(fitted: dict[str, Path]) -> None:
    bundle = Bundle.load(fitted["bundle"])
    assert bundle.classes == sorted(CLASSES)  # the class names reach the bundle as they are (sklearn's order)
    segments = segmentation_or_none(bundle.estimator_calibration.get("segments"))
    assert segments is not None
    kinds = {d.kind for d in segments.dimensions}
    assert {"predicted", "column"} <= kinds, kinds
    assert segments.size <= MAX_SEGMENTS
    names, labels = segments.names(), segments.labels()
    assert all(len(n) <= MAX_NAME and "\n" not in n for n in names)
    assert all(len(d.name) <= MAX_NAME for d in segments.dimensions)
    assert len(set(names)) == len(names)
    assert all(len(label) <= MAX_LABEL and "\n" not in label for label in labels)
    assert len(set(labels)) == len(labels)  # the two long names cut alike keep two labels
    column = next(d for d in segments.dimensions if d.kind == "column")
    # the most frequent categories are the hostile ones: six of them have a segment of their own, as text (each
    # surface escapes for itself), on one line, cut where long
    shown = [" ".join(h.split())[:100] for h in HOSTILE]
    assert sum(any(n.startswith("kind=" + h) for h in shown) for n in column.segments) == 6, column.segments


def _request(frame: Any) -> dict[str, Any]:
    n = len(frame)
    return {
        "inputs": [
            {"name": "kind", "datatype": "BYTES", "shape": [n, 1], "data": [str(v) for v in frame["kind"]]},
            {"name": "x", "datatype": "FP32", "shape": [n, 1], "data": [float(v) for v in frame["x"]]},
        ]
    }


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_hostile_segment_names_are_escaped_in_metrics_json_and_html(
    fitted: dict[str, Path], run_server: Callable[..., RunningServer], tmp_path: Path
) -> None:
    import pandas as pd

    from agent.demo.record import DemoRecord, PhaseStats, TracePoint
    from agent.demo.report import write_report
    from agent.results.served import TopSegment

    settings = load_settings(
        None,
        mode="serve",
        model={"name": "hostile", "path": str(fitted["model"])},
        bundle={"path": str(fitted["bundle"])},
        labels={"enabled": False},
        state_dir=str(tmp_path / "state"),
    )
    srv = run_server(create_app(settings, CollectorRegistry()))
    frame = pd.read_csv(fitted["val"], keep_default_na=False)
    for start in range(0, len(frame), 100):
        r = httpx.post(f"{srv.url}/v2/models/hostile/infer", json=_request(frame[start : start + 100]), timeout=60)
        assert r.status_code == 200, r.text[:300]
    body = poll(
        lambda: (
            (b := httpx.get(f"{srv.url}/v1/estimates", timeout=30)).status_code == 200
            and json.loads(b.content)["windows"]["5m"]["n"] == len(frame)
            and b
        ),
        timeout=60,
        what="every prediction in the window",
    )
    doc = json.loads(body.content, parse_constant=lambda c: pytest.fail(f"{c} in /v1/estimates"))
    rows = doc["windows"]["5m"]["segments"]
    assert rows and all(len(r["name"]) <= MAX_NAME for r in rows)
    assert any(SCRIPT in r["name"] for r in rows)

    text = httpx.get(f"{srv.url}/metrics", timeout=30).text
    families = list(text_string_to_metric_families(text))  # raises on a line it cannot parse
    segment_labels = {s.labels["segment"] for f in families for s in f.samples if "segment" in s.labels}
    expected = set(segmentation_or_none(Bundle.load(fitted["bundle"]).estimator_calibration["segments"]).labels())
    assert segment_labels == expected
    class_labels = {s.labels["class"] for f in families for s in f.samples if "class" in s.labels}
    assert all(len(c) <= MAX_LABEL for c in class_labels), sorted(len(c) for c in class_labels)

    # the demo report, with these names as the phase's drop
    hostile = next(r["name"] for r in rows if SCRIPT in r["name"])  # the class name, whole
    top = TopSegment.of_rows([{**rows[0], "contribution": 0.1, "name": hostile}])
    record = DemoRecord(window="count", window_size=100, headline="atc", estimators=["atc"])
    record.phases.append(PhaseStats("a", '<marquee>"phase"</marquee>', "</script>{}", len(frame), drop=top))
    record.trace += [TracePoint(k, 0, 0.5, {"atc": (0.5, 0.4, 0.6)}) for k in (100, 200)]
    html = write_report(record, tmp_path / "report", [("run", "echo '</script>'")]).read_text(encoding="utf-8")
    parsed = _Tags()
    parsed.feed(html)
    assert "script" not in parsed.tags and "marquee" not in parsed.tags
    assert any(SCRIPT in t for t in parsed.text) and any('<marquee>"phase"' in t for t in parsed.text)  # as text
