"""The invariant bundle directory: exact round trip, digests, model binding, atomic writes."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.naive_bayes import GaussianNB

from invariants.bundle import Bundle, BundleError, _canonical, _manifest_digest, sha256_file
from invariants.fit_params import FitParams
from invariants.fitting import fit_oracle
from invariants.idi import IdiRuleSet

DIGITS = [str(i) for i in range(10)]
MODEL_SHA = hashlib.sha256(b"the deployed model").hexdigest()
OTHER_SHA = hashlib.sha256(b"another model").hexdigest()
RULES = """
rules:
  - name: curves
    when: {field: group, equals: A}
    allowed_labels: [0, 3, 6, 8, 9]
"""


def groups(y: np.ndarray) -> np.ndarray:
    return np.where(np.isin(y, [0, 3, 6, 8, 9]), "A", "B")


@pytest.fixture(scope="module")
def data() -> dict[str, np.ndarray]:
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(5).permutation(y.shape[0])
    train, val, test = order[:800], order[800:1300], order[1300:]
    model = GaussianNB().fit(x[train], y[train])
    return {
        "train_x": x[train],
        "train_y": y[train],
        "val_x": x[val],
        "val_y": y[val],
        "val_p": model.predict_proba(x[val]),
        "test_x": x[test].astype(np.float32),
        "test_y": y[test],
        "test_p": model.predict_proba(x[test]).astype(np.float32),
    }


def make_bundle(data: dict[str, np.ndarray], with_idi: bool = True) -> Bundle:
    fitted = fit_oracle(
        data["train_x"],
        data["train_y"],
        data["val_x"],
        data["val_y"],
        data["val_p"],
        idi=IdiRuleSet.from_yaml(RULES, DIGITS) if with_idi else None,
        val_metadata={"group": groups(data["val_y"])},
        params=FitParams(n_estimators=20),
    )
    return Bundle.from_fitted(
        fitted,
        model_sha256=MODEL_SHA,
        input_shape=[8, 8],
        classes=DIGITS,
        estimator_calibration={"atc_threshold": np.float32(0.625), "bins": np.array([0.1, 0.5]), "n": 150},
    )


@pytest.fixture(scope="module")
def saved(data: dict[str, np.ndarray], tmp_path_factory: pytest.TempPathFactory) -> tuple[Bundle, Path]:
    bundle = make_bundle(data)
    return bundle, bundle.save(tmp_path_factory.mktemp("bundles") / "digits")


def judge(bundle: Bundle, data: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    p = data["test_p"]
    result = bundle.oracle().judge(data["test_x"], p, p.argmax(axis=1), {"group": groups(data["test_y"])})
    return result.verdict, result.rule


def copy_of(directory: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(directory, target)
    return target


def rewrite_manifest(directory: Path, **changes: object) -> None:
    """Edit the manifest the way a careful forger would: canonical form, fresh self-digest."""
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest.update(changes)
    manifest["manifest_sha256"] = _manifest_digest(manifest)
    path.write_text(_canonical(manifest) + "\n")


def test_round_trip_is_exact(saved: tuple[Bundle, Path], data: dict[str, np.ndarray], tmp_path: Path) -> None:
    bundle, directory = saved
    assert sorted(p.name for p in directory.iterdir()) == ["adi.onnx", "idi.yaml", "manifest.json", "tdi.json"]
    loaded = Bundle.load(directory, expected_model_sha256=MODEL_SHA)
    for a, b in zip(judge(bundle, data), judge(loaded, data), strict=True):
        assert np.array_equal(a, b)
    assert loaded.idi == bundle.idi
    assert loaded.tdi.rules == bundle.tdi.rules
    assert loaded.adi.onnx_bytes == bundle.adi.onnx_bytes
    assert loaded.calibration == bundle.calibration
    assert loaded.fit_params == bundle.fit_params
    assert (loaded.model_sha256, loaded.input_shape, loaded.classes) == (MODEL_SHA, [8, 8], DIGITS)
    assert loaded.feature_names is None
    assert loaded.estimator_calibration == {"atc_threshold": 0.625, "bins": [0.1, 0.5], "n": 150}
    assert loaded.created_at == bundle.created_at is not None
    again = loaded.save(tmp_path / "again")
    for name in ("manifest.json", "idi.yaml", "tdi.json", "adi.onnx"):
        assert (again / name).read_bytes() == (directory / name).read_bytes(), name


def test_manifest_holds_the_documented_keys(saved: tuple[Bundle, Path]) -> None:
    bundle, directory = saved
    manifest = json.loads((directory / "manifest.json").read_text())
    assert set(manifest) == {
        "format_version",
        "model_sha256",
        "input_shape",
        "classes",
        "feature_names",
        "fit_params",
        "calibration",
        "estimator_calibration",
        "files",
        "created_at",
        "entries_sha256",
        "manifest_sha256",
    }
    assert set(manifest["entries_sha256"]) == set(manifest) - {"entries_sha256", "manifest_sha256"} | {
        "estimator_calibration.atc_threshold",
        "estimator_calibration.bins",
        "estimator_calibration.n",
    }
    assert manifest["format_version"] == 1
    assert manifest["files"] == {name: sha256_file(directory / name) for name in ("adi.onnx", "idi.yaml", "tdi.json")}
    assert manifest["calibration"]["tp"] == bundle.calibration.tp
    assert {"tpr", "fpr", "f1", "tp", "fp", "tn", "fn", "n", "per_family"} <= set(manifest["calibration"])
    tdi = json.loads((directory / "tdi.json").read_text())
    assert {"tree", "leaves", "params"} <= set(tdi)
    assert tdi["leaves"][0]["text"].startswith("fail :- ")


@pytest.mark.parametrize("name", ["manifest.json", "idi.yaml", "tdi.json", "adi.onnx"])
def test_a_changed_byte_in_any_file_is_refused(saved: tuple[Bundle, Path], tmp_path: Path, name: str) -> None:
    _, directory = saved
    size = (directory / name).stat().st_size
    rng = np.random.default_rng(0)
    positions = sorted({0, size // 2, size - 1, *rng.integers(0, size, 12).tolist()})
    for position in positions:
        target = tmp_path / f"at-{position}"
        shutil.copytree(directory, target)
        raw = bytearray((target / name).read_bytes())
        raw[position] ^= 0x01
        (target / name).write_bytes(bytes(raw))
        with pytest.raises(BundleError) as caught:
            Bundle.load(target)
        message = str(caught.value)
        assert message.startswith(f"{name}: "), message
        if name != "manifest.json":
            assert message == f"{name}: sha256 mismatch (bundle tampered or corrupted)"


def test_an_edited_manifest_value_is_refused(saved: tuple[Bundle, Path], tmp_path: Path) -> None:
    _, directory = saved
    target = copy_of(directory, tmp_path)
    path = target / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["calibration"]["fpr"] = 0.0  # keeps canonical form, breaks the self-digest
    path.write_text(_canonical(manifest) + "\n")
    changed = r"^manifest\.json: sha256 mismatch \('calibration' changed\) \(bundle tampered or corrupted\)$"
    with pytest.raises(BundleError, match=changed):
        Bundle.load(target)
    manifest = json.loads((directory / "manifest.json").read_text())
    path.write_text(json.dumps(manifest))  # same content, reformatted
    with pytest.raises(BundleError, match=r"^manifest\.json: not in canonical form"):
        Bundle.load(target)


#: A segments part and a pair as the agent writes them (their meaning is the agent's; here they are entries).
SEGMENTS = {"format": 1, "kind": "table_column", "segments": ["color=red", 'color="blue"'], "ids": [0, 1]}
PAIR = {"format": 1, "champion_sha256": OTHER_SHA, "disagreement": {"bins": [0.5], "q_a": [0.4], "q_b": [0.6]}}


@pytest.fixture(scope="module")
def saved_with_parts(data: dict[str, np.ndarray], tmp_path_factory: pytest.TempPathFactory) -> Path:
    bundle = make_bundle(data, with_idi=False)
    bundle.estimator_calibration = {**bundle.estimator_calibration, "segments": SEGMENTS}
    bundle.pair = PAIR
    return bundle.save(tmp_path_factory.mktemp("bundles") / "with-parts")


def _tampered(value: object) -> object:
    """``value`` changed as a forger might (another number, one more item, another string)."""
    if isinstance(value, bool) or value is None:
        return "x"
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, list):
        return [*value, value[0] if value else 0]
    assert isinstance(value, dict)
    return {**value, "extra": 1}


@pytest.mark.parametrize(
    "entry",
    [
        "pair",
        "estimator_calibration.segments",
        "estimator_calibration.atc_threshold",
        "calibration",
        "classes",
        "fit_params",
        "files",
        "input_shape",
        "created_at",
    ],
)
def test_a_tampered_entry_is_refused_and_named(saved_with_parts: Path, tmp_path: Path, entry: str) -> None:
    target = copy_of(saved_with_parts, tmp_path)
    path = target / "manifest.json"
    manifest = json.loads(path.read_text())
    assert set(manifest["entries_sha256"]) >= {"pair", "estimator_calibration.segments"}
    outer, _, inner = entry.partition(".")
    if inner:
        manifest[outer][inner] = _tampered(manifest[outer][inner])
    else:
        manifest[outer] = _tampered(manifest[outer])
    path.write_text(_canonical(manifest) + "\n")  # canonical form kept: only the digest can tell
    with pytest.raises(BundleError) as caught:
        Bundle.load(target)
    assert str(caught.value) == f"manifest.json: sha256 mismatch ('{entry}' changed) (bundle tampered or corrupted)"


@pytest.mark.parametrize("entry", ["pair", "estimator_calibration.segments"])
def test_a_removed_or_added_entry_is_refused_and_named(saved_with_parts: Path, tmp_path: Path, entry: str) -> None:
    target = copy_of(saved_with_parts, tmp_path)
    path = target / "manifest.json"
    manifest = json.loads(path.read_text())
    outer, _, inner = entry.partition(".")
    if inner:
        del manifest[outer][inner]
    else:
        del manifest[outer]
    path.write_text(_canonical(manifest) + "\n")
    with pytest.raises(BundleError, match=rf"^manifest\.json: sha256 mismatch \('{entry}' removed\) "):
        Bundle.load(target)
    manifest = json.loads((saved_with_parts / "manifest.json").read_text())
    manifest["estimator_calibration"]["regions"] = {"format": 1}
    path.write_text(_canonical(manifest) + "\n")
    with pytest.raises(BundleError, match=r"\('estimator_calibration\.regions' added\)"):
        Bundle.load(target)


def test_a_manifest_without_entry_digests_is_refused_without_naming(saved: tuple[Bundle, Path], tmp_path: Path) -> None:
    """A bundle saved before the entry digests: an edit is refused all the same, by the whole manifest's digest."""
    target = copy_of(saved[1], tmp_path)
    path = target / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["entries_sha256"]
    manifest["manifest_sha256"] = _manifest_digest(manifest)
    path.write_text(_canonical(manifest) + "\n")
    assert Bundle.load(target).classes == DIGITS  # loads as it did before the entry digests
    manifest["classes"] = [*DIGITS[:-1], "x"]
    path.write_text(_canonical(manifest) + "\n")
    with pytest.raises(BundleError, match=r"^manifest\.json: sha256 mismatch \(bundle tampered or corrupted\)$"):
        Bundle.load(target)


