"""The hostile clients of :mod:`bench.hostile.serving`, one function per case.

Each case gets a freshly started agent and runs one or more steps through :class:`Runner.step`, each a
hostile client's action whose request, answers and outcome make one row. The cases send what any
version of the agent can be sent (the same bodies before and after the bounds), and report what it
answered: a 200 with a gigabyte body is as much a result as a 400.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from bench.hostile.serving_measure import Runner, ServedAgent, StepResult

MODEL = "mnist"
LABELS_TOKEN = "labelers-token-of-the-benchmark"
ADMIN_TOKEN = "admin-token-of-the-benchmark"
#: The hostile client's source address: its own budget of failed tokens and its own label source.
ATTACKER = "127.0.0.2"
#: The model's whole output per sample: 10 FP32 probabilities, an INT64 label, a BOOL verdict.
OUTPUT_BYTES_PER_SAMPLE = 10 * 4 + 8 + 1
#: A batch of MNIST images of ~31 MiB (FP32), what the bursts send.
LARGE_BATCH = 10240
#: What a listing of the labeling sample may take (SECURITY.md: it stops at 1 MiB of ids).
LISTING_BOUND = 2 << 20
TIMEOUT = 300.0


@dataclass(frozen=True)
class Sizes:
    long_id: int = 100 * 1024
    long_id_batch: int = 256
    huge_id: int = 1 << 20
    huge_id_batch: int = 1024
    parameter: int = 5_000_000
    predictions: int = 1000
    guesses: int = 2000
    burst: int = 16
    burst_batch: int = LARGE_BATCH
    max_batch: int = 1024  # server.max_batch (the agent's default); also the batch of burst-model
    settle: float = 10.0


QUICK = Sizes(guesses=100, burst=4, burst_batch=512, max_batch=1024, settle=1.0)


@dataclass
class Context:
    agent: ServedAgent
    sizes: Sizes
    x: np.ndarray  # MNIST test images, FP32 pixels 0..255
    y: np.ndarray  # their classes


def agent_settings(model_path: str, bundle: str, state_dir: str, max_batch: int) -> dict[str, Any]:
    """Serve mode, settings every version of the agent knows; labels sampled at 10% and flushed often."""
    return {
        "mode": "serve",
        "model": {"name": MODEL, "path": model_path},
        "bundle": {"path": bundle},
        "state_dir": state_dir,
        "server": {"max_batch": max_batch},
        "labels": {"sample_rate": 0.1, "flush_interval_seconds": 0.2},
        "audits": {"mlflow": {"enabled": False}},
    }


# -- the wire ----------------------------------------------------------------------------------------


def size(n: int) -> str:
    if n < 1000:
        return f"{n} B"
    if n < 1_000_000:
        return f"{n / 1e3:.1f} KB"
    return f"{n / 1e6:,.1f} MB" if n < 100e6 else f"{n / 1e6:,.0f} MB"


def binary_size(n: int) -> str:
    """An id's size as it was chosen (100 KiB, 1 MiB)."""
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n / 1024:g} KiB"


def tally(statuses: Iterable[object]) -> str:
    counts = Counter(str(s) for s in statuses)
    if len(counts) == 1 and sum(counts.values()) == 1:
        return next(iter(counts))
    return ", ".join(f"{s} ×{n}" for s, n in sorted(counts.items()))


def binary_request(
    x: np.ndarray, datatype: str = "FP32", rid: str | None = None, parameters: dict[str, Any] | None = None
) -> tuple[bytes, dict[str, str]]:
    """A V2 request with the binary tensor extension, asking for the ``label`` output (JSON)."""
    tensor = {
        "name": "input",
        "shape": list(x.shape),
        "datatype": datatype,
        "parameters": {"binary_data_size": x.nbytes},
    }
    head: dict[str, Any] = {"inputs": [tensor], "outputs": [{"name": "label"}]}
    if rid is not None:
        head["id"] = rid
    if parameters:
        head["parameters"] = parameters
    text = json.dumps(head).encode()
    headers = {"Inference-Header-Content-Length": str(len(text)), "Content-Type": "application/octet-stream"}
    return text + x.tobytes(), headers


