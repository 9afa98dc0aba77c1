"""``icos-agent labels``: send delayed true labels from a CSV or JSON-lines file to a running agent,
or ask it which predictions its labeling sample wants labeled.

Each row names a prediction id (``<request id>:<index>``: the answer's ``id`` and the index of the
prediction in the batch, below ``icos_prediction_count``) and its true class (an index or a class
name). Rows are posted to ``POST /v1/labels`` in chunks; the summary adds up the agent's answers
(accepted, unknown, duplicate, corrected, invalid). ``--requests N`` prints the newest ``N`` sampled predictions
still without a label (``GET /v1/labels/requests``) as CSV (``id,timestamp``), ready for a labeling job.

``labels export`` and ``labels import`` take the sample, with its kept inputs, to a labeling tool and
its annotations back (:mod:`agent.commands.label_studio`).

Where the agent requires the labelers' token (``ICOS_AGENT_LABELS_TOKEN`` set on the agent), the command
sends it from the same environment variable, or from ``--token-file`` (e.g. a mounted Secret).
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agent.commands.label_studio import export_tasks, image_shape_arg, labels_of_export, read_export
from agent.config.settings import LABELS_TOKEN_ENV, labels_token
from agent.errors import UserError

OUTCOMES = ("accepted", "unknown", "duplicate", "corrected", "invalid")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("labels", help="send delayed true labels (CSV or JSON lines) to a running agent")
    p.add_argument("--url", help="the agent's base URL, e.g. http://127.0.0.1:8080")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--file", help="labels to send: .csv (with a header) or .jsonl (one object per line)")
    what.add_argument(
        "--requests",
        type=int,
        metavar="N",
        help="print the newest N (1-1000) predictions of the labeling sample still without a label, as CSV",
    )
    p.add_argument("--id-column", default="id", help="column / key of the prediction id (default: id)")
    p.add_argument("--label-column", default="label", help="column / key of the true class (default: label)")
    p.add_argument("--chunk-size", type=int, default=1000, help="labels per request (default: 1000)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per request (default: 30)")
    p.add_argument(
        "--token-file",
        type=Path,
        help=f"a file holding the labelers' bearer token (default: the environment variable {LABELS_TOKEN_ENV})",
    )
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)
    tools = p.add_subparsers(dest="labels_action", metavar="{export,import}")
    exp = tools.add_parser("export", help="write the labeling sample with its inputs as labeling-tool tasks")
    _common(exp)
    exp.add_argument("--format", choices=["label-studio"], default="label-studio", help="the tool (label-studio)")
    exp.add_argument("--out", type=Path, required=True, help="the folder to write tasks, config and images into")
    exp.add_argument("--limit", type=int, default=1000, help="predictions at most, newest first (1-1000)")
    exp.add_argument("--inline-images", action="store_true", help="images as PNG data URIs in the tasks")
    exp.add_argument(
        "--image-shape",
        type=image_shape_arg,
        help="reshape flat numeric inputs into images, e.g. 8x8 (default: only inputs shaped as images are)",
    )
    exp.add_argument(
        "--image-url-prefix",
        default="/data/local-files/?d=",
        help="prefix of the images' paths inside --out in the tasks (default: Label Studio's local files, "
        "with LOCAL_FILES_DOCUMENT_ROOT set to --out)",
    )
    exp.set_defaults(func=run_export)
    imp = tools.add_parser("import", help="post the annotations of a Label Studio JSON export as labels")
    _common(imp)
    imp.add_argument("file", type=Path, help="Label Studio's JSON export of the tasks")
    imp.add_argument("--chunk-size", type=int, default=1000, help="labels per request (default: 1000)")
    imp.set_defaults(func=run_import)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="the agent's base URL, e.g. http://127.0.0.1:8080")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per request (default: 30)")
    p.add_argument("--token-file", type=Path, help=f"the labelers' bearer token (default: ${LABELS_TOKEN_ENV})")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")


def _label_value(text: str) -> int | str:
    t = text.strip()
    return int(t) if t.lstrip("-").isdigit() else t


def read_labels(path: Path, id_column: str, label_column: str) -> Iterator[dict[str, Any]]:
    """Rows ``{"id": ..., "label": ...}`` of a CSV (header row) or JSON-lines file."""
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".jsonl", ".ndjson"):
        raise UserError(f"{path}: unsupported file type {suffix or '(none)'}; use .csv or .jsonl")
    with path.open(encoding="utf-8", newline="") as f:
        if suffix == ".csv":
            reader = csv.DictReader(f)
            missing = [c for c in (id_column, label_column) if c not in (reader.fieldnames or [])]
            if missing:
                raise UserError(f"{path}: no column {', '.join(map(repr, missing))} (columns: {reader.fieldnames})")
            for row in reader:
                yield {"id": row[id_column], "label": _label_value(row[label_column] or "")}
            return
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                raise UserError(f"{path}:{lineno}: not a JSON object") from None
            if not isinstance(obj, dict) or id_column not in obj or label_column not in obj:
                raise UserError(f"{path}:{lineno}: needs the keys {id_column!r} and {label_column!r}")
            yield {"id": obj[id_column], "label": obj[label_column]}


def _chunks(rows: Iterator[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    chunk: list[dict[str, Any]] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def auth_headers(token_file: Path | None) -> dict[str, str]:
    """The ``Authorization`` header of the labelers' token (none when no token is given)."""
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise UserError(f"--token-file: cannot read {token_file}: {exc.strerror}") from None
        if not token:
            raise UserError(f"--token-file: {token_file} is empty")
    else:
        token = labels_token() or ""
    return {"Authorization": f"Bearer {token}"} if token else {}


