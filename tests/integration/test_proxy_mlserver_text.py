"""A text classifier behind a real MLServer: the agent in proxy mode in front of MLServer's scikit-learn
runtime serving a ``TfidfVectorizer`` + ``LogisticRegression`` pipeline, driven by tritonclient with BYTES
tensors (binary and JSON).

MLServer's interpreter trains the pipeline on the zoo's generated topic texts and saves it in its own
format. Its runtime hands the pipeline the request's ``[N, 1]`` string tensor as it is, so the served
pipeline starts with ``FunctionTransformer(numpy.ravel)`` (a step that changes nothing in the model: one
document per row), which skl2onnx cannot export; the agent's bundle is fitted on the zoo's ONNX export
of the same ``TfidfVectorizer(min_df=2)`` + ``LogisticRegression(C=2)`` trained on the same texts, with
the ``hashed`` view (hashed words of the text itself: the model's own TF-IDF node runs in MLServer, out
of the agent's sight), and judges MLServer's answers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as th

from agent.cli import main as cli_main
from bench.zoo import ZooModel, build
from invariants.oracle import VERDICTS
from tests.support.agents import Agents
from tests.support.inprocess import RunningServer
from tests.support.mlserver import running_mlserver, train_in_mlserver
from tests.support.settings import mnist_app
from tests.support.v2 import post_labels
from tests.support.waiting import wait_until

MODEL = "topics"
TRAIN_AND_SAVE = """
import json, sys
import joblib, numpy
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import FunctionTransformer
data = json.load(open(sys.argv[1]))
pipe = Pipeline([
    ("rows", FunctionTransformer(numpy.ravel)),
    ("tfidf", TfidfVectorizer(min_df=2)),
    ("clf", LogisticRegression(C=2.0, max_iter=2000)),
])
joblib.dump(pipe.fit(numpy.array(data["text"], dtype=object).reshape(-1, 1), data["y"]), sys.argv[2])
"""
MODEL_SETTINGS = {
    "implementation": "mlserver_sklearn.SKLearnModel",
    "parameters": {"uri": "./model.joblib"},
    "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1, 1]}],
}


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> ZooModel:
    return build("text_tfidf", tmp_path_factory.mktemp("zoo"), seed=0)


def _texts(split_inputs: np.ndarray) -> list[str]:
    return [str(t) for t in split_inputs.reshape(-1)]


@pytest.fixture(scope="module")
def mlserver(zoo: ZooModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("mlserver")
    (root / MODEL).mkdir()
    data = root / "train.json"
    data.write_text(json.dumps({"text": _texts(zoo.train.inputs["text"]), "y": zoo.train.y.tolist()}))
    train_in_mlserver(TRAIN_AND_SAVE, str(data), str(root / MODEL / "model.joblib"))
    with running_mlserver(root, {MODEL: MODEL_SETTINGS}) as hostport:
        yield hostport


@pytest.fixture(scope="module")
def bundle(zoo: ZooModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("text-bundle")
    for part in ("train", "val"):
        split = getattr(zoo, part)
        np.savez(root / f"{part}.npz", text=split.inputs["text"].astype("U"), y=split.y)
    out = root / "bundle"
    args = ["fit", "--model", str(zoo.path), "--train", str(root / "train.npz"), "--val", str(root / "val.npz")]
    # the model runs in MLServer: the view reads the text itself (hashed words), not the model's TF-IDF node
    assert cli_main([*args, "--features", "hashed", "--trees", "20", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def agent(mlserver: str, bundle: Path, module_agents: Agents) -> RunningServer:
    return module_agents.serve(
        mnist_app(
            bundle,
            "proxy",
            model={"name": MODEL},
            upstream={"url": f"http://{mlserver}", "timeout_seconds": 30},
            labels={"enabled": True},
        )
    )


def _input(texts: list[str], binary: bool) -> th.InferInput:
    inp = th.InferInput("text", [len(texts), 1], "BYTES")
    inp.set_data_from_numpy(np.array(texts, dtype=object).reshape(-1, 1), binary_data=binary)
    return inp


def _direct(mlserver: str, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    res = th.InferenceServerClient(mlserver).infer(
        MODEL,
        [_input(texts, False)],
        outputs=[th.InferRequestedOutput(n, binary_data=False) for n in ("predict", "predict_proba")],
    )
    return res.as_numpy("predict"), res.as_numpy("predict_proba")


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_text_through_the_agent_gets_mlservers_answer_and_a_verdict(
    agent: RunningServer, mlserver: str, zoo: ZooModel, binary: bool
) -> None:
    texts = _texts(zoo.test.inputs["text"][:16])
    predict, proba = _direct(mlserver, texts)
    res = th.InferenceServerClient(agent.hostport).infer(
        MODEL,
        [_input(texts, binary)],
        outputs=[th.InferRequestedOutput(n, binary_data=binary) for n in ("probabilities", "label", "icos_verdict")],
    )
    np.testing.assert_allclose(res.as_numpy("probabilities"), proba, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(res.as_numpy("label"), predict.reshape(-1))
    verdicts = [v.decode() if isinstance(v, bytes) else str(v) for v in res.as_numpy("icos_verdict").reshape(-1)]
    assert len(verdicts) == 16 and set(verdicts) <= set(VERDICTS)
    # MLServer's pipeline is the zoo's, trained on the same texts: the answers agree with the ONNX export
    onnx_labels = zoo.probabilities(zoo.test.take(np.arange(16))).argmax(axis=1)
    assert float(np.mean(predict.reshape(-1) == onnx_labels)) >= 0.9


def test_labels_of_proxied_text_predictions_reach_the_estimates(agent: RunningServer, zoo: ZooModel) -> None:
    texts = _texts(zoo.test.inputs["text"][100:160])
    client = th.InferenceServerClient(agent.hostport)
    for i in range(0, len(texts), 20):
        client.infer(MODEL, [_input(texts[i : i + 20], True)], request_id=f"text-{i}")
    labels = [{"id": f"text-{i - i % 20}:{i % 20}", "label": int(zoo.test.y[100 + i])} for i in range(60)]
    assert post_labels(agent.url, labels)["accepted"] == 60

    def realized() -> int:
        return int(httpx.get(f"{agent.url}/v1/estimates").json()["windows"]["5m"]["realized"]["n"])

    assert wait_until(lambda: realized() == 60, 10)
    estimates = httpx.get(f"{agent.url}/v1/estimates").json()["windows"]["5m"]
    assert estimates["n"] >= 60
