"""The demo's invariants: load the bundle cached in the state directory, or fit it (as
``icos-agent fit`` does) and describe the fit for the MLflow run."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.data.datasets import Splits
from agent.data.files import Dataset
from agent.model.classifier import OnnxClassifier
from agent.offline.fit import fit_bundle
from invariants.bundle import Bundle, BundleError
from invariants.fit_params import MODEL, FitParams

BUNDLE_DIR = "bundle"
FIT_SUMMARY = "fit-summary.json"


@dataclass
class FitOutcome:
    """The bundle, whether it was fitted in this run, and the fit's summary (as ``fit --json``)."""

    bundle: Bundle
    bundle_dir: Path
    fitted: bool
    summary: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    started_at: float = 0.0
    finished_at: float = 0.0


def load_or_fit(
    model: OnnxClassifier,
    splits: Splits,
    state_dir: Path,
    *,
    refit: bool,
    seed: int,
    say: Callable[[str], None],
) -> FitOutcome:
    """The bundle in ``<state_dir>/bundle`` if it fits ``model``, else a new fit saved there."""
    bundle_dir = state_dir / BUNDLE_DIR
    summary_path = state_dir / FIT_SUMMARY
    if not refit and (bundle_dir / "manifest.json").exists():
        try:
            bundle = Bundle.load(bundle_dir, expected_model_sha256=model.sha256)
        except BundleError as exc:
            print(f"the bundle in {bundle_dir} is not usable ({exc}); fitting again", file=sys.stderr)
        else:
            saved: dict[str, Any] = {}
            if summary_path.exists():
                saved = json.loads(summary_path.read_text(encoding="utf-8"))
            say(f"invariants loaded from {bundle_dir} (fitted earlier; --refit fits them again)")
            return FitOutcome(
                bundle,
                bundle_dir,
                False,
                saved.get("summary", {}),
                saved.get("params", {}),
                float(saved.get("started_at", 0.0)),
                float(saved.get("finished_at", 0.0)),
            )
    say("fitting the invariants: TDI on 2,500 training images, ADI + calibration on 1,500 validation images")
    started = time.time()
    fit_params = FitParams(seed=seed)  # icos-agent fit's defaults
    report = fit_bundle(
        model,
        Dataset(splits.train.x, splits.train.y),
        Dataset(splits.val.x, splits.val.y),
        params=fit_params,
        progress=lambda m: say(f"  {m}"),
    )
    report.bundle.save(bundle_dir)
    finished = time.time()
    cal = report.bundle.calibration
    summary = {
        "bundle": str(bundle_dir),
        "model_sha256": model.sha256,
        "train_accuracy": report.train_accuracy,
        "val_accuracy": report.val_accuracy,
        "tdi_rules": report.n_rules,
        "tdi_selected": report.n_selected,
        "tdi_coverage_val": report.coverage,
        "idi_rules": 0,
        "calibration": {"tpr": cal.tpr, "fpr": cal.fpr, "n": cal.n, "errors": cal.tp + cal.fn},
        "seconds": round(finished - started, 2),
    }
    params: dict[str, Any] = {"model": model.name, "train": "mnist-5k train", "val": "mnist-5k validation"}
    params.update({k: v for k, v in fit_params.named(MODEL).items() if v is not None})
    summary_path.write_text(
        json.dumps({"summary": summary, "params": params, "started_at": started, "finished_at": finished}, indent=2),
        encoding="utf-8",
    )
    say(
        f"  fitted in {finished - started:.1f} s: {report.n_selected} of {report.n_rules} TDI rules selected, "
        f"oracle TPR {cal.tpr:.2f} / FPR {cal.fpr:.3f} on {cal.n} calibration images"
    )
    return FitOutcome(report.bundle, bundle_dir, True, summary, params, started, finished)