def test_another_model_is_refused(saved: tuple[Bundle, Path]) -> None:
    _, directory = saved
    with pytest.raises(BundleError) as caught:
        Bundle.load(directory, expected_model_sha256=OTHER_SHA)
    assert str(caught.value) == (
        f"bundle was fitted for model sha256 {MODEL_SHA[:12]}… but the model is {OTHER_SHA[:12]}…: refit it for "
        "this model (`icos-agent fit --model <this model> ...`), or use the model it was fitted for"
    )
    assert Bundle.load(directory, expected_model_sha256=MODEL_SHA.upper()).model_sha256 == MODEL_SHA


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: (d / "tdi.json").unlink(), r"^tdi\.json: missing file$"),
        (lambda d: (d / "adi.onnx").unlink(), r"^adi\.onnx: missing file$"),
        (lambda d: (d / "manifest.json").unlink(), r"^manifest\.json: missing file$"),
        (lambda d: (d / "manifest.json").write_text("{not json"), r"^manifest\.json: malformed JSON"),
        (lambda d: (d / "manifest.json").write_text("[1, 2]"), r"^manifest\.json: malformed JSON"),
        (lambda d: (d / "manifest.json").write_text('{"format_version": NaN}'), r"^manifest\.json: malformed JSON"),
        (lambda d: rewrite_manifest(d, format_version=2), r"^manifest\.json: unsupported format_version 2"),
        (lambda d: rewrite_manifest(d, classes="0123"), r"^manifest\.json: 'classes' must be"),
        (lambda d: rewrite_manifest(d, model_sha256="abc"), r"^manifest\.json: 'model_sha256' must be"),
        (lambda d: rewrite_manifest(d, input_shape=[8, -1]), r"^manifest\.json: 'input_shape' must be"),
        (
            lambda d: rewrite_manifest(d, files={"../../etc/passwd": "0" * 64, "tdi.json": "", "adi.onnx": ""}),
            r"^manifest\.json: unexpected file '\.\./\.\./etc/passwd'",
        ),
        (lambda d: rewrite_manifest(d, files={"tdi.json": "0" * 64}), r"^manifest\.json: 'files' does not list"),
    ],
)
def test_damaged_bundles_fail_with_one_clear_line(
    saved: tuple[Bundle, Path], tmp_path: Path, damage: object, message: str
) -> None:
    _, directory = saved
    target = copy_of(directory, tmp_path)
    damage(target)  # type: ignore[operator]
    with pytest.raises(BundleError, match=message) as caught:
        Bundle.load(target)
    assert "\n" not in str(caught.value)


