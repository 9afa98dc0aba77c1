"""``judging.sample_rate``: a uniform random share of the requests that do not ask for verdicts is judged;
the rest are answered, counted in ``icos_unjudged_predictions_total`` and left out of the windows, whose
estimates rest on the judged predictions only. Requests that ask for ``icos_verdict`` are always judged."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np

from agent.data.datasets import Splits
from tests.support.inprocess import RunningServer
from tests.support.metrics import scrape
from tests.support.settings import mnist_app
from tests.support.v2 import infer_body
from tests.support.waiting import wait_until


def test_a_quarter_of_the_requests_are_judged_and_every_verdict_asked_for(
    run_server: Callable[..., RunningServer], mnist_bundle_dir: Path, mnist_splits: Splits
) -> None:
    srv = run_server(
        mnist_app(mnist_bundle_dir, judging={"sample_rate": 0.25}, windows={"time": ["5m"], "count": 10000})
    )
    x = mnist_splits.test.x[:400]
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        for i in range(400):  # one prediction per request: 400 draws
            body = infer_body(x[i : i + 1], outputs=("label",))  # no verdicts asked for
            assert c.post("/v2/models/mnist/infer", json=body).status_code == 200
        asked = c.post("/v2/models/mnist/infer", json=infer_body(x[:50], outputs=("label", "icos_verdict")))
        assert asked.status_code == 200
        assert len(asked.json()["outputs"][1]["data"]) == 50

    def judged() -> int:
        return int(httpx.get(f"{srv.url}/v1/estimates").json()["total_judged"])

    unjudged = scrape(srv.url).value("icos_unjudged_predictions_total")  # counted before the answer
    assert wait_until(lambda: judged() + unjudged == 450, 10), (judged(), unjudged)
    sampled = judged() - 50  # the 50 that asked for their verdicts are all judged
    # Binomial(400, 0.25): 100 ± 8.7; a wide band, so the test fails only if the rate is not applied
    assert 50 < sampled < 150, sampled
    window = httpx.get(f"{srv.url}/v1/estimates").json()["windows"]["5m"]
    assert window["n"] == judged()
    assert all(e["n"] == judged() for e in window["estimates"].values())
    assert np.isclose(scrape(srv.url).value("icos_predictions_total"), judged())
