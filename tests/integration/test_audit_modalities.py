"""Every audit on models of other inputs than one image, through ``icos-agent audit ... --json``: a
TF-IDF text classifier (one string input), a ``ColumnTransformer`` table (numeric and categorical string
columns, one input per column), a token-id model (ids and mask of a dynamic length), and the shipped
MNIST CNN; an audit that cannot audit a model is refused in one line naming those that can; scheduled
audits of the table model read its live inputs, strings included, from the reservoir."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from agent.cli import main
from agent.config.settings import load_settings
from agent.data.datasets import Splits
from agent.data.files import load_data
from agent.errors import UserError
from agent.model.classifier import OnnxClassifier, default_model_path
from agent.server.app import create_app
from tests.support.audit_models import table_classifier, text_classifier, token_data, token_model
from tests.support.inprocess import RunningServer

MNIST = str(default_model_path())
TOKEN = "modalities-admin-token"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, mnist_splits: Splits) -> dict[str, tuple[Path, Path]]:
    """``{kind: (model, data)}`` for ``text``, ``table``, ``tokens`` and ``mnist``."""
    root = tmp_path_factory.mktemp("audit-modalities")
    tokens = root / "tokens.onnx"
    tokens.write_bytes(token_model())
    np.savez(root / "tokens.npz", **token_data())
    np.savez(root / "mnist.npz", x=mnist_splits.test.x[:120], y=mnist_splits.test.y[:120])
    return {
        "text": text_classifier(root),
        "table": table_classifier(root),
        "tokens": (tokens, root / "tokens.npz"),
        "mnist": (Path(MNIST), root / "mnist.npz"),
    }


def _argv(models: dict[str, tuple[Path, Path]], kind: str, audit: str, *more: str) -> list[str]:
    model, data = models[kind]
    argv = ["audit", audit, "--model", str(model), "--data", str(data), "--no-progress", *more]
    return argv + (["--label-column", "label"] if data.suffix == ".csv" else [])


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    assert main([*argv, "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1, "--json prints exactly one line"
    obj = json.loads(out)
    assert obj["status"] == "success"
    return obj  # type: ignore[no-any-return]


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("icos-agent audit: error:") and err.count("\n") == 1, err
    return err


def _rates(out: dict[str, Any]) -> dict[str, float]:
    return {r["relation"]: r["violation_rate"] for r in out["result"]["details"]["relations"]}


def test_text_model(capsys: pytest.CaptureFixture[str], models: dict[str, tuple[Path, Path]]) -> None:
    out = _json(capsys, _argv(models, "text", "metamorphic"))
    rates = _rates(out)
    assert list(rates) == ["typos", "case", "whitespace", "punctuation"]
    # TF-IDF lower-cases and reads words of letters: case, white space and punctuation change nothing
    assert rates["case"] == rates["whitespace"] == rates["punctuation"] == 0.0
    assert 0.0 < rates["typos"] < 0.2  # a mistyped sentiment word is a word the model never saw
    assert all(r["inputs"] == ["text"] for r in out["result"]["details"]["relations"])
    assert out["result"]["params"]["inputs"] == {"text": ["text"]} and out["n_samples"] == 200
    heavy = _json(capsys, _argv(models, "text", "metamorphic", "--transformations", "[{name: typos, strength: 1}]"))
    assert _rates(heavy)["typos"] > rates["typos"]

    for audit, message in (
        ("mutation", "data mutation (DEC/IMP/SGN/DIG) changes numbers; model 'text' has no numeric input"),
        ("dscore", "D-Score needs a convolutional image model"),
    ):
        err = _refused(capsys, _argv(models, "text", audit))
        assert message in err and "text input 'text'" in err
        assert err.rstrip().endswith("audits that apply: metamorphic"), err
    err = _refused(capsys, _argv(models, "text", "metamorphic", "--transformations", "[shift]"))
    assert "shift needs images" in err and "relations that apply to this model: typos, case, whitespace" in err


def test_table_model(capsys: pytest.CaptureFixture[str], models: dict[str, tuple[Path, Path]]) -> None:
    out = _json(capsys, _argv(models, "table", "metamorphic"))
    rates = _rates(out)
    assert list(rates) == ["scale", "noise", "unseen_category", "category_swap"]
    inputs = {r["relation"]: r["inputs"] for r in out["result"]["details"]["relations"]}
    assert inputs["scale"] == ["age", "income"] and inputs["category_swap"] == ["city", "plan"]
    assert out["result"]["params"]["inputs"] == {"numeric": ["age", "income"], "category": ["city", "plan"]}
    # a 1 % change of a number rarely moves a label; another city or plan often does (the label reads them)
    assert rates["scale"] < 0.05 and rates["category_swap"] > 0.1
    one = _json(
        capsys, _argv(models, "table", "metamorphic", "--transformations", "[{name: unseen_category, input: plan}]")
    )
    assert one["result"]["details"]["relations"][0]["inputs"] == ["plan"]
    # text relations apply to a categorical column when it is named
    typos = _json(capsys, _argv(models, "table", "metamorphic", "--transformations", "[{name: typos, input: city}]"))
    assert typos["result"]["details"]["relations"][0]["inputs"] == ["city"]
    err = _refused(capsys, _argv(models, "table", "metamorphic", "--transformations", "[typos]"))
    assert "typos needs a free-text input" in err
    assert "relations that apply to this model: scale, noise, unseen_category, category_swap" in err

    mutated = _json(capsys, _argv(models, "table", "mutation", "--k", "60", "--repetitions", "2"))
    assert mutated["mutated_inputs"] == ["age", "income"]
    assert mutated["skipped_inputs"] == {"city": "category", "plan": "category"}
    assert mutated["result"]["params"]["cells"] == 2 * 300 and mutated["result"]["params"]["skipped_inputs"] == [
        "city",
        "plan",
    ]
    metrics = mutated["result"]["metrics"]
    assert metrics["sgn_mae_change_pct_mean"] > 0 and 0.8 < metrics["baseline_accuracy"] <= 1.0
    assert main(_argv(models, "table", "mutation", "--k", "60", "--repetitions", "2")) == 0
    table = capsys.readouterr().out
    assert "skipped (not numeric): city (category), plan (category)" in table
    assert "mutated cells per repetition: 60 of 600 (10.0%)" in table
    # the accuracy change is in the human table, its first column
    header = next(line for line in table.splitlines() if line.strip().startswith("operator"))
    assert header.split()[1:3] == ["accuracy", "Δ%"]
    sgn = next(line for line in table.splitlines() if line.strip().startswith("SGN"))
    assert f"{metrics_table(mutated, 'sgn'):+.2f}" in sgn

    # without --k, a share of the cells (5 %): the size follows the data
    scaled = _json(capsys, _argv(models, "table", "mutation", "--repetitions", "2"))
    assert scaled["result"]["params"]["k"] == 30 and scaled["result"]["params"]["cell_share"] == 0.05
    assert scaled["result"]["details"]["mutated_share_of_cells"] == 0.05
    half = _json(capsys, _argv(models, "table", "mutation", "--repetitions", "2", "--cell-share", "0.5"))
    assert half["result"]["params"]["k"] == 300

    err = _refused(capsys, _argv(models, "table", "dscore"))
    assert "numeric inputs 'age', 'income'; categorical inputs 'city', 'plan'" in err
    assert "audits that apply: mutation (numeric inputs only: age, income), metamorphic" in err


def metrics_table(out: dict[str, object], group: str) -> float:
    """The accuracy change of one operator group, as --json reports it."""
    metrics = out["result"]["metrics"]  # type: ignore[index]
    return float(metrics[f"{group}_accuracy_change_pct_mean"])  # type: ignore[index]


def test_token_model(capsys: pytest.CaptureFixture[str], models: dict[str, tuple[Path, Path]]) -> None:
    out = _json(capsys, _argv(models, "tokens", "metamorphic", "--label-free"))
    rates = _rates(out)
    assert list(rates) == ["token_swap", "token_drop", "truncate"]
    assert {r["relation"]: r["inputs"] for r in out["result"]["details"]["relations"]}["truncate"] == ["input_ids"]
    cut = _json(
        capsys,
        _argv(
            models,
            "tokens",
            "metamorphic",
            "--transformations",
            "[{name: truncate, strength: 0, label: none}, {name: truncate, strength: 0.9}]",
        ),
    )
    cut_rates = _rates(cut)
    assert cut_rates["none"] == 0.0 and cut_rates["truncate"] > rates["truncate"] > 0.0
    err = _refused(capsys, _argv(models, "tokens", "mutation"))
    assert "token input 'input_ids'" in err and "audits that apply: metamorphic" in err


def test_mnist_cnn(capsys: pytest.CaptureFixture[str], models: dict[str, tuple[Path, Path]]) -> None:
    dscore = _json(capsys, _argv(models, "mnist", "dscore", "--n", "2"))
    assert 0.9 < dscore["base_accuracy"] <= 1.0 and len(dscore["variant_accuracies"]) == 4
    mutation = _json(capsys, _argv(models, "mnist", "mutation", "--k", "200", "--repetitions", "2"))
    assert "skipped_inputs" not in mutation and mutation["result"]["params"]["cells"] == 120 * 784
    meta = _json(capsys, _argv(models, "mnist", "metamorphic"))
    assert list(_rates(meta)) == ["shift", "brightness", "contrast", "gaussian_noise", "blur"]
    err = _refused(capsys, _argv(models, "mnist", "metamorphic", "--transformations", "[typos]"))
    assert "typos needs a free-text input; the model's inputs are image input 'input'" in err
    assert "relations that apply to this model: shift, brightness, contrast, gaussian_noise, rotation, blur" in err


def _config(tmp_path: Path, model: Path, bundle: Path, audits: dict[str, Any]) -> Path:
    cfg = {"mode": "serve", "model": {"name": "people", "path": str(model)}, "bundle": {"path": str(bundle)}}
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({**cfg, "audits": audits}))
    return path


def test_scheduled_audits_of_the_table_model_read_live_strings(
    tmp_path: Path,
    models: dict[str, tuple[Path, Path]],
    run_server: Callable[..., RunningServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agent.offline.fit import fit_bundle
    from invariants.fit_params import FitParams

    model_path, data_path = models["table"]
    model = OnnxClassifier.load(model_path)
    data = load_data(data_path, label_column="label", inputs=model.signature.names)
    idx = np.arange(len(data))
    report = fit_bundle(model, data.subset(idx[:150]), data.subset(idx[150:]), params=FitParams(n_estimators=10))
    bundle = tmp_path / "bundle"
    report.bundle.save(bundle)

    monkeypatch.setenv("ICOS_AGENT_ADMIN_TOKEN", TOKEN)
    with pytest.raises(UserError, match=r"audits\.dscore: D-Score needs a convolutional image model .*remove"):
        create_app(load_settings(_config(tmp_path, model_path, bundle, {"dscore": {"cron": "0 0 1 1 *"}})))

    audits = {
        "reservoir": {"size": 50},
        "reference": {"source": "live", "min_samples": 40},
        "metamorphic": {"cron": "0 0 1 1 *"},
        "mutation": {"cron": "0 0 1 1 *", "k": 40, "repetitions": 2},
    }
    srv = run_server(create_app(load_settings(_config(tmp_path, model_path, bundle, audits))))
    assert isinstance(data.x, dict)
    for start in range(0, 100, 25):
        body = {
            "inputs": [
                {
                    "name": name,
                    "datatype": "BYTES" if values.dtype == object else "FP32",
                    "shape": [25, 1],
                    "data": [v if isinstance(v, str) else float(v) for v in values[start : start + 25, 0]],
                }
                for name, values in data.x.items()
            ]
        }
        r = httpx.post(f"{srv.url}/v2/models/people/infer", json=body, timeout=30)
        assert r.status_code == 200, r.text

    auth = {"Authorization": f"Bearer {TOKEN}"}
    meta = httpx.post(f"{srv.url}/v1/audits/metamorphic?wait=true", headers=auth, timeout=120).json()
    assert meta["status"] == "success", meta
    assert meta["data_source"] == "live (50 inputs)" and meta["n_samples"] == 50
    relations = {r["relation"]: r["inputs"] for r in meta["result"]["details"]["relations"]}
    assert relations == {
        "scale": ["age", "income"],
        "noise": ["age", "income"],
        "unseen_category": ["city", "plan"],
        "category_swap": ["city", "plan"],
    }
    mutation = httpx.post(f"{srv.url}/v1/audits/mutation?wait=true", headers=auth, timeout=120).json()
    assert mutation["status"] == "success", mutation
    assert mutation["result"]["details"]["skipped_inputs"] == {"city": "category", "plan": "category"}
    listing = httpx.get(f"{srv.url}/v1/audits").json()
    assert listing["reservoir"] == {"capacity": 50, "size": 50, "seen": 100, "too_large": 0}
