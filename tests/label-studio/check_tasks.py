"""Run by build/label-studio-venv's Python (label-studio-sdk pins numpy below the agent's): checks
exported tasks against Label Studio's own types and writes annotation exports the way Label Studio does.

    check_tasks.py validate DIR                 → {"tasks": n, "errors": [...]} on stdout
    check_tasks.py annotate DIR ANSWERS OUT     ANSWERS: {"<icos_id>": [{"choice", "cancelled", "at"}]}
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path
from typing import Any

from label_studio_sdk.label_interface import LabelInterface
from label_studio_sdk.types import Annotation, ImportApiRequest, Prediction


def interface(folder: Path) -> LabelInterface:
    return LabelInterface((folder / "labeling_config.xml").read_text(encoding="utf-8"))


def validate(folder: Path) -> dict[str, Any]:
    li = interface(folder)
    tasks = json.loads((folder / "tasks.json").read_text(encoding="utf-8"))
    errors: list[str] = []
    for n, task in enumerate(tasks):
        try:
            # a prediction inside an imported task takes the task it is imported with: the API types want its id
            preds = [{**p, "task": n} for p in task.get("predictions", [])]
            ImportApiRequest.model_validate({"data": task["data"], "predictions": preds})
            for p in preds:
                Prediction.model_validate(p)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            errors.append(f"task {n}: {exc}")
            continue
        # the data alone: validate_task of 2.1.2 calls validate_prediction without the prediction
        if not li.validate_task({"data": task["data"]}):
            errors.append(f"task {n}: does not match the labeling config")
        for p in task.get("predictions", []):
            if not li.validate_prediction(p):
                errors.append(f"task {n}: prediction {p} does not match the labeling config")
        for key, value in task["data"].items():
            if key == "image" and not value.startswith("data:image/png;base64,"):
                path = folder / value.split("?d=", 1)[-1]
                if not path.is_file():
                    errors.append(f"task {n}: no image file {path}")
    return {"tasks": len(tasks), "errors": errors, "objects": sorted(o.tag for o in li.objects)}


def annotate(folder: Path, answers: dict[str, list[dict[str, Any]]], out: Path) -> None:
    li = interface(folder)
    tasks = json.loads((folder / "tasks.json").read_text(encoding="utf-8"))
    exported: list[dict[str, Any]] = []
    next_id = 1
    for task_id, task in enumerate(tasks, 1):
        annotations = []
        for a in answers.get(task["data"]["icos_id"], []):
            at = datetime.datetime.fromtimestamp(a["at"], tz=datetime.UTC)
            regions = [] if a["cancelled"] else li.create_regions({"label": a["choice"]})
            result = [json.loads(r.to_json()) for r in regions]
            ann = Annotation(
                id=next_id,
                task=task_id,
                result=result,
                was_cancelled=a["cancelled"],
                created_at=at,
                updated_at=at,
                completed_by=1,
                ground_truth=False,
                lead_time=1.5,
            )
            if not a["cancelled"]:
                assert li.validate_annotation(ann.model_dump(mode="json")), ann
            annotations.append(ann.model_dump(mode="json", exclude_none=True))
            next_id += 1
        exported.append(
            {
                "id": task_id,
                "data": task["data"],
                "annotations": annotations,
                "predictions": task.get("predictions", []),
            }
        )
    out.write_text(json.dumps(exported), encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1] == "validate":
        print(json.dumps(validate(Path(sys.argv[2]))))
    else:
        annotate(Path(sys.argv[2]), json.loads(Path(sys.argv[3]).read_text()), Path(sys.argv[4]))
