"""Every kind of deployed classifier through the whole agent, with real models built the way users build
them (the zoo of ``bench.zoo``: skl2onnx text and ColumnTransformer pipelines, LightGBM via onnxmltools, a
token-id transformer-style classifier, ResNet-style CNNs on 224×224 images, NCHW float and NHWC uint8):
``fit`` → ``check`` → serve (HTTP, and gRPC with typed and raw contents) → delayed labels.

Data goes in as users hand it over: ``.npz`` with one array per named input, a CSV whose columns are the
inputs, an image folder (ImageFolder layout) with a declared preprocessing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from agent.cli import main as cli_main
from agent.config.settings import load_settings
from agent.protocol.grpc_stubs import open_inference_grpc_pb2 as pb
from agent.server.app import create_app
from bench.zoo import Split, ZooModel, build
from bench.zoo.files import write_image_folder
from tests.support.inprocess import RunningServer
from tests.support.ports import free_port
from tests.support.v2 import post_labels
from tests.support.waiting import wait_until

KINDS = ("text_tfidf", "tabular_categorical", "lightgbm", "token_classifier", "resnet224", "resnet224_nhwc_uint8")


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("zoo")


def save_npz(split: Split, path: Path) -> Path:
    """One array per named input (text as fixed-width strings: no pickle) and ``y``."""
    arrays = {k: v.astype("U") if v.dtype == object else v for k, v in split.inputs.items()}
    np.savez(path, y=split.y, **arrays)
    return path


def v2_tensor(name: str, values: np.ndarray, datatype: str) -> dict[str, Any]:
    data = values.ravel().tolist() if datatype != "BYTES" else [str(v) for v in values.ravel()]
    return {"name": name, "datatype": datatype, "shape": list(values.shape), "data": data}


def fit_and_check(model: ZooModel, tmp: Path, data: dict[str, str], extra: list[str]) -> tuple[Path, dict[str, Any]]:
    bundle = tmp / "bundle"
    out = tmp / "fit.json"
    args = ["fit", "--model", str(model.path), "--train", data["train"], "--val", data["val"], "--trees", "20"]
    assert cli_main([*args, *extra, "--out", str(bundle), "--json"]) == 0
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["feature_view"]["kind"] in ("raw", "pooled", "embedding", "hashed")
    label = (
        extra[extra.index("--label-column") : extra.index("--label-column") + 2] if "--label-column" in extra else []
    )
    rc = cli_main(
        ["check", "--model", str(model.path), "--bundle", str(bundle), "--data", data["test"], *label, "--json"]
    )
    assert rc == 0
    del out
    return bundle, manifest


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", KINDS)
def test_a_model_kind_goes_through_fit_check_serve_and_labels(
    name: str,
    zoo_dir: Path,
    tmp_path: Path,
    run_server: Callable[..., RunningServer],
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = build(name, zoo_dir, seed=0)
    image_folder = name == "resnet224"
    if image_folder:  # image files, read lazily; the network takes raw 0..255 pixels: scale 1
        images = {s: getattr(model, s) for s in ("train", "val", "test")}
        data = {}
        for split_name, split in images.items():
            nhwc = np.clip(split.inputs["input"].transpose(0, 2, 3, 1), 0, 255).astype(np.uint8)
            data[split_name] = str(write_image_folder(nhwc, split.y, model.classes, tmp_path / split_name))
        extra = ["--preprocess", "scale=1"]
    elif name == "tabular_categorical":  # a table whose columns are the model's inputs
        import pandas as pd

        data = {}
        for split_name in ("train", "val", "test"):
            split = getattr(model, split_name)
            frame = pd.DataFrame({k: v.reshape(-1) for k, v in split.inputs.items()})
            frame["y"] = split.y
            data[split_name] = str(tmp_path / f"{split_name}.csv")
            frame.to_csv(data[split_name], index=False)
        extra = ["--label-column", "y"]
    else:
        data = {s: str(save_npz(getattr(model, s), tmp_path / f"{s}.npz")) for s in ("train", "val", "test")}
        extra = []
    bundle, manifest = fit_and_check(model, tmp_path, data, extra)
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    truth = report["truth"]["accuracy"]
    headline = report["estimates"][report["headline"]]
    # a small test split: the estimate lies within its interval's reach of the truth
    assert abs(headline["value"] - truth) < 0.12, (name, truth, headline)
    if manifest["feature_view"]["kind"] == "embedding":
        assert manifest["feature_view"]["embedding"]
    if image_folder:
        assert manifest["preprocess"]["scale"] == 1.0 and manifest["feature_view"]["kind"] != "raw"

    # serve it: HTTP JSON with every input by name and datatype, gRPC with typed and raw contents
    grpc_port = free_port()
    settings = load_settings(
        None,
        mode="serve",
        model={"name": name, "path": str(model.path)},
        bundle={"path": str(bundle)},
        server={"grpc_port": grpc_port, "max_batch": 64},
        state_dir=str(tmp_path / "state"),
        labels={"sample_rate": 0.0},
    )
    srv = run_server(create_app(settings, CollectorRegistry()))
    test = model.test.take(slice(0, 8))
    specs = {i.name: i for i in model.inputs}
    body = {
        "id": "kind-1",
        "inputs": [v2_tensor(k, v, specs[k].v2_datatype) for k, v in test.inputs.items()],
        "outputs": [{"name": "label"}, {"name": "icos_verdict"}],
    }
    r = httpx.post(f"{srv.url}/v2/models/{name}/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    outputs = {o["name"]: o for o in r.json()["outputs"]}
    offline = model.probabilities(test).argmax(axis=1)
    assert outputs["label"]["data"] == offline.tolist()
    assert len(outputs["icos_verdict"]["data"]) == 8
    meta = httpx.get(f"{srv.url}/v2/models/{name}").json()
    advertised = {i["name"]: i["datatype"] for i in meta["inputs"]}
    assert {k: advertised.get(k) for k in specs} == {k: s.v2_datatype for k, s in specs.items()}

    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}", options=[("grpc.max_send_message_length", -1)])
    infer = channel.unary_unary(  # the agent's own messages (they load beside tritonclient's)
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=pb.ModelInferResponse.FromString,
    )
    req = pb.ModelInferRequest(model_name=name, id="kind-2")
    for k, v in test.inputs.items():
        t = req.inputs.add(name=k, datatype=specs[k].v2_datatype, shape=list(v.shape))
        if specs[k].v2_datatype == "BYTES":
            t.contents.bytes_contents.extend(str(s).encode() for s in v.ravel())
        else:
            req.raw_input_contents.append(np.ascontiguousarray(v).tobytes())
    if any(s.v2_datatype == "BYTES" for s in specs.values()) and req.raw_input_contents:
        del req.raw_input_contents[:]  # raw and typed contents cannot mix: numbers typed too
        for t, (k, v) in zip(req.inputs, test.inputs.items(), strict=True):
            if specs[k].v2_datatype == "FP32":
                t.contents.fp32_contents.extend(v.ravel().tolist())
            elif specs[k].v2_datatype == "FP64":
                t.contents.fp64_contents.extend(v.ravel().tolist())
            elif specs[k].v2_datatype == "INT64":
                t.contents.int64_contents.extend(v.ravel().tolist())
    req.outputs.add(name="label")
    answer = infer(req, timeout=60)
    channel.close()
    raw = answer.raw_output_contents[0] if answer.raw_output_contents else None
    labels = np.frombuffer(raw, dtype=np.int64) if raw else np.asarray(answer.outputs[0].contents.int64_contents)
    assert labels.tolist() == offline.tolist()

    # delayed labels for the predictions just answered
    ids = [{"id": f"kind-1:{i}", "label": int(test.y[i])} for i in range(8)]
    assert post_labels(srv.url, ids)["accepted"] == 8
    assert wait_until(lambda: httpx.get(f"{srv.url}/v1/estimates").json()["windows"]["5m"]["realized"]["n"] == 8, 10)
