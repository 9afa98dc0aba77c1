"""Label Studio's formats as ``icos-agent labels export`` / ``import`` read and write them: which
annotation gives a task's label, the mistakes an export file can hold, the PNG and kinds of inputs."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from agent.cli import main as cli_main
from agent.commands.label_studio import as_image, export_tasks, labels_of_export, png
from agent.errors import UserError

CLASSES = ["cat", "dog"]


def task(pid: str, *annotations: dict[str, Any]) -> dict[str, Any]:
    return {"id": 1, "data": {"icos_id": pid}, "annotations": list(annotations)}


def ann(choice: str, at: str, cancelled: bool = False, ident: int = 1) -> dict[str, Any]:
    result = [] if cancelled else [{"from_name": "label", "type": "choices", "value": {"choices": [choice]}}]
    return {"id": ident, "result": result, "was_cancelled": cancelled, "created_at": at, "updated_at": at}


def test_the_newest_annotation_wins_and_skipped_ones_are_ignored() -> None:
    tasks = [
        task("a:0", ann("cat", "2026-01-01T10:00:00Z"), ann("dog", "2026-01-02T10:00:00Z", ident=2)),
        task("a:1", ann("dog", "2026-01-01T10:00:00Z"), ann("cat", "2026-01-03T10:00:00Z", cancelled=True)),
        # times in other offsets and precisions compare as times, not as texts
        task("a:6", ann("dog", "2026-01-01T11:00:00+02:00", ident=9), ann("cat", "2026-01-01T09:30:00.5Z", ident=1)),
        task("a:2", ann("cat", "2026-01-01T10:00:00Z", cancelled=True)),
        task("a:3"),
        # the same time: the higher id is the newer; an id that is not a number counts as the oldest
        task("a:4", ann("cat", "2026-01-01T10:00:00Z", ident=5), ann("dog", "2026-01-01T10:00:00Z", ident=4)),
        task("a:5", {**ann("dog", "2026-01-01T10:00:00Z"), "id": "x"}, ann("cat", "2026-01-01T10:00:00Z", ident=0)),
    ]
    labels, counts = labels_of_export(tasks, CLASSES)
    assert labels == [
        {"id": "a:0", "label": "dog"},
        {"id": "a:1", "label": "dog"},
        {"id": "a:6", "label": "cat"},
        {"id": "a:4", "label": "cat"},
        {"id": "a:5", "label": "cat"},
    ]
    assert counts == {"labeled": 5, "without_annotation": 2}


@pytest.mark.parametrize(
    ("exported", "message"),
    [
        ({"tasks": []}, "expected a list of tasks"),
        ([{"data": {"image": "x.png"}, "id": 7}], "task 0 (id 7) has no data.icos_id"),
        ([task("a:0", ann("wolf", "t")), task("a:1", ann("cow", "t"))], "'wolf', 'cow'"),
        ([task("a:0", {"id": 1, "result": [{"type": "choices", "value": {"choices": ["cat", "dog"]}}]})], "2 choices"),
    ],
)
def test_mistakes_in_an_export_are_named(exported: object, message: str) -> None:
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        labels_of_export(exported, CLASSES)


def test_import_refuses_a_file_that_is_not_json_before_reaching_any_agent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "export.json"
    bad.write_text("not json")
    assert cli_main(["labels", "import", str(bad), "--url", "http://127.0.0.1:9"]) != 0
    assert "not JSON" in capsys.readouterr().err


def test_png_holds_the_image() -> None:
    rgb = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(png(rgb)))), rgb)
    chw = np.zeros((3, 5, 6), np.float32)
    shown = as_image({"x": chw}, None)
    assert shown is not None and shown.shape == (5, 6, 3)
    assert as_image({"x": np.zeros(64, np.float32)}, None) is None  # a vector is a table row...
    flat = as_image({"x": np.zeros(64, np.float32)}, (8, 8))  # ...unless reshaped
    assert flat is not None and flat.shape == (8, 8)
    with pytest.raises(UserError, match="does not fit"):
        as_image({"x": np.zeros(63, np.float32)}, (8, 8))


def test_predictions_without_kept_inputs_are_counted_not_exported(tmp_path: Path) -> None:
    listing = {"classes": CLASSES, "requests": [{"id": "a:0", "timestamp": 1.0, "inputs": None}]}
    assert export_tasks(listing, tmp_path) == {"tasks": 0, "without_inputs": 1, "kind": "image", "out": str(tmp_path)}
    assert json.loads((tmp_path / "tasks.json").read_text()) == []
    assert '<Choice value="dog"/>' in (tmp_path / "labeling_config.xml").read_text()