@dataclass
class Answer:
    """An HTTP answer read to its end without being kept: status, size, its first and last 64 KB, and
    how often ``count`` occurs in it."""

    status: int
    size: int
    head: bytes
    tail: bytes
    counted: int = 0

    def json(self) -> Any:
        """The answer's JSON when it was kept whole and is JSON, else ``None``."""
        try:
            return json.loads(self.head) if self.size == len(self.head) else None
        except ValueError:
            return None

    def error(self) -> str:
        """The ``error`` of a 4xx/5xx answer (its first 160 characters), else ``""``."""
        body = self.json() if self.status >= 400 else None
        return str(body.get("error", ""))[:160] if isinstance(body, dict) else ""


def send(client: httpx.Client, method: str, url: str, count: bytes = b"", **kw: Any) -> Answer:
    head, last, n, counted = bytearray(), b"", 0, 0
    with client.stream(method, url, **kw) as r:
        for chunk in r.iter_raw():
            n += len(chunk)
            if len(head) < 65536:
                head += chunk[: 65536 - len(head)]
            joined = last + chunk
            if count:  # an occurrence split between two chunks is counted once, in the joined bytes
                counted += joined.count(count) - last.count(count)
            last = joined[-65536:]
    return Answer(r.status_code, n, bytes(head), last, counted)


def http_client(local_address: str | None = None) -> httpx.Client:
    transport = httpx.HTTPTransport(local_address=local_address) if local_address else None
    return httpx.Client(timeout=TIMEOUT, transport=transport)


def grpc_stub(target: str) -> tuple[Any, Any]:
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    channel = grpc.insecure_channel(target, options=options)
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def grpc_request(x: np.ndarray, datatype: str = "FP32", rid: str = "") -> Any:
    from tritonclient.grpc import service_pb2

    req = service_pb2.ModelInferRequest(model_name=MODEL, id=rid)
    req.inputs.add(name="input", datatype=datatype, shape=list(x.shape))
    req.outputs.add(name="label")
    req.raw_input_contents.append(x.tobytes())
    return req


def grpc_call(stub: Any, req: Any) -> tuple[str, int, str, Any]:
    """Status name, answer size, error details and the answer (``None`` on error) of one ``ModelInfer``."""
    import grpc

    try:
        resp = stub.ModelInfer(req, timeout=TIMEOUT)
        return "OK", resp.ByteSize(), "", resp
    except grpc.RpcError as exc:
        return exc.code().name, len(exc.details() or ""), (exc.details() or "")[:160], None


def _ids_outcome(a: Answer) -> str:
    """Whether an answer lists an id per prediction (its parameters come after the echoed id, so they
    are looked for in its first and last 64 KB)."""
    if a.error():
        return a.error()
    if b"icos_prediction_ids" in a.head + a.tail:
        return "one id per prediction in the answer"
    if b"icos_prediction_count" in a.head + a.tail:
        return "the id once, with icos_prediction_count"
    return "answered"


# -- the cases ---------------------------------------------------------------------------------------


def long_id_http(run: Runner, c: Context, id_bytes: int, batch: int) -> None:
    body, headers = binary_request(c.x[:batch], rid="i" * id_bytes)

    def step() -> StepResult:
        with http_client() as h:
            a = send(h, "POST", f"{c.agent.url}/v2/models/{MODEL}/infer", content=body, headers=headers)
        outcome = _ids_outcome(a)
        return StepResult(size(len(body)), len(body), str(a.status), a.size, outcome, batch * OUTPUT_BYTES_PER_SAMPLE)

    run.step(f"id {binary_size(id_bytes)} × batch {batch}, HTTP", step)


def huge_id_then_listing(run: Runner, c: Context) -> None:
    """The long-id request at its largest, then a labeler's listing of the sample its ids went into."""
    s = c.sizes
    long_id_http(run, c, s.huge_id, s.huge_id_batch)
    with http_client() as h:
        _wait_stored(h, c.agent.url, 0)

    def listing() -> StepResult:
        with http_client() as h:
            a = send(h, "GET", f"{c.agent.url}/v1/labels/requests?limit=1000", count=b'"id"', headers=_labeler())
        outcome = f"listed {a.counted} id{'' if a.counted == 1 else 's'}" if a.status == 200 else a.error()
        return StepResult("GET", 0, str(a.status), a.size, outcome, answer_bound=LISTING_BOUND)

    run.step("labeling sample listing (limit=1000) after it", listing)


