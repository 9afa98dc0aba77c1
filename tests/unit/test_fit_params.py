"""The fit parameters are stated once, in :class:`invariants.fit_params.FitParams`: the command line's
flags and defaults come from its fields, a bundle's manifest records every field, and no other
function of the project restates one of their defaults."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.cli import build_parser, main
from agent.commands.fit import fit_params_of
from agent.errors import UserError
from bench.headline.nannyml_style import CAR_FEATURES, car_loan
from invariants.fit_params import MODEL, SOURCES, TABLE, FitParams, FitParamsError, field_docs, flag_name, knobs

ROOT = Path(__file__).resolve().parents[2]

FIELDS = dataclasses.fields(FitParams)
#: A value other than the default for every field, each accepted by the table and the model fits.
OTHER: dict[str, Any] = {
    "confidence": 0.95,
    "support": 3,
    "min_samples_leaf": 4,
    "tdi_max_records": 300,
    "n_estimators": 7,
    "calibration_fraction": 0.4,
    "seed": 5,
    "decision_threshold": 0.4,
    "train_fraction": 0.6,
    "shift_sets": 12,
    "features": "hashed",
    "max_segments": 16,
}


def fit_parser() -> Any:
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices["fit"]


def flag(field: dataclasses.Field[Any]) -> str:
    return "--" + flag_name(field).replace("_", "-")


def argv(values: dict[str, Any]) -> list[str]:
    by_name = {f.name: f for f in FIELDS}
    return [a for name, value in values.items() for a in (flag(by_name[name]), str(value))]


def test_every_field_has_a_flag_whose_default_is_the_fields() -> None:
    parser = fit_parser()
    actions = {a.dest: a for a in parser._actions}
    for f in FIELDS:
        action = actions[f.name]
        assert action.option_strings == [flag(f)]
        assert action.default == f.default and action.default is f.default, f.name
        assert f.metadata["help"] in action.help
    args = parser.parse_args(["--out", "b"])
    assert fit_params_of(args) == FitParams()


def test_every_flag_sets_its_field() -> None:
    assert set(OTHER) == {f.name for f in FIELDS}
    assert all(OTHER[f.name] != f.default for f in FIELDS)
    args = fit_parser().parse_args(["--out", "b", *argv(OTHER)])
    assert dataclasses.asdict(fit_params_of(args)) == OTHER


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"confidence": 1.5}, "--confidence must be within [0, 1]"),
        ({"n_estimators": 0}, "--trees must be at least 1"),
        ({"calibration_fraction": 1}, "--calibration-fraction must be within (0, 1)"),
        ({"train_fraction": 0}, "--train-fraction must be within (0, 1)"),
        ({"decision_threshold": 1}, "--decision-threshold must be within (0, 1)"),
        ({"shift_sets": 0}, "--shift-sets must be at least 1"),
    ],
)
def test_a_value_out_of_range_names_its_flag(values: dict[str, Any], message: str) -> None:
    args = fit_parser().parse_args(["--out", "b", *argv(values)])
    with pytest.raises(UserError, match=re.escape(message)):
        fit_params_of(args)


def test_fields_are_validated_and_stored_as_plain_numbers() -> None:
    params = FitParams(support=np.int64(3), confidence=np.float32(0.5))
    assert type(params.support) is int and type(params.confidence) is float
    json.dumps(params.recorded())
    for bad in ({"support": 1.5}, {"seed": -1}, {"min_samples_leaf": 0}, {"confidence": float("nan")}):
        with pytest.raises(FitParamsError) as info:
            FitParams(**bad)
        assert info.value.name in bad


def test_every_field_is_documented_and_applies_somewhere() -> None:
    docs = field_docs()
    assert set(docs) == {f.name for f in FIELDS}
    for f in FIELDS:
        assert len(docs[f.name]) > 80, f.name  # what it does and why that default
        assert f.metadata["help"] and set(f.metadata["applies"]) <= set(SOURCES)
        assert f.default is not None or f.metadata["when_none"], f.name
    assert {f.name for f in knobs(MODEL)} | {f.name for f in knobs(TABLE)} == {f.name for f in FIELDS}


def _literal_defaults(tree: ast.AST) -> list[tuple[int, str]]:
    """Parameters, class fields and dict entries that give a fit parameter's name a literal value."""
    # generic names, used for other things
    names = {f.name for f in FIELDS} - {"seed", "decision_threshold", "features"}
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            positional = a.posonlyargs + a.args
            pairs = [*zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True)]
            pairs += [(k, d) for k, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None]
            found += [(node.lineno, arg.arg) for arg, d in pairs if arg.arg in names and isinstance(d, ast.Constant)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id in names:
            if isinstance(node.value, ast.Constant):
                found.append((node.lineno, node.target.id))
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if isinstance(k, ast.Constant) and k.value in names and isinstance(v, ast.Constant):
                    found.append((node.lineno, str(k.value)))
    return found


def test_no_other_module_restates_a_default() -> None:
    """The literal default of a fit parameter appears in ``invariants/fit_params.py`` only."""
    restated = []
    for package in ("agent", "invariants", "exporters", "bench", "docs"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "fit_params.py" or "grpc_stubs" in path.parts:
                continue
            for line, name in _literal_defaults(ast.parse(path.read_text(encoding="utf-8"))):
                restated.append(f"{path.relative_to(ROOT)}:{line} {name}")
    assert not restated, restated
    assert _literal_defaults(ast.parse("def fit(x, *, support: int = 8) -> None: ...")) == [(1, "support")]


def test_a_table_bundle_records_every_field_that_applies_to_tables(tmp_path: Path) -> None:
    table = car_loan(n_reference=1500, n_analysis=10, seed=1)
    ref = tmp_path / "ref.csv"
    table.period("reference").to_csv(ref, index=False)
    values = {k: v for k, v in OTHER.items() if k in {f.name for f in knobs(TABLE)}}
    cols = ["--proba-columns", ",".join(table.proba), "--feature-columns", ",".join(CAR_FEATURES)]
    out = tmp_path / "bundle"
    common = ["fit", "--reference", str(ref), "--label-column", table.label, *cols, "--out", str(out), "--json"]
    assert main([*common, *argv(values)]) == 0
    recorded = json.loads((out / "manifest.json").read_text())["fit_params"]
    assert {k: recorded[k] for k in values} == values and recorded["source"] == TABLE
    assert "shift_sets" not in recorded  # a model fit's parameter
    tdi = json.loads((out / "tdi.json").read_text())["params"]
    assert (tdi["confidence"], tdi["support"], tdi["min_samples_leaf"]) == (0.95, 3, 4)
    assert recorded["n_adi_train"] + recorded["n_calibration"] == recorded["n_val"]
    assert recorded["n_calibration"] == pytest.approx(0.4 * recorded["n_val"], abs=2)


def test_a_model_bundle_records_every_field_that_applies_to_models(tmp_path: Path) -> None:
    from skl2onnx import to_onnx
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression

    x, y = make_classification(n_samples=1400, n_features=8, n_informative=4, flip_y=0.1, random_state=0)
    x = x.astype(np.float32)
    clf = LogisticRegression().fit(x[:600], y[:600])
    exported = to_onnx(clf, x[:1], options={id(clf): {"zipmap": False}}, target_opset={"": 17, "ai.onnx.ml": 3})
    (tmp_path / "m.onnx").write_bytes(exported.SerializeToString())
    np.savez(tmp_path / "train.npz", x=x[:600], y=y[:600])
    np.savez(tmp_path / "val.npz", x=x[600:], y=y[600:])
    values = {k: v for k, v in OTHER.items() if k in {f.name for f in knobs(MODEL)}}
    out = tmp_path / "bundle"
    files = ["--model", str(tmp_path / "m.onnx"), "--train", str(tmp_path / "train.npz")]
    assert main(["fit", *files, "--val", str(tmp_path / "val.npz"), "--out", str(out), "--json", *argv(values)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    recorded = manifest["fit_params"]
    assert {k: recorded[k] for k in values} == values and "source" not in recorded
    assert "train_fraction" not in recorded  # a table fit's parameter
    assert manifest["decision_threshold"] == values["decision_threshold"]
    assert recorded["n_calibration"] == pytest.approx(0.4 * recorded["n_val"], abs=2)
    shift = manifest["estimator_calibration"]["shift"]
    assert shift is not None