def test_payload_that_passes_digests_but_does_not_parse_names_the_file(
    saved: tuple[Bundle, Path], tmp_path: Path
) -> None:
    _, directory = saved
    for name, content, message in [
        ("tdi.json", b'{"format": 1', r"^tdi\.json: malformed JSON"),
        ("tdi.json", b"{}", r"^tdi\.json: unsupported TDI format"),
        ("idi.yaml", b"rules: [{name: x}]", r"^idi\.yaml: rule 1 \('x'\)"),
        ("adi.onnx", b"garbage", r"^adi\.onnx: cannot load ONNX model"),
    ]:
        target = tmp_path / f"{name}-{len(content)}"
        shutil.copytree(directory, target)
        (target / name).write_bytes(content)
        manifest = json.loads((target / "manifest.json").read_text())
        rewrite_manifest(target, files={**manifest["files"], name: hashlib.sha256(content).hexdigest()})
        with pytest.raises(BundleError, match=message):
            Bundle.load(target)
    with pytest.raises(BundleError, match="no such bundle directory"):
        Bundle.load(tmp_path / "absent")


def test_save_replaces_a_bundle_atomically_and_refuses_other_directories(
    data: dict[str, np.ndarray], saved: tuple[Bundle, Path], tmp_path: Path
) -> None:
    bundle, _ = saved
    target = tmp_path / "bundle"
    bundle.save(target)
    no_idi = make_bundle(data, with_idi=False)
    no_idi.save(target)  # overwrite an existing bundle
    assert sorted(p.name for p in target.iterdir()) == ["adi.onnx", "manifest.json", "tdi.json"]
    assert Bundle.load(target).idi is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]  # no staging or retired directories left
    empty = tmp_path / "empty"
    empty.mkdir()
    bundle.save(empty)
    assert (empty / "manifest.json").is_file()
    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(BundleError, match="not an invariant bundle; refusing to overwrite"):
        bundle.save(precious)
    assert (precious / "notes.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("x")
    with pytest.raises(BundleError, match="refusing to overwrite"):
        bundle.save(tmp_path / "file")


def test_unserialisable_values_are_refused_before_writing(saved: tuple[Bundle, Path], tmp_path: Path) -> None:
    bundle, _ = saved
    broken = Bundle(**{**bundle.__dict__, "estimator_calibration": {"threshold": float("nan")}})
    with pytest.raises(BundleError, match=r"^manifest\.json: cannot serialise"):
        broken.save(tmp_path / "nan")
    bad_sha = Bundle(**{**bundle.__dict__, "model_sha256": "abc123"})
    with pytest.raises(BundleError, match="model_sha256 must be a hex sha256"):
        bad_sha.save(tmp_path / "sha")
    assert not (tmp_path / "nan").exists() and not (tmp_path / "sha").exists()


def test_loading_and_judging_never_import_sklearn(saved: tuple[Bundle, Path], data: dict[str, np.ndarray]) -> None:
    _, directory = saved
    code = textwrap.dedent(
        f"""
        import sys
        import numpy as np
        from invariants.bundle import Bundle
        bundle = Bundle.load({str(directory)!r})
        rng = np.random.default_rng(0)
        x = rng.uniform(0, 16, (50, 64)).astype(np.float32)
        p = rng.dirichlet(np.ones(10), 50).astype(np.float32)
        result = bundle.oracle().judge(x, p, p.argmax(1), {{"group": "A"}})
        assert len(result) == 50
        print(",".join(sorted(m for m in sys.modules if m.split(".")[0] in ("sklearn", "skl2onnx", "joblib"))))
        """
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120, cwd=root
    )
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("name", ["manifest.json", "tdi.json", "adi.onnx"])
def test_a_link_out_of_the_bundle_is_refused(saved: tuple[Bundle, Path], tmp_path: Path, name: str) -> None:
    """A bundle file that is a link leading elsewhere is refused before it is read, even when the target
    holds the right bytes: the bundle directory is what security.allowed_roots vetted."""
    _, directory = saved
    target = copy_of(directory, tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / name).write_bytes((target / name).read_bytes())
    (target / name).unlink()
    (target / name).symlink_to(outside / name)
    with pytest.raises(BundleError, match=f"{name}: a link that leads outside the bundle directory"):
        Bundle.load(target)


def test_links_inside_the_bundle_are_followed(saved: tuple[Bundle, Path], tmp_path: Path) -> None:
    """Kubernetes ConfigMap and Secret volumes present every file as a link into a hidden folder beside it."""
    _, directory = saved
    mounted = tmp_path / "mounted"
    hidden = mounted / "..data"
    shutil.copytree(directory, hidden)
    for f in hidden.iterdir():
        (mounted / f.name).symlink_to(Path("..data") / f.name)
    assert Bundle.load(mounted).classes == Bundle.load(directory).classes