def long_id_grpc(run: Runner, c: Context) -> None:
    s = c.sizes
    req = grpc_request(c.x[: s.long_id_batch], rid="g" * s.long_id)
    n = req.ByteSize()

    def step() -> StepResult:
        channel, stub = grpc_stub(c.agent.grpc_target)
        with channel:
            code, answer, details, resp = grpc_call(stub, req)
        if details or resp is None:
            outcome = details
        elif "icos_prediction_ids" in resp.parameters:
            outcome = "one id per prediction in the answer"
        else:
            outcome = "the id once, with icos_prediction_count"
        return StepResult(size(n), n, code, answer, outcome, s.long_id_batch * OUTPUT_BYTES_PER_SAMPLE)

    run.step(f"id {binary_size(s.long_id)} × batch {s.long_id_batch}, gRPC", step)


def large_parameters(run: Runner, c: Context) -> None:
    n = c.sizes.parameter
    body, headers = binary_request(c.x[:1], parameters={"form": "p" * n})

    def step() -> StepResult:
        with http_client() as h:
            a = send(h, "POST", f"{c.agent.url}/v2/models/{MODEL}/infer", content=body, headers=headers)
        outcome = a.error() or "accepted"
        return StepResult(size(len(body)), len(body), str(a.status), a.size, outcome, OUTPUT_BYTES_PER_SAMPLE)

    run.step(f"request parameter of {size(n)}, batch 1, HTTP", step)


def other_datatypes(run: Runner, c: Context) -> None:
    x = c.x[:8]
    types = {"INT64": np.int64, "FP64": np.float64, "FP16": np.float16}

    def step() -> StepResult:
        with http_client() as h:
            body, headers = binary_request(x)
            expected = send(h, "POST", f"{c.agent.url}/v2/models/{MODEL}/infer", content=body, headers=headers).json()
            http, largest, answer, same, error = [], 0, 0, 0, ""
            for name, dtype in types.items():
                body, headers = binary_request(x.astype(dtype), name)
                a = send(h, "POST", f"{c.agent.url}/v2/models/{MODEL}/infer", content=body, headers=headers)
                http.append(a.status)
                largest, answer = max(largest, len(body)), max(answer, a.size)
                same += a.status == 200 and a.json()["outputs"] == expected["outputs"]
                error = error or a.error()
        channel, stub = grpc_stub(c.agent.grpc_target)
        with channel:
            calls = [grpc_call(stub, grpc_request(x.astype(dtype), name)) for name, dtype in types.items()]
        codes = [call[0] for call in calls]
        answer = max([answer] + [call[1] for call in calls])
        outcome = f"HTTP {', '.join(f'{t} {s}' for t, s in zip(types, http, strict=True))}; gRPC {tally(codes)}"
        outcome += f"; {same} of 3 answered the FP32 labels" if same or 200 in http else f"; {error}"
        status = f"{tally(http)} / {tally(codes)}"
        return StepResult(size(largest), largest, status, answer, outcome, 8 * OUTPUT_BYTES_PER_SAMPLE)

    run.step("INT64, FP64, FP16 inputs for an FP32 model, HTTP and gRPC", step)


def _labeler() -> dict[str, str]:
    return {"Authorization": f"Bearer {LABELS_TOKEN}"}


