"""A gRPC call takes room in the server's budget (``server.max_inflight_bytes``) before its message is read,
for what reading it holds at once: grpc-python copies the transport's buffer into a ``bytearray`` and that
into ``bytes`` (:data:`agent.server.grpc_server.READ_COPIES` copies of a message of up to gRPC's receive
limit). Room for two copies of twice the body limit let 16 concurrent 32 MB calls peak at 536 MB with a
budget of 256 MB (``python -m bench.hostile.serving --cases burst-grpc``). Asserted on the budget's own
accounting during a burst of calls whose messages are as large as gRPC receives: the reads at once, at
three copies each, fit the budget, and so does everything the budget holds; never on wall-clock time."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import grpc
import yaml
from tritonclient.grpc import service_pb2, service_pb2_grpc

from agent.config.settings import load_settings
from agent.model.classifier import default_model_path
from agent.server.app import create_app
from agent.server.body_budget import BodyBudget
from agent.server.grpc_server import READ_COPIES, receive_limit
from tests.support.inprocess import RunningServer
from tests.support.ports import free_port

MiB = 1 << 20
MAX_BODY = 1 * MiB
BUDGET = 8 * MiB
CALLS = 12


class RecordingBudget(BodyBudget):
    """The server's budget, recording the most it held and the most reservations (reads) it held at once."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.reading = self.most_reading = self.most_held = 0
        self._record = threading.Lock()

    def take(self, size: int, *, reservation: bool = False) -> None:
        super().take(size, reservation=reservation)
        with self._record:
            self.most_held = max(self.most_held, self.held)
            if reservation:
                self.reading += 1
                self.most_reading = max(self.most_reading, self.reading)

    def settle(self, reservation: int, size: int) -> None:
        with self._record:
            self.reading -= 1
        super().settle(reservation, size)

    def give(self, size: int, *, reservation: bool = False) -> None:
        if reservation:
            with self._record:
                self.reading -= 1
        super().give(size, reservation=reservation)


def test_reads_at_once_fit_the_budget_at_what_each_read_holds(
    tmp_path: Path, run_server: Any, mnist_bundle_dir: Path
) -> None:
    grpc_port = free_port()
    cfg = {
        "mode": "serve",
        "model": {"name": "mnist", "path": str(default_model_path())},
        "bundle": {"path": str(mnist_bundle_dir)},
        "state_dir": str(tmp_path / "state"),
        "server": {"grpc_port": grpc_port, "max_body_bytes": MAX_BODY, "max_inflight_bytes": BUDGET},
        "labels": {"enabled": False},
        "audits": {"mlflow": {"enabled": False}},
    }
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(cfg))
    srv: RunningServer = run_server(create_app(load_settings(tmp_path / "agent.yaml")))
    service = srv.app.state.agent.grpc
    budget = RecordingBudget(BUDGET)
    budget.on_give(service._wake)
    service.budget = budget  # the service's calls take and give this budget from now on

    # messages as large as gRPC receives: read whole, then refused as over server.max_body_bytes
    size = receive_limit(MAX_BODY) - 4096
    req = service_pb2.ModelInferRequest(model_name="mnist", id="x" * 10)
    req.inputs.add(name="input", datatype="FP32", shape=[1, 1, 28, 28])
    req.raw_input_contents.append(b"\0" * (size - req.ByteSize() - 16))
    assert receive_limit(MAX_BODY) - 8192 < req.ByteSize() <= receive_limit(MAX_BODY)
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}", options=[("grpc.max_send_message_length", -1)])
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    codes: list[str] = []

    def one() -> None:
        try:
            stub.ModelInfer(req, timeout=120)
            codes.append("OK")
        except grpc.RpcError as exc:
            codes.append(exc.code().name)

    threads = [threading.Thread(target=one) for _ in range(CALLS)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=150)
    finally:
        channel.close()
    assert len(codes) == CALLS and set(codes) <= {"RESOURCE_EXHAUSTED", "UNAVAILABLE"}, codes
    assert "RESOURCE_EXHAUSTED" in codes  # messages were read (then refused as too large)
    assert service.reserve >= READ_COPIES * req.ByteSize()
    assert budget.most_reading >= 1 and budget.most_reading * READ_COPIES * req.ByteSize() <= BUDGET, (
        budget.most_reading
    )
    assert budget.most_held <= BUDGET
    assert budget.held == 0 and budget.reading == 0
