"""Proxy mode in front of a real MLServer (mlserver-sklearn, default model settings: no ``predict_fn``),
driven by unmodified tritonclient HTTP with binary and JSON tensors.

MLServer runs from its own virtual environment (``make mlserver-venv`` → ``build/mlserver-venv``; it
pins an older FastAPI than the agent) on free loopback ports (HTTP, gRPC and metrics). Its model is a
scikit-learn logistic regression on sklearn digits, trained and saved in MLServer's own format
(joblib) by MLServer's interpreter inside the test's temp directory. The agent's bundle is fitted on
the same model trained here and exported to ONNX.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as th

from invariants.oracle import VERDICTS
from tests.support.agents import Agents
from tests.support.inprocess import RunningServer
from tests.support.mlserver import running_mlserver, train_in_mlserver
from tests.support.settings import mnist_app

MODEL = "digits"
#: Written by MLServer's interpreter: train on sklearn digits, save where MLServer's runtime loads it.
TRAIN_AND_SAVE = """
import sys
import joblib
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
x, y = load_digits(return_X_y=True)
joblib.dump(LogisticRegression(max_iter=2000).fit(x[:900], y[:900]), sys.argv[1])
"""
#: Default model settings of MLServer's scikit-learn runtime (no ``predict_fn``): the model's input is
#: declared, its outputs are not (it answers ``predict`` unless asked for ``predict_proba``).
MODEL_SETTINGS = {
    "implementation": "mlserver_sklearn.SKLearnModel",
    "parameters": {"uri": "./model.joblib"},
    "inputs": [{"name": "X", "datatype": "FP32", "shape": [-1, 64]}],
}


@pytest.fixture(scope="module")
def mlserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real MLServer serving the digits model on free loopback ports; yields its host:port."""
    root = tmp_path_factory.mktemp("mlserver")
    (root / MODEL).mkdir()
    train_in_mlserver(TRAIN_AND_SAVE, str(root / MODEL / "model.joblib"))
    with running_mlserver(root, {MODEL: MODEL_SETTINGS}) as hostport:
        yield hostport


@pytest.fixture(scope="module")
def digits_bundle(digits_logreg: dict[str, Path]) -> Path:
    """A bundle for the same logistic regression, trained and exported to ONNX once per run."""
    return digits_logreg["bundle"]


@pytest.fixture(scope="module")
def agent(mlserver: str, digits_bundle: Path, module_agents: Agents) -> RunningServer:
    return module_agents.serve(
        mnist_app(
            digits_bundle,
            "proxy",
            model={"name": MODEL, "version": "1"},
            upstream={"url": f"http://{mlserver}", "timeout_seconds": 30},
        )
    )


def _test_images(n: int) -> np.ndarray:
    from sklearn.datasets import load_digits

    x, _ = load_digits(return_X_y=True)
    return np.ascontiguousarray(x[1400 : 1400 + n], dtype=np.float32)


def _input(x: np.ndarray, binary: bool) -> th.InferInput:
    inp = th.InferInput("X", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    return inp


def _strings(values: np.ndarray) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values.reshape(-1).tolist()]


def _direct(mlserver: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MLServer's own ``predict`` and ``predict_proba`` (JSON: it has no binary extension)."""
    res = th.InferenceServerClient(mlserver).infer(
        MODEL,
        [_input(x, False)],
        outputs=[th.InferRequestedOutput(n, binary_data=False) for n in ("predict", "predict_proba")],
    )
    return res.as_numpy("predict"), res.as_numpy("predict_proba")


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_scores_label_and_verdicts(agent: RunningServer, mlserver: str, binary: bool) -> None:
    x = _test_images(24)
    predict, proba = _direct(mlserver, x)
    client = th.InferenceServerClient(agent.hostport)
    res = client.infer(
        MODEL,
        [_input(x, binary)],
        outputs=[th.InferRequestedOutput(n, binary_data=binary) for n in ("probabilities", "label", "icos_verdict")],
    )
    assert [o["name"] for o in res.get_response()["outputs"]] == ["probabilities", "label", "icos_verdict"]
    np.testing.assert_allclose(res.as_numpy("probabilities"), proba, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(res.as_numpy("label"), predict.reshape(-1))
    verdicts = _strings(res.as_numpy("icos_verdict"))
    assert len(verdicts) == 24 and set(verdicts) <= set(VERDICTS)
    # no outputs named: serve mode's defaults, in the client's encoding
    plain = client.infer(MODEL, [_input(x[:3], binary)])
    assert [o["name"] for o in plain.get_response()["outputs"]] == ["probabilities", "label", "icos_verdict"]
    np.testing.assert_array_equal(plain.as_numpy("label"), predict.reshape(-1)[:3])


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_upstream_outputs_when_asked(agent: RunningServer, mlserver: str, binary: bool) -> None:
    x = _test_images(5)
    predict, proba = _direct(mlserver, x)
    res = th.InferenceServerClient(agent.hostport).infer(
        MODEL,
        [_input(x, binary)],
        outputs=[th.InferRequestedOutput(n, binary_data=binary) for n in ("predict", "icos_verdict")],
    )
    assert [o["name"] for o in res.get_response()["outputs"]] == ["predict", "icos_verdict"]
    np.testing.assert_array_equal(res.as_numpy("predict"), predict)
    only_scores = th.InferenceServerClient(agent.hostport).infer(
        MODEL, [_input(x, binary)], outputs=[th.InferRequestedOutput("predict_proba", binary_data=binary)]
    )
    assert [o["name"] for o in only_scores.get_response()["outputs"]] == ["predict_proba"]
    np.testing.assert_allclose(only_scores.as_numpy("predict_proba"), proba)


def test_model_metadata_shows_the_upstream_inputs_and_the_agent_outputs(agent: RunningServer) -> None:
    meta = th.InferenceServerClient(agent.hostport).get_model_metadata(MODEL)
    assert meta["inputs"][0] == {"name": "X", "datatype": "FP32", "shape": [-1, 64]}
    names = [o["name"] for o in meta["outputs"]]
    assert names == ["predict_proba", "probabilities", "label", "icos_verdict"]
    assert meta["parameters"]["icos_upstream_server"] == "mlserver"
    assert meta["parameters"]["icos_upstream_scores_output"] == "predict_proba"


def test_upstream_error_is_502_without_traceback_and_the_next_request_works(agent: RunningServer) -> None:
    """Asking a classifier for ``transform`` makes MLServer answer 500 with a traceback and reset the
    connection: the client gets a short 502, and the next request (same pooled upstream) succeeds."""
    x = _test_images(2)
    client = th.InferenceServerClient(agent.hostport)
    for _ in range(3):
        r = httpx.post(
            f"{agent.url}/v2/models/{MODEL}/infer",
            json={
                "inputs": [{"name": "X", "datatype": "FP32", "shape": [2, 64], "data": x.reshape(-1).tolist()}],
                "outputs": [{"name": "transform"}],
            },
            timeout=60,
        )
        assert r.status_code == 502
        error = r.json()["error"]
        assert error.startswith("upstream answered 500 Internal Server Error"), error
        assert "Traceback" not in r.text and "File " not in r.text and len(r.text) < 300
        res = client.infer(MODEL, [_input(x, True)], outputs=[th.InferRequestedOutput("label")])
        assert res.as_numpy("label").shape == (2,)
