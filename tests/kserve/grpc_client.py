"""Drive an agent's gRPC port with KServe's own client (``kserve.InferenceGRPCClient``), as a KServe
user would; run by ``tests/integration/test_grpc_kserve.py`` with the interpreter of
``build/kserve-venv`` (KServe pins its own FastAPI, protobuf and grpcio).

    python grpc_client.py HOST:PORT MODEL INPUT.npy  → one JSON object on stdout
"""

from __future__ import annotations

import asyncio
import json
import sys

import numpy as np
from kserve import InferenceGRPCClient, InferInput, InferRequest
from kserve.protocol.infer_type import RequestedOutput


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


async def main(url: str, model: str, path: str) -> dict[str, object]:
    x = np.load(path)
    client = InferenceGRPCClient(url, timeout=30)
    try:
        live = await client.is_server_live()
        ready = await client.is_server_ready()
        model_ready = await client.is_model_ready(model)
        inp = InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=True)  # raw_input_contents
        outputs = [RequestedOutput(n) for n in ("probabilities", "label", "icos_verdict")]
        res = await client.infer(InferRequest(model, [inp], request_id="kserve-1", request_outputs=outputs))
        by_name = {o.name: o for o in res.outputs}
        return {
            "live": live,
            "ready": ready,
            "model_ready": model_ready,
            "id": res.id,
            "outputs": sorted(by_name),
            "probabilities": by_name["probabilities"].as_numpy().tolist(),
            "label": by_name["label"].as_numpy().tolist(),
            "icos_verdict": [_text(v) for v in by_name["icos_verdict"].as_numpy()],
        }
    finally:
        await client.close()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:4]))))