def _wait_stored(h: httpx.Client, url: str, at_least: int, seconds: float = 120.0) -> None:
    """Until the prediction store holds ``at_least`` predictions and nothing is queued (bounded)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        store = h.get(f"{url}/v1/labels", headers=_labeler()).json()["store"]
        if store["predictions"] >= at_least and store["queued"] == 0:
            return
        time.sleep(0.2)
    raise RuntimeError(f"the prediction store did not reach {at_least} predictions within {seconds:.0f} s")


def _with_labels(h: httpx.Client, url: str) -> str:
    est = h.get(f"{url}/v1/estimates").json()["windows"]["1h"]["estimates"].get("with_labels")
    return "none" if not est or est.get("value") is None else f"{est['value']:.2f}"


def _label_counts(a: Answer) -> str:
    body = a.json() if a.status == 200 else None
    if not isinstance(body, dict):
        return f"{a.status} {a.error()}".strip()
    kept = ("accepted", "duplicate", "corrected", "unknown")
    return f"{a.status}: " + ", ".join(f"{body[k]} {k}" for k in kept if body.get(k))


def labels_poisoning(run: Runner, c: Context, token: bool) -> None:
    """1,000 predictions; the real labeler reads the labeling sample; an attacker (another address, no
    token) reads it too and posts wrong labels for it (for every prediction when it cannot read it);
    without the labelers' token an admin then drops the attacker's labels; the labeler posts the truth."""
    n, url = c.sizes.predictions, c.agent.url
    x, y = c.x[:n], c.y[:n]
    truth: dict[str, int] = {}
    predicted = np.empty(n, np.int64)
    labeler_headers = _labeler() if token else {}
    with http_client() as h:
        for k, start in enumerate(range(0, n, 250)):
            body, headers = binary_request(x[start : start + 250], rid=f"p{k}")
            got = h.post(f"{url}/v2/models/{MODEL}/infer", content=body, headers=headers).json()
            predicted[start : start + 250] = got["outputs"][0]["data"]
            truth.update({f"p{k}:{i}": int(y[start + i]) for i in range(len(got["outputs"][0]["data"]))})
        _wait_stored(h, url, n)
        listed = h.get(f"{url}/v1/labels/requests?limit=1000", headers=labeler_headers).json()["requests"]
    sample = [r["id"] for r in listed if r["id"] in truth]
    accuracy = float(np.mean(predicted == y))

    def attack() -> StepResult:
        with http_client(ATTACKER) as a, http_client() as h:
            seen = send(a, "GET", f"{url}/v1/labels/requests?limit=1000")
            ids = [r["id"] for r in seen.json()["requests"] if r["id"] in truth] if seen.status == 200 else list(truth)
            wrong = {"labels": [{"id": i, "label": (truth[i] + 1) % 10} for i in ids]}
            body = json.dumps(wrong).encode()
            posted = send(a, "POST", f"{url}/v1/labels", content=body, headers={"Content-Type": "application/json"})
            estimate = _with_labels(h, url)
        listing = f"{len(ids)} ids" if seen.status == 200 else seen.error()
        outcome = (
            f"sample listed: {seen.status} ({listing}); {len(ids)} wrong labels posted: {_label_counts(posted)}; "
            f"with_labels {estimate}, truth {accuracy:.2f}"
        )
        status, answer = f"{seen.status} / {posted.status}", max(seen.size, posted.size)
        return StepResult(size(len(body)), len(body), status, answer, outcome, answer_bound=LISTING_BOUND)

    run.step(f"aimed wrong labels, {'labelers token set' if token else 'no labelers token'}", attack)
    if not token:

        def drop() -> StepResult:
            with http_client() as h:
                auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
                a = send(h, "DELETE", f"{url}/v1/labels", params={"source": f"client:{ATTACKER}"}, headers=auth)
                estimate = _with_labels(h, url)
            body = a.json() if a.status == 200 else None
            dropped = f"{body.get('dropped')} dropped" if isinstance(body, dict) else a.error()
            return StepResult(
                "DELETE", 0, str(a.status), a.size, f"{dropped}; with_labels {estimate}", answer_bound=None
            )

        run.step(f"admin drops the labels of client:{ATTACKER}", drop)

    def label() -> StepResult:
        body = json.dumps({"labels": [{"id": i, "label": truth[i]} for i in sample]}).encode()
        with http_client() as h:
            headers = {"Content-Type": "application/json", **labeler_headers}
            posted = send(h, "POST", f"{url}/v1/labels", content=body, headers=headers)
            estimate = _with_labels(h, url)
        outcome = (
            f"{len(sample)} sampled ids labeled: {_label_counts(posted)}; with_labels {estimate}, truth {accuracy:.2f}"
        )
        return StepResult(size(len(body)), len(body), str(posted.status), posted.size, outcome)

    run.step("the real labeler's labels after it", label)


def admin_guessing(run: Runner, c: Context) -> None:
    n, url = c.sizes.guesses, c.agent.url

    def step() -> StepResult:
        statuses: list[int] = []
        retry_after, answer = None, 0
        with http_client(ATTACKER) as a, http_client() as h:
            t0 = time.monotonic()
            for i in range(n):
                r = a.post(f"{url}/v1/recalibrate", headers={"Authorization": f"Bearer guess-{i:08d}"})
                statuses.append(r.status_code)
                answer = max(answer, len(r.content))
                retry_after = retry_after or r.headers.get("retry-after")
            took = time.monotonic() - t0
            right = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            same = a.post(f"{url}/v1/recalibrate", headers=right).status_code
            other = h.post(f"{url}/v1/recalibrate", headers=right).status_code
        outcome = (
            f"{n:,} wrong tokens in {took:.1f} s ({tally(statuses)}); Retry-After {retry_after or 'none'}; "
            f"the right token then: {same} from the guesser, {other} from another client"
        )
        return StepResult(f"{n:,} POSTs", 0, tally(statuses), answer, outcome, answer_bound=None)

    run.step(f"{n:,} admin token guesses", step)


def _burst(n: int, one: Callable[[], tuple[str, int, str]]) -> list[tuple[str, int, str]]:
    out: list[tuple[str, int, str]] = []
    lock = threading.Lock()

    def run_one() -> None:
        r = one()
        with lock:
            out.append(r)

    threads = [threading.Thread(target=run_one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT + 30)
    return out


def burst(run: Runner, c: Context, protocol: str, batch: int) -> None:
    """``sizes.burst`` concurrent requests of ``batch`` random images, each on its own connection (HTTP) or
    as concurrent calls on one channel (gRPC)."""
    s = c.sizes
    x = np.random.default_rng(0).uniform(0, 255, (batch, 1, 28, 28)).astype(np.float32)
    if protocol == "http":
        body, headers = binary_request(x)
        n = len(body)

        def one() -> tuple[str, int, str]:
            try:
                with http_client() as h:
                    a = send(h, "POST", f"{c.agent.url}/v2/models/{MODEL}/infer", content=body, headers=headers)
                return str(a.status), a.size, a.error()
            except httpx.HTTPError as exc:
                return type(exc).__name__, 0, str(exc)[:160]
    else:
        req = grpc_request(x)
        n = req.ByteSize()
        channel, stub = grpc_stub(c.agent.grpc_target)

        def one() -> tuple[str, int, str]:
            return grpc_call(stub, req)[:3]

    def step() -> StepResult:
        results = _burst(s.burst, one)
        errors = sorted({e for _, _, e in results if e})
        outcome = f"{tally(r[0] for r in results)}" + (f"; {errors[0]}" if errors else "")
        largest = max((r[1] for r in results), default=0)
        request = f"{s.burst} × {size(n)}"
        return StepResult(request, n, tally(r[0] for r in results), largest, outcome, batch * OUTPUT_BYTES_PER_SAMPLE)

    try:
        run.step(f"{s.burst} concurrent batches of {batch} ({size(n)}), {protocol}", step)
    finally:
        if protocol != "http":
            channel.close()


@dataclass(frozen=True)
class Case:
    """A case: its steps, whether ``--quick`` runs it, the agent's tokens and whether the other clients
    send inferences (not in the label cases, whose window must hold only their own predictions)."""

    run: Callable[[Runner, Context], None]
    quick: bool
    labels_token: bool = True
    side_infer: bool = True


CASES: dict[str, Case] = {
    "id-http": Case(lambda r, c: long_id_http(r, c, c.sizes.long_id, c.sizes.long_id_batch), quick=True),
    "id-http-huge": Case(huge_id_then_listing, quick=False),
    "id-grpc": Case(long_id_grpc, quick=True),
    "parameters": Case(large_parameters, quick=True),
    "datatypes": Case(other_datatypes, quick=True),
    "labels-token": Case(lambda r, c: labels_poisoning(r, c, token=True), quick=True, side_infer=False),
    "labels-open": Case(
        lambda r, c: labels_poisoning(r, c, token=False), quick=False, labels_token=False, side_infer=False
    ),
    "guessing": Case(admin_guessing, quick=True),
    "burst-grpc": Case(lambda r, c: burst(r, c, "grpc", c.sizes.burst_batch), quick=True),
    "burst-http": Case(lambda r, c: burst(r, c, "http", c.sizes.burst_batch), quick=False),
    "burst-model": Case(lambda r, c: burst(r, c, "http", c.sizes.max_batch), quick=False),
}
