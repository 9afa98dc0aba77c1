"""The worked example of docs/challenger.md, run as a user runs it (``python -m bench.challenger --example``):
the shipped MNIST CNN is the champion, the same recipe retrained on drifted data (``models/mnist_drift.onnx``)
the challenger; both bundles are fitted with ``icos-agent fit`` (the challenger's with ``--champion``), and
``icos-agent check --challenger`` compares them on rotated test digits, label-free and with 100 labels. Every
command runs in a subprocess, and the block shows each command with what it printed."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
CHAMPION = "agent/shipped_models/mnist_cnn.onnx"
CHALLENGER = "bench/challenger/models/mnist_drift.onnx"
#: The challenger section's lines of ``check``'s printed report (the rest is the champion's own report).
SECTION = "challenger: agrees"


def drifted(x: np.ndarray, seed: int = 3, degrees: float = 35.0) -> np.ndarray:
    """MNIST images rotated by up to ``degrees`` (one draw per image, seeded): the champion loses accuracy
    there, the version retrained on drifted data less."""
    from scipy import ndimage

    rng = np.random.default_rng(seed)
    out = np.empty_like(x)
    for i, img in enumerate(x[:, 0]):
        out[i, 0] = np.clip(ndimage.rotate(img, rng.uniform(-degrees, degrees), reshape=False, order=1), 0, 255)
    return out.astype(np.float32)


def _run(args: list[str], cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "agent", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"icos-agent {' '.join(args)} failed: {done.stderr[-2000:]}")
    return done.stdout


def example() -> str:
    """Run the example's commands; the Markdown of what they printed."""
    from agent.data.datasets import mnist_splits

    s = mnist_splits()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        np.savez(work / "train.npz", x=s.train.x, y=s.train.y)
        np.savez(work / "val.npz", x=s.val.x, y=s.val.y)
        np.savez(work / "rotated.npz", x=drifted(s.test.x), y=s.test.y)
        for path in (CHAMPION, CHALLENGER):
            (work / Path(path).name).write_bytes((ROOT / path).read_bytes())
        data = ["--train", "train.npz", "--val", "val.npz"]
        fit_a = ["fit", "--model", "mnist_cnn.onnx", *data, "--out", "champion"]
        fit_b = ["fit", "--model", "mnist_drift.onnx", *data, "--champion", "mnist_cnn.onnx", "--out", "challenger"]
        check = ["check", "--model", "mnist_cnn.onnx", "--bundle", "champion", "--data", "rotated.npz"]
        check += ["--challenger", "mnist_drift.onnx", "--challenger-bundle", "challenger"]
        _run(fit_a, work)
        fitted = [line for line in _run(fit_b, work).splitlines() if "challenger of the champion" in line]
        printed = _run(check, work).splitlines()
        section = printed[next(i for i, line in enumerate(printed) if line.startswith(SECTION)) :]
        labeled = json.loads(_run([*check, "--labels", "100", "--json"], work))["challenger"]
    lines = [
        "```console",
        f"$ icos-agent {' '.join(fit_a)}",
        f"$ icos-agent {' '.join(fit_b)}",
        *fitted,
        f"$ icos-agent {' '.join(check)}",
        "...",
        *section,
        f"$ icos-agent {' '.join(check)} --labels 100 --json | jq .challenger.difference",
        json.dumps(labeled["difference"], indent=2),
        "```",
    ]
    return "\n".join(lines)
