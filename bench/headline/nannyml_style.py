"""Tables like NannyML's published synthetic data sets, built here (nothing is downloaded), and a
per-chunk comparison of ``icos-agent check`` on them with the truth (and NannyML's CBPE when it is
installed: a measurement only, never a dependency).

* :func:`car_loan` — binary, like NannyML's synthetic car loan data set: ``car_value``,
  ``salary_range`` (NannyML's four salary bands as ordinals 0..3), ``debt_to_income_ratio``,
  ``loan_length``, ``repaid_loan_on_prev_car``, ``size_of_downpayment``, ``driver_tenure``; a model's
  ``y_pred_proba`` and ``y_pred``; the label ``repaid``.
* :func:`credit_card` — three classes, like NannyML's synthetic multiclass credit card data set:
  ``acq_channel`` and ``app_channel`` (strings), ``app_behavioral_score``, ``requested_credit_limit``,
  ``credit_bureau_score``, ``stated_income``, ``is_customer``; ``y_pred_proba_prepaid_card`` /
  ``_highstreet_card`` / ``_upmarket_card``, ``y_pred`` and the label ``y_true``.

Each has a ``period`` column: ``reference`` rows, then ``analysis`` rows whose second half is drawn
from a covariate shift towards the cases the model finds hard, so its accuracy drops there (the
shift NannyML's CBPE is built for: the relation between features and label stays the same). The
model is a scikit-learn gradient-boosting classifier trained on a separate draw.

``python -m bench.headline.nannyml_style --write DIR`` only writes the tables.
``python -m bench.headline.nannyml_style`` fits a bundle from each reference table, checks the analysis
table in chunks of :data:`CHUNK` rows and prints per chunk: the headline estimate, CBPE's (when ``nannyml``
imports; ``--nannyml-python`` runs it in another environment), and the truth.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

#: Rows per analysis chunk (NannyML's size-based chunking with ``chunk_size=1000``).
CHUNK = 1000
CAR_FEATURES = (
    "car_value",
    "salary_range",
    "debt_to_income_ratio",
    "loan_length",
    "repaid_loan_on_prev_car",
    "size_of_downpayment",
    "driver_tenure",
)
CARD_CLASSES = ("prepaid_card", "highstreet_card", "upmarket_card")
CARD_NUMERIC = (
    "app_behavioral_score",
    "requested_credit_limit",
    "credit_bureau_score",
    "stated_income",
    "is_customer",
)
CARD_PROBA = tuple(f"y_pred_proba_{c}" for c in CARD_CLASSES)


@dataclass(frozen=True)
class Table:
    """A NannyML-style table and how to read it."""

    frame: pd.DataFrame
    label: str
    proba: tuple[str, ...]
    features: tuple[str, ...]

    def period(self, name: str) -> pd.DataFrame:
        return self.frame[self.frame["period"] == name].drop(columns=["period"]).reset_index(drop=True)


def _car_features(rng: np.random.Generator, n: int, hard: float) -> pd.DataFrame:
    """``hard``: share of rows drawn near the decision boundary (the covariate shift)."""
    shifted = rng.uniform(size=n) < hard
    dti = np.where(shifted, rng.uniform(0.35, 0.6, n), rng.beta(2, 3, n))
    return pd.DataFrame(
        {
            "car_value": np.round(rng.lognormal(10.2, 0.45, n), 0),
            "salary_range": np.where(shifted, rng.integers(1, 3, n), rng.integers(0, 4, n)),
            "debt_to_income_ratio": dti,
            "loan_length": rng.integers(6, 13, n),
            "repaid_loan_on_prev_car": (rng.uniform(size=n) < np.where(shifted, 0.5, 0.7)).astype(np.int64),
            "size_of_downpayment": np.round(rng.uniform(0.0, 0.4, n), 2),
            "driver_tenure": np.round(rng.gamma(2.0, 2.0, n), 1),
        }
    )


def _car_label(rng: np.random.Generator, f: pd.DataFrame) -> np.ndarray:
    z = (
        1.2
        - 6.0 * (f["debt_to_income_ratio"] - 0.45)
        + 0.6 * (f["salary_range"] - 1.5)
        - 0.8 * (f["car_value"] / 27000.0 - 1.0)
        + 1.2 * f["repaid_loan_on_prev_car"]
        + 4.0 * f["size_of_downpayment"]
        + 0.15 * f["driver_tenure"]
        - 0.12 * (f["loan_length"] - 9)
        - 1.6
    ).to_numpy()
    return (rng.uniform(size=len(f)) < 1.0 / (1.0 + np.exp(-z))).astype(np.int64)


def _periods(
    n_reference: int,
    n_analysis: int,
    draw: Callable[[np.random.Generator, int, float], pd.DataFrame],
    rng: np.random.Generator,
    hard: float,
) -> pd.DataFrame:
    half = n_analysis // 2
    parts = [
        draw(rng, n_reference, 0.0).assign(period="reference"),
        draw(rng, half, 0.0).assign(period="analysis"),
        draw(rng, n_analysis - half, hard).assign(period="analysis"),
    ]
    return pd.concat(parts, ignore_index=True)


def _model(x: np.ndarray, y: np.ndarray, seed: int) -> Any:
    from sklearn.ensemble import HistGradientBoostingClassifier

    return HistGradientBoostingClassifier(max_iter=150, learning_rate=0.08, random_state=seed).fit(x, y)


def car_loan(n_reference: int = 5000, n_analysis: int = 6000, *, hard: float = 0.8, seed: int = 0) -> Table:
    """The binary table; the last half of the analysis period has ``hard`` of its rows shifted."""
    rng = np.random.default_rng(seed)

    def draw(r: np.random.Generator, n: int, h: float) -> pd.DataFrame:
        f = _car_features(r, n, h)
        return f.assign(repaid=_car_label(r, f))

    train = draw(rng, 8000, 0.0)
    model = _model(train[list(CAR_FEATURES)].to_numpy(), train["repaid"].to_numpy(), seed)
    df = _periods(n_reference, n_analysis, draw, rng, hard)
    p1 = model.predict_proba(df[list(CAR_FEATURES)].to_numpy())[:, 1]
    df["y_pred_proba"] = p1
    df["y_pred"] = (p1 >= 0.5).astype(np.int64)
    return Table(df, "repaid", ("y_pred_proba",), CAR_FEATURES)


def _card_features(rng: np.random.Generator, n: int, hard: float) -> pd.DataFrame:
    shifted = rng.uniform(size=n) < hard
    score = np.where(shifted, rng.normal(600, 25, n), rng.normal(620, 90, n))
    income = np.where(shifted, rng.lognormal(10.6, 0.15, n), rng.lognormal(10.6, 0.55, n))
    return pd.DataFrame(
        {
            "acq_channel": rng.choice(["Paid_search", "Organic", "Partner", "Social", "Bank"], n),
            "app_behavioral_score": rng.normal(0.0, 1.0, n),
            "requested_credit_limit": np.round(rng.lognormal(7.6, 0.5, n), -1),
            "app_channel": rng.choice(["web", "app", "branch"], n),
            "credit_bureau_score": np.clip(np.round(score), 300, 850),
            "stated_income": np.round(income, 0),
            "is_customer": (rng.uniform(size=n) < 0.4).astype(np.int64),
        }
    )


def _card_label(rng: np.random.Generator, f: pd.DataFrame) -> np.ndarray:
    wealth = (
        (f["credit_bureau_score"] - 600) / 60
        + 1.8 * (np.log(f["stated_income"]) - 10.6)
        + 0.5 * f["app_behavioral_score"]
        + 0.3 * f["is_customer"]
    ).to_numpy()
    limit = (np.log(f["requested_credit_limit"]) - 7.6).to_numpy()
    logits = np.stack([-1.6 * wealth - 0.3 * limit, np.zeros(len(f)), 1.6 * wealth + 0.4 * limit - 0.3], axis=1)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    u = rng.uniform(size=(len(f), 1))
    return (u > np.cumsum(p, axis=1)).sum(axis=1)


def credit_card(n_reference: int = 5000, n_analysis: int = 6000, *, hard: float = 0.8, seed: int = 0) -> Table:
    """The three-class table; the last half of the analysis period has ``hard`` of its rows shifted."""
    rng = np.random.default_rng(seed)

    def draw(r: np.random.Generator, n: int, h: float) -> pd.DataFrame:
        f = _card_features(r, n, h)
        return f.assign(y_true=np.array(CARD_CLASSES)[_card_label(r, f)])

    def encoded(f: pd.DataFrame) -> np.ndarray:
        return np.column_stack([f[list(CARD_NUMERIC)].to_numpy(np.float64), (f["app_channel"] == "app").to_numpy()])

    train = draw(rng, 8000, 0.0)
    model = _model(encoded(train), train["y_true"].to_numpy(), seed)
    order = [list(model.classes_).index(c) for c in CARD_CLASSES]
    df = _periods(n_reference, n_analysis, draw, rng, hard)
    proba = model.predict_proba(encoded(df))[:, order]
    for i, col in enumerate(CARD_PROBA):
        df[col] = proba[:, i]
    df["y_pred"] = np.array(CARD_CLASSES)[proba.argmax(axis=1)]
    return Table(df, "y_true", CARD_PROBA, CARD_NUMERIC)


def agent_chunks(table: Table, workdir: Path, *, trees: int | None = None) -> dict[str, Any]:
    """Fit a bundle from the reference period and check the analysis period in chunks of :data:`CHUNK`
    with the ``icos-agent`` CLI (in this Python); the check report. ``trees``: the ADI forest's size
    (``icos-agent fit``'s default when ``None``)."""
    ref, ana = workdir / "reference.parquet", workdir / "analysis.parquet"
    table.period("reference").to_parquet(ref)
    table.period("analysis").to_parquet(ana)
    bundle = workdir / "bundle"
    cli = [sys.executable, "-m", "agent"]
    cols = ["--proba-columns", ",".join(table.proba), "--feature-columns", ",".join(table.features)]
    fit = [*cli, "fit", "--reference", str(ref), "--label-column", table.label, *cols, "--out", str(bundle)]
    forest = [] if trees is None else ["--trees", str(trees)]
    subprocess.run([*fit, *forest, "--json"], check=True, capture_output=True, text=True)
    check = [*cli, "check", "--bundle", str(bundle), "--data", str(ana), "--chunk-size", str(CHUNK), "--json"]
    out = subprocess.run(check, check=True, capture_output=True, text=True)
    return dict(json.loads(out.stdout))


_CBPE = """
import json, sys
import nannyml as nml
import pandas as pd
spec = json.loads(sys.argv[1])
ref, ana = pd.read_parquet(spec["reference"]), pd.read_parquet(spec["analysis"])
proba = spec["proba"] if len(spec["proba"]) == 1 else dict(zip(spec["classes"], spec["proba"]))
est = nml.CBPE(problem_type=spec["problem"], y_pred_proba=proba[0] if len(spec["proba"]) == 1 else proba,
               y_pred="y_pred", y_true=spec["label"], metrics=["accuracy"], chunk_size=spec["chunk"])
est.fit(ref)
res = est.estimate(ana).filter(period="analysis").to_df()
print(json.dumps([float(v) for v in res[("accuracy", "value")]]))
"""


def cbpe_chunks(table: Table, workdir: Path, python: str) -> list[float] | None:
    """NannyML's CBPE accuracy per chunk, run by ``python`` (an environment with ``nannyml``); None
    when it cannot run there."""
    spec = {
        "reference": str(workdir / "reference.parquet"),
        "analysis": str(workdir / "analysis.parquet"),
        "proba": list(table.proba),
        "classes": list(CARD_CLASSES),
        "problem": "classification_binary" if len(table.proba) == 1 else "classification_multiclass",
        "label": table.label,
        "chunk": CHUNK,
    }
    try:
        out = subprocess.run(
            [python, "-c", _CBPE, json.dumps(spec)], capture_output=True, text=True, timeout=600, check=True
        )
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        print(f"CBPE not measured: {str(getattr(exc, 'stderr', '') or exc).strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return [float(v) for v in json.loads(out.stdout)]


def print_table(name: str, report: dict[str, Any], cbpe: list[float] | None) -> None:
    headline = report["headline"]
    print(f"\n{name}: {report['n']} analysis rows in chunks of {report['chunk_size']}; headline {headline}")
    print(f"{'rows':>13} {'ours':>7} {'95% interval':>17} {'CBPE':>7} {'truth':>7}  {'all estimators'}")
    for i, c in enumerate(report["chunks"]):
        e = c["estimates"][headline]
        cb = f"{cbpe[i]:7.4f}" if cbpe is not None and i < len(cbpe) else f"{'-':>7}"
        others = " ".join(f"{k}={v['value']:.3f}" for k, v in c["estimates"].items())
        rows = f"{c['start']}..{c['end']}"
        interval = f"[{e['lower']:.3f}, {e['upper']:.3f}]"
        print(f"{rows:>13} {e['value']:7.4f} {interval} {cb} {c['truth']['accuracy']:7.4f}  {others}")
    chunks = report["chunks"]
    for k in chunks[0]["estimates"]:
        mae = float(np.mean([abs(c["estimates"][k]["value"] - c["truth"]["accuracy"]) for c in chunks]))
        print(f"  mean |estimate - truth| {k:<15} {mae:.4f}")
    if cbpe is not None:
        mae = float(np.mean([abs(v - c["truth"]["accuracy"]) for v, c in zip(cbpe, chunks, strict=False)]))
        print(f"  mean |estimate - truth| {'CBPE':<15} {mae:.4f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.headline.nannyml_style", description=__doc__.splitlines()[0])
    p.add_argument("--nannyml-python", help="a Python with nannyml installed, to measure CBPE beside us")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--write",
        metavar="DIR",
        help="only write the tables (car_loan_/credit_card_ reference.parquet, analysis.parquet and .csv) to DIR",
    )
    args = p.parse_args(argv)
    if args.write:
        out = Path(args.write)
        out.mkdir(parents=True, exist_ok=True)
        for stem, make in (("car_loan", car_loan), ("credit_card", credit_card)):
            table = make(seed=args.seed)
            for period in ("reference", "analysis"):
                table.period(period).to_parquet(out / f"{stem}_{period}.parquet")
                table.period(period).to_csv(out / f"{stem}_{period}.csv", index=False)
        print(f"tables written to {out}")
        return 0
    python = args.nannyml_python
    if python is None:
        try:
            import nannyml  # noqa: F401

            python = sys.executable
        except ImportError:
            pass
    for name, make in (("car loan (binary)", car_loan), ("credit card (3 classes)", credit_card)):
        with tempfile.TemporaryDirectory() as tmp:
            table = make(seed=args.seed)
            report = agent_chunks(table, Path(tmp))
            cbpe = cbpe_chunks(table, Path(tmp), python) if python else None
            print_table(name, report, cbpe)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