def send_labels(
    url: str,
    rows: Iterator[dict[str, Any]],
    *,
    chunk_size: int,
    timeout: float,
    progress: bool,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Post the rows in chunks; the summed counts and the first problems the agent reported."""
    # lazy: keeps httpx and tqdm out of CLI start-up
    import httpx
    from tqdm import tqdm

    totals = dict.fromkeys(OUTCOMES, 0)
    problems: list[dict[str, Any]] = []
    endpoint = url.rstrip("/") + "/v1/labels"
    bar = tqdm(desc="labels", unit="label", disable=not progress, leave=False, file=sys.stderr)
    try:
        with httpx.Client(timeout=timeout, headers=headers or {}) as client:
            for chunk in _chunks(rows, chunk_size):
                body = _answer(endpoint, functools.partial(client.post, endpoint, json={"labels": chunk}))
                for k in OUTCOMES:
                    totals[k] += int(body.get(k, 0))
                problems.extend(body.get("problems", [])[: max(0, 20 - len(problems))])
                bar.update(len(chunk))
    finally:
        bar.close()
    return {**totals, "sent": sum(totals.values()), "problems": problems}


def label_requests(url: str, limit: int, timeout: float, headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The agent's ``GET /v1/labels/requests?limit=...`` entries (``id``, ``timestamp``)."""
    return list(sample_listing(url, limit, timeout, headers)["requests"])


def sample_listing(
    url: str, limit: int, timeout: float, headers: dict[str, str] | None = None, inputs: bool = False
) -> dict[str, Any]:
    """The agent's ``GET /v1/labels/requests`` answer (with ``inputs``: the kept inputs and the classes)."""
    import httpx

    endpoint = url.rstrip("/") + "/v1/labels/requests"
    params: dict[str, Any] = {"limit": limit, "inputs": "true" if inputs else "false"}
    answer = _answer(endpoint, lambda: httpx.get(endpoint, params=params, timeout=timeout, headers=headers or {}))
    return dict(answer)


def run_export(args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= 1000:
        raise UserError("--limit must be from 1 to 1000")
    listing = sample_listing(args.url, args.limit, args.timeout, auth_headers(args.token_file), inputs=True)
    if listing["requests"] and all(e.get("inputs") is None for e in listing["requests"]):
        raise UserError(
            "the agent kept no inputs of its labeling sample: turn on labels.keep_sampled_inputs "
            "(inputs are kept from then on)"
        )
    summary = export_tasks(
        listing,
        args.out,
        inline_images=args.inline_images,
        image_shape=args.image_shape,
        url_prefix=args.image_url_prefix,
    )
    summary["truncated"] = bool(listing.get("truncated"))
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"{summary['tasks']} {summary['kind']} tasks written to {args.out} (tasks.json, labeling_config.xml); "
            f"{summary['without_inputs']} sampled predictions without kept inputs"
        )
    return 0


def run_import(args: argparse.Namespace) -> int:
    if args.chunk_size < 1:
        raise UserError("--chunk-size must be at least 1")
    exported = read_export(args.file)
    headers = auth_headers(args.token_file)
    classes = [str(c) for c in sample_listing(args.url, 1, args.timeout, headers, inputs=True)["classes"]]
    labels, counts = labels_of_export(exported, classes)
    summary = send_labels(
        args.url, iter(labels), chunk_size=args.chunk_size, timeout=args.timeout, progress=False, headers=headers
    )
    summary["without_annotation"] = counts["without_annotation"]
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"{summary['sent']} labels sent: "
            + ", ".join(f"{summary[k]} {k}" for k in OUTCOMES)
            + f"; {counts['without_annotation']} tasks without an annotation"
        )
    return 0


def _answer(endpoint: str, call: Callable[[], Any]) -> Any:
    """The JSON body of ``call()``'s 200 answer from ``endpoint``; a :class:`UserError` naming the
    endpoint when it cannot be reached or answers anything else (with the agent's ``error``)."""
    import httpx

    try:
        r = call()
    except httpx.HTTPError as exc:
        raise UserError(f"cannot reach the agent at {endpoint}: {exc}") from None
    if r.status_code != 200:
        try:
            message = r.json().get("error", r.text)
        except ValueError:
            message = r.text
        hint = ""
        if r.status_code in (401, 403):
            hint = f" (the agent wants the labelers' token: set {LABELS_TOKEN_ENV} or pass --token-file)"
        raise UserError(f"{endpoint} answered {r.status_code}: {message}{hint}")
    return r.json()


def run(args: argparse.Namespace) -> int:
    if args.url is None or (args.file is None and args.requests is None):
        raise UserError("labels: give --url and --file or --requests, or use labels export / labels import")
    if args.requests is not None:
        if not 1 <= args.requests <= 1000:
            raise UserError("--requests must be from 1 to 1000")
        wanted = label_requests(args.url, args.requests, args.timeout, auth_headers(args.token_file))
        if args.json:
            print(json.dumps({"requests": wanted}))
        else:
            w = csv.writer(sys.stdout, lineterminator="\n")
            w.writerow(["id", "timestamp"])
            w.writerows([r["id"], r["timestamp"]] for r in wanted)
        return 0
    if args.chunk_size < 1:
        raise UserError("--chunk-size must be at least 1")
    path = Path(args.file)
    if not path.is_file():
        raise UserError(f"labels file not found: {path}")
    rows = read_labels(path, args.id_column, args.label_column)
    summary = send_labels(
        args.url,
        rows,
        chunk_size=args.chunk_size,
        timeout=args.timeout,
        progress=not (args.no_progress or args.json),
        headers=auth_headers(args.token_file),
    )
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{summary['sent']} labels sent: " + ", ".join(f"{summary[k]} {k}" for k in OUTCOMES))
        for p in summary["problems"][:5]:
            print(f"  {p.get('id')}: {p.get('error')}")
    return 0
