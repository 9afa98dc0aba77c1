"""The fleet evaluator parses Prometheus answers in its refresh thread without holding the GIL throughout:
other threads (the app's event loop: liveness, ``/metrics``) run while a large answer is parsed, and the
parse gives the same document ``json.loads`` gives."""

from __future__ import annotations

import json
import threading
import time

from agent.fleet.prometheus_api import _parse

SERIES = 60_000


def _answer(n: int) -> bytes:
    result = [
        {"metric": {"__name__": "icos_window_stat", "model": "m", "version": f"v{i}", "stat": "n"}, "value": [1.5, "1"]}
        for i in range(n)
    ]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def test_the_parse_gives_the_document_json_gives() -> None:
    raw = _answer(50) + b" "
    assert _parse(raw) == json.loads(raw)
    assert _parse(b'{"a": [1, 2.5, -3e2, {"b": null}], "a2": true}') == {"a": [1, 2.5, -300.0, {"b": None}], "a2": True}


def test_other_threads_run_while_a_large_answer_is_parsed() -> None:
    """A thread polling while another parses 60,000 series gets the GIL many times during the parse (one
    ``json.loads`` call into C would hold it from start to end)."""
    raw = _answer(SERIES)
    parsing, done = threading.Event(), threading.Event()

    def parse() -> None:
        parsing.set()
        try:
            _parse(raw)
        finally:
            parsing.clear()
            done.set()

    worker = threading.Thread(target=parse)
    turns = 0
    worker.start()
    for _ in range(10_000_000):  # bounded; ends with the parse
        if done.is_set():
            break
        if parsing.is_set():
            turns += 1
        time.sleep(0.0005)
    worker.join(timeout=60)
    assert turns >= 5, turns
