"""A corpus of malformed config files, IDI rule files and bundles: each is refused at start with one
clear line naming the file and the field, a non-zero exit and no traceback.

* ``configs/*.yaml`` → ``icos-agent serve --config FILE --check``
* ``idi/*.yaml`` → ``icos-agent fit ... --idi FILE``
* bundle corruptions (recipes below, applied to a copy of the fitted test bundle; some re-sign the
  manifest so that parsing, not the digest check, has to catch them) → ``icos-agent check --bundle``

The first line of every corpus file is ``# expect: <text>``: the error line must contain it.
The CLI runs in-process (same code path as the console script); one case per kind also runs it as a
real subprocess to check the exit status and the absence of a traceback end to end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from agent.cli import main
from agent.data.datasets import Splits
from agent.model.classifier import default_model_path
from invariants.bundle import _canonical, _manifest_digest, sha256_bytes
from tests.support.agent_process import clean_env

HERE = Path(__file__).parent
CONFIGS = sorted((HERE / "configs").glob("*.yaml"))
IDI_FILES = sorted((HERE / "idi").glob("*.yaml"))
MODEL = str(default_model_path())


def expectation(path: Path) -> str:
    first = path.read_bytes().split(b"\n", 1)[0].decode()
    assert first.startswith("# expect: "), f"{path.name}: first line must be '# expect: <text>'"
    return first[len("# expect: ") :].strip()


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    env_before = os.environ.pop("ICOS_AGENT_DEBUG", None)
    try:
        code = main(argv)
    finally:
        if env_before is not None:
            os.environ["ICOS_AGENT_DEBUG"] = env_before
    return code, capsys.readouterr().err


def error_line(code: int, err: str, command: str) -> str:
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("  ")]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"icos-agent {command}: error: "), lines[0]
    return lines[0]


def test_corpus_is_large_enough() -> None:
    assert len(CONFIGS) >= 20 and len(IDI_FILES) >= 10
    assert len(BUNDLE_CORRUPTIONS) >= 10


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_malformed_config(path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("ICOS_AGENT_")]:
        monkeypatch.delenv(key)
    line = error_line(*run_cli(["serve", "--config", str(path), "--check"], capsys), "serve")
    assert expectation(path) in line, line
    # the file is named: by its name (config errors) or by the path it points at
    assert path.name in line or expectation(path) in line


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory, mnist_splits: Splits) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("fuzz-data")
    train, val = root / "train.npz", root / "val.npz"
    np.savez(train, x=mnist_splits.train.x[:50], y=mnist_splits.train.y[:50])
    np.savez(val, x=mnist_splits.val.x[:50], y=mnist_splits.val.y[:50])
    return train, val


@pytest.mark.parametrize("path", IDI_FILES, ids=[p.stem for p in IDI_FILES])
def test_malformed_idi_rules(
    path: Path, tiny_data: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train, val = tiny_data
    argv = ["fit", "--model", MODEL, "--train", str(train), "--val", str(val), "--idi", str(path)]
    line = error_line(*run_cli([*argv, "--out", str(tmp_path / "out")], capsys), "fit")
    assert path.name in line, line
    assert expectation(path) in line, line
    assert not (tmp_path / "out").exists()


# -- bundles ------------------------------------------------------------------------------------------
def _resign(root: Path, edit: Callable[[dict[str, object]], None]) -> None:
    """Edit the manifest and write it back with valid digests (a well-formed but wrong bundle)."""
    manifest = json.loads((root / "manifest.json").read_text())
    edit(manifest)
    files = manifest["files"]
    assert isinstance(files, dict)
    for name in list(files):
        if (root / name).is_file():
            files[name] = sha256_bytes((root / name).read_bytes())
    manifest["manifest_sha256"] = _manifest_digest(manifest)
    (root / "manifest.json").write_text(_canonical(manifest) + "\n")


def _replace_signed(name: str, data: bytes) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        (root / name).write_bytes(data)
        _resign(root, lambda m: None)

    return apply


def _set_key(key: str, value: object) -> Callable[[Path], None]:
    return lambda root: _resign(root, lambda m: m.__setitem__(key, value))


def _flip(name: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        data = bytearray((root / name).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (root / name).write_bytes(bytes(data))

    return apply


def _add_file(root: Path) -> None:
    (root / "extra.bin").write_bytes(b"x")
    _resign(root, lambda m: m["files"].__setitem__("extra.bin", "0" * 64))  # type: ignore[attr-defined]


BUNDLE_CORRUPTIONS: dict[str, tuple[Callable[[Path], None], str]] = {
    "manifest-missing": (lambda r: (r / "manifest.json").unlink(), "manifest.json"),
    "manifest-not-json": (lambda r: (r / "manifest.json").write_text("{not json"), "manifest.json"),
    "manifest-edited": (
        lambda r: (r / "manifest.json").write_text((r / "manifest.json").read_text().replace('"0"', '"zero"', 1)),
        "manifest.json",
    ),
    "tdi-flipped-byte": (_flip("tdi.json"), "tdi.json"),
    "adi-flipped-byte": (_flip("adi.onnx"), "adi.onnx"),
    "adi-missing": (lambda r: (r / "adi.onnx").unlink(), "adi.onnx"),
    "tdi-not-json-signed": (_replace_signed("tdi.json", b"[1, 2"), "tdi.json"),
    "tdi-wrong-shape-signed": (_replace_signed("tdi.json", b'{"nodes": "many"}'), "tdi.json"),
    "adi-not-onnx-signed": (_replace_signed("adi.onnx", b"not a protobuf"), "adi.onnx"),
    "idi-python-tag-signed": (
        _replace_signed("idi.yaml", b"rules: !!python/object/apply:os.system [id]\n"),
        "idi.yaml",
    ),
    "idi-unknown-label-signed": (
        _replace_signed(
            "idi.yaml", b"rules:\n  - name: r\n    when: {field: f, equals: a}\n    allowed_labels: [99]\n"
        ),
        "idi.yaml",
    ),
    "format-version": (_set_key("format_version", 99), "format_version"),
    "classes-not-list": (_set_key("classes", "0123456789"), "classes"),
    "input-shape-negative": (_set_key("input_shape", [-1, 28, 28]), "input_shape"),
    "model-sha-other": (_set_key("model_sha256", "ab" * 32), "sha256"),
    "unexpected-file": (_add_file, "extra.bin"),
}


@pytest.fixture(scope="module")
def check_data(tmp_path_factory: pytest.TempPathFactory, mnist_splits: Splits) -> Path:
    path = tmp_path_factory.mktemp("fuzz-check") / "data.npz"
    np.savez(path, x=mnist_splits.test.x[:20], y=mnist_splits.test.y[:20])
    return path


@pytest.mark.parametrize("name", sorted(BUNDLE_CORRUPTIONS))
def test_corrupt_bundle(
    name: str, mnist_bundle_dir: Path, check_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corrupt, mention = BUNDLE_CORRUPTIONS[name]
    bundle = tmp_path / "bundle"
    shutil.copytree(mnist_bundle_dir, bundle)
    corrupt(bundle)
    argv = ["check", "--model", MODEL, "--bundle", str(bundle), "--data", str(check_data), "--json"]
    line = error_line(*run_cli(argv, capsys), "check")
    assert mention in line, line


def test_as_real_processes(mnist_bundle_dir: Path, check_data: Path, tmp_path: Path) -> None:
    """The console entry point itself: exit status 2, one line on stderr, nothing on stdout."""
    bundle = tmp_path / "bundle"
    shutil.copytree(mnist_bundle_dir, bundle)
    _flip("tdi.json")(bundle)
    env = clean_env()
    for argv in (
        ["serve", "--config", str(HERE / "configs" / "port-too-big.yaml")],
        ["check", "--model", MODEL, "--bundle", str(bundle), "--data", str(check_data)],
    ):
        out = subprocess.run(
            [sys.executable, "-m", "agent", *argv], capture_output=True, text=True, timeout=120, env=env
        )
        assert out.returncode == 2, out.stderr
        assert "Traceback" not in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert out.stdout == ""
