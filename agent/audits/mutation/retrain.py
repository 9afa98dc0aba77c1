"""The paper's own procedure (Méndez et al. §4-5): mutate ``k`` cells of the training table,
retrain the estimator named by a spec (only allowed scikit-learn classes), evaluate on the clean test
table."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from agent.audits.mutation.robustness import probability_errors, regression_errors, summarise
from agent.audits.mutation.run import MutationPlan
from agent.audits.report import AuditError, AuditResult, ProgressFn
from agent.data.limits import DataLimits
from agent.data.table_files import frames

ALLOWED_ESTIMATORS: frozenset[str] = frozenset(
    {
        "sklearn.linear_model.LinearRegression",
        "sklearn.linear_model.Ridge",
        "sklearn.linear_model.Lasso",
        "sklearn.linear_model.ElasticNet",
        "sklearn.linear_model.LogisticRegression",
        "sklearn.ensemble.RandomForestRegressor",
        "sklearn.ensemble.RandomForestClassifier",
        "sklearn.ensemble.ExtraTreesRegressor",
        "sklearn.ensemble.ExtraTreesClassifier",
        "sklearn.ensemble.GradientBoostingRegressor",
        "sklearn.ensemble.GradientBoostingClassifier",
        "sklearn.tree.DecisionTreeRegressor",
        "sklearn.tree.DecisionTreeClassifier",
        "sklearn.neighbors.KNeighborsRegressor",
        "sklearn.neighbors.KNeighborsClassifier",
        "sklearn.naive_bayes.GaussianNB",
    }
)

_PARAM_TYPES = (str, int, float, bool, type(None))


def _check_param(name: str, value: Any) -> None:
    if isinstance(value, _PARAM_TYPES):
        return
    if isinstance(value, (list, tuple)) and all(isinstance(v, _PARAM_TYPES) for v in value):
        return
    raise AuditError(f"estimator parameter {name!r} must be a number, string, boolean, null or a list of them")


def build_estimator(spec: Mapping[str, Any], seed: int | None = None) -> Any:
    """A scikit-learn estimator from ``{"estimator": "<allowed class path>", "params": {...}}``.

    ``random_state`` is set to ``seed`` when the estimator has one and the spec does not.
    """
    if not isinstance(spec, Mapping):
        raise AuditError("the estimator spec must be a mapping with keys 'estimator' and 'params'")
    extra = set(spec) - {"estimator", "params"}
    if extra:
        raise AuditError(f"unknown key(s) in the estimator spec: {sorted(extra)}; use 'estimator' and 'params'")
    path = spec.get("estimator")
    if not isinstance(path, str) or path not in ALLOWED_ESTIMATORS:
        allowed = ", ".join(sorted(ALLOWED_ESTIMATORS))
        raise AuditError(f"estimator {path!r} is not allowed; choose one of: {allowed}")
    params = spec.get("params") or {}
    if not isinstance(params, Mapping):
        raise AuditError("'params' must be a mapping of parameter names to values")
    for name, value in params.items():
        _check_param(str(name), value)
    module, _, cls_name = path.rpartition(".")
    cls = getattr(importlib.import_module(module), cls_name)
    try:
        est = cls(**dict(params))
        if seed is not None and "random_state" in est.get_params() and "random_state" not in params:
            est.set_params(random_state=seed)
    except (TypeError, ValueError) as exc:
        raise AuditError(f"invalid parameters for {path}: {exc}") from exc
    return est


def run_retrain_audit(
    spec: Mapping[str, Any],
    train_df: pd.DataFrame,
    test_df: pd.DataFrame,
    target: str,
    plan: MutationPlan,
    *,
    progress: ProgressFn | None = None,
) -> AuditResult:
    """The paper's procedure (§4-5): mutate the predictor cells of the training set (``plan``: ``k`` cells,
    ``cell_share`` of them when ``k`` is None), retrain, evaluate on the clean test set; repeat, per operator
    and for all operators together.

    Regression estimators are scored by MAE/MSE/RMSE of their predictions; classifiers by the
    probabilistic MAE/MSE/RMSE of ``predict_proba`` against one-hot truth, plus accuracy.
    """
    # scikit-learn stays out of start-up until retrain mode runs
    from sklearn.base import clone, is_classifier

    for name, df in (("training", train_df), ("test", test_df)):
        if target not in df.columns:
            raise AuditError(f"target column {target!r} is not in the {name} data")
    predictors = [c for c in train_df.columns if c != target]
    missing = [c for c in predictors if c not in test_df.columns]
    if missing:
        raise AuditError(f"test data lacks predictor columns {missing}")
    non_numeric = [
        c
        for c in predictors
        if not pd.api.types.is_numeric_dtype(train_df[c]) or pd.api.types.is_bool_dtype(train_df[c])
    ]
    if non_numeric:
        raise AuditError(f"predictor columns must be numeric; not numeric: {non_numeric}")
    template = build_estimator(spec, plan.seed)
    classification = bool(is_classifier(template))
    x_train, y_train = train_df[predictors], train_df[target].to_numpy()
    x_test, y_test = test_df[predictors], test_df[target].to_numpy()

    def evaluate(x_fit: pd.DataFrame) -> dict[str, float]:
        est = clone(template)
        est.fit(x_fit, y_train)
        if classification:
            proba = est.predict_proba(x_test)
            index = {c: i for i, c in enumerate(est.classes_.tolist())}
            labels = np.array([index.get(v, -1) for v in y_test.tolist()], dtype=np.int64)
            return probability_errors(proba, labels)
        return regression_errors(est.predict(x_test), y_test)

    baseline = evaluate(x_train)
    recorded, runs = plan.repeat(x_train, baseline, evaluate, progress)
    params = {
        "estimator": spec.get("estimator"),
        "estimator_params": dict(spec.get("params") or {}),
        "task": "classification" if classification else "regression",
        **recorded,
        "n_train": len(train_df),
        "n_test": len(test_df),
        "predictor_cells": int(x_train.size),
    }
    return summarise(
        "mutation_retrain",
        params,
        baseline,
        runs,
        {"mutated_share_of_cells": recorded["k"] / max(int(x_train.size), 1), "target": target},
    )


def read_table(path: str | Path, limits: DataLimits | None = None) -> pd.DataFrame:
    """A CSV or Parquet table of retrain mode, read whole within ``limits``; unreadable files and files
    past a limit raise :class:`~agent.data.limits.DataError`."""
    parts = list(frames(Path(path), None, 65536, limits or DataLimits(), whole=True))
    if not parts:
        return pd.DataFrame()
    return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
