"""The model zoo (bench/zoo): every entry builds, onnxruntime runs it on its declared inputs, it is a real
classifier (neither chance nor perfect) and each of its shifts lowers its accuracy; the files it writes read
back; text pipelines exported the usual way load where the en_US.UTF-8 locale exists."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from bench.zoo import NAMES, ZooModel, build
from bench.zoo.core import Split
from bench.zoo.files import read_image_folder, write_image_folder, write_npy, write_npz_shards
from bench.zoo.string_locale import (
    MISSING_LOCALE_MARK,
    PORTABLE_LOCALE,
    default_locale_missing,
    locale_error,
    normalizer_model,
)
from invariants.onnx_session import OnnxSession

ROOT = Path(__file__).resolve().parents[2]

#: Under ``CI=true`` a missing locale is an error, not a skip: nothing a CI run needs may silently skip.
CI = os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}
#: Accuracy in distribution: above chance by this much, and below 1.
MARGIN_OVER_CHANCE = 0.3
#: Accuracy lost under each shift at strength 1, at least.
MIN_DROP = 0.1


def require_en_us_locale() -> None:
    """Skip (fail under ``CI=true``) where onnxruntime cannot load skl2onnx's usual text export."""
    missing = default_locale_missing()
    if missing is None:
        return
    if CI:
        pytest.fail(f"CI=true, where a skip is an error: {missing}", pytrace=False)
    pytest.skip(missing)


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("zoo")


def _entry(name: str, zoo_dir: Path) -> ZooModel:
    if name == "text_tfidf":
        require_en_us_locale()
    return build(name, zoo_dir, seed=0)


@pytest.mark.parametrize("name", NAMES)
def test_entry_runs_on_its_declared_inputs_and_is_a_real_classifier(name: str, zoo_dir: Path) -> None:
    model = _entry(name, zoo_dir)
    session = OnnxSession(model.onnx_bytes)
    assert [(i.name, i.onnx_type) for i in session.inputs] == [(s.name, s.onnx_type) for s in model.inputs]
    assert set(model.test.inputs) == set(model.input_names)
    for spec in model.inputs:
        arr = model.test.inputs[spec.name]
        assert arr.dtype == spec.numpy_dtype, (spec.name, arr.dtype)
        assert arr.ndim == len(spec.shape)
        assert all(d is None or isinstance(d, str) or arr.shape[i] == d for i, d in enumerate(spec.shape))
    probs = model.probabilities(model.test)
    assert probs.shape == (len(model.test), len(model.classes))
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-4)
    accuracy = float((probs.argmax(axis=1) == model.test.y).mean())
    chance = float(np.bincount(model.test.y).max() / len(model.test))
    assert chance + MARGIN_OVER_CHANCE < accuracy < 1.0, (name, accuracy, chance)


@pytest.mark.parametrize("name", NAMES)
def test_each_shift_is_identity_at_zero_and_lowers_accuracy_when_strong(name: str, zoo_dir: Path) -> None:
    model = _entry(name, zoo_dir)
    test = model.test.take(slice(0, 600))
    base = model.accuracy(test)
    assert model.shifts
    for kind in model.shifts:
        same = model.shift(test, 0.0, seed=1, kind=kind)
        for k, v in test.inputs.items():
            assert np.array_equal(np.asarray(same.inputs[k]), np.asarray(v)), (kind, k)
        strong = model.shift(test, 1.0, seed=1, kind=kind)
        assert set(strong.inputs) == set(test.inputs)
        assert all(strong.inputs[k].dtype == v.dtype for k, v in test.inputs.items())
        shifted = model.accuracy(strong)
        assert shifted < base - MIN_DROP, (name, kind, base, shifted)
        again = model.shift(test, 1.0, seed=1, kind=kind)
        assert all(np.array_equal(np.asarray(again.inputs[k]), np.asarray(strong.inputs[k])) for k in test.inputs)
    with pytest.raises(ValueError, match="strength"):
        model.shift(test, 1.5)


def test_builds_are_seeded_and_cached(tmp_path: Path) -> None:
    a = build("tabular_categorical", tmp_path / "a", seed=3, sizes=(400, 200, 200))
    b = build("tabular_categorical", tmp_path / "b", seed=3, sizes=(400, 200, 200))
    c = build("tabular_categorical", tmp_path / "a", seed=4, sizes=(400, 200, 200))
    assert a.onnx_bytes == b.onnx_bytes
    for k, v in a.test.inputs.items():
        assert np.array_equal(v, b.test.inputs[k])
    assert not np.array_equal(a.test.inputs["age"], c.test.inputs["age"])
    stamp = a.path.stat().st_mtime_ns
    again = build("tabular_categorical", tmp_path / "a", seed=3, sizes=(400, 200, 200))
    assert again.path == a.path and again.path.stat().st_mtime_ns == stamp
    with pytest.raises(KeyError, match="no zoo entry"):
        build("no_such_model", tmp_path)


def test_token_batches_pad_to_each_batch_and_padding_does_not_change_logits(zoo_dir: Path) -> None:
    from bench.zoo.token_classifier import token_batches

    model = build("token_classifier", zoo_dir, seed=0)
    test = model.test.take(slice(0, 200))
    whole = model.probabilities(test)
    widths, parts = set(), []
    for batch in token_batches(test, 16):
        longest = int(batch.inputs["attention_mask"].sum(axis=1).max())
        assert batch.inputs["input_ids"].shape[1] == longest == batch.inputs["attention_mask"].shape[1]
        widths.add(longest)
        parts.append(model.probabilities(batch))
    assert len(widths) > 1  # the sequence dimension really varies
    np.testing.assert_allclose(np.concatenate(parts), whole, atol=1e-5)


def test_split_files_read_back(tmp_path: Path, zoo_dir: Path) -> None:
    model = build("tabular_categorical", zoo_dir, seed=0)
    split = model.test.take(slice(0, 50))
    paths = write_npy(split, tmp_path / "npy")
    for name, arr in split.inputs.items():
        mapped = np.load(paths[name], mmap_mode="r", allow_pickle=False)
        assert isinstance(mapped, np.memmap) or arr.dtype == object
        assert np.array_equal(np.asarray(mapped).astype(arr.dtype), arr)
    shards = write_npz_shards(split, tmp_path / "npz", rows=16)
    assert len(shards) == 4
    loaded: dict[str, list[np.ndarray]] = {}
    for path in shards:
        with np.load(path, allow_pickle=False) as z:
            for k in z.files:
                loaded.setdefault(k, []).append(z[k])
    assert np.array_equal(np.concatenate(loaded["y"]), split.y)
    assert np.array_equal(np.concatenate(loaded["city"]).astype(object), split.inputs["city"])


def test_image_folder_round_trip(tmp_path: Path) -> None:
    from bench.zoo.images import PATTERNS, generate

    x, y = generate(12, seed=5)
    root = write_image_folder(x, y, PATTERNS, tmp_path / "png")
    assert sorted(p.name for p in root.iterdir()) == list(PATTERNS)
    back, labels, classes = read_image_folder(root)
    assert classes == PATTERNS  # sorted names: ImageFolder's class indices are the model's
    order = np.argsort(y, kind="stable")
    assert np.array_equal(labels, y[order]) and np.array_equal(back, x[order])
    write_image_folder(x, y, PATTERNS, tmp_path / "jpeg", image_format="jpeg", quality=90)
    jpeg, jlabels, _ = read_image_folder(tmp_path / "jpeg")
    assert np.array_equal(jlabels, y[order]) and jpeg.shape == x.shape
    assert float(np.abs(jpeg.astype(np.float32) - x[order]).mean()) < 20.0  # lossy, but the same images
    with pytest.raises(ValueError, match="uint8 NHWC"):
        write_image_folder(x.astype(np.float32), y, PATTERNS, tmp_path / "bad")


def test_nhwc_uint8_model_agrees_with_nchw_float(zoo_dir: Path) -> None:
    from bench.zoo.images import nchw_float

    nhwc = build("resnet224_nhwc_uint8", zoo_dir, seed=0)
    nchw = build("resnet224", zoo_dir, seed=0)
    x = np.asarray(nhwc.test.inputs["input"][:16])
    np.testing.assert_array_equal(np.asarray(nchw.test.inputs["input"][:16]), nchw_float(x))
    a = nhwc.probabilities(Split({"input": x}, nhwc.test.y[:16]))
    b = nchw.probabilities(Split({"input": nchw_float(x)}, nhwc.test.y[:16]))
    np.testing.assert_allclose(a, b, atol=1e-5)


# -- the locale of string models -------------------------------------------------------------------------
def test_missing_locale_error_names_the_locale() -> None:
    """What onnxruntime says when a StringNormalizer's locale does not exist (the agent can match it)."""
    err = locale_error("xx_XX.UTF-8")
    assert err is not None and MISSING_LOCALE_MARK in err and "xx_XX.UTF-8" in err
    assert locale_error(PORTABLE_LOCALE) is None  # C.UTF-8 exists on every glibc system


def _lower(locale: str | None, texts: list[str]) -> list[str]:
    (out,) = OnnxSession(normalizer_model(locale)).run({"text": np.array(texts, dtype=object)})
    return [str(t) for t in out]


def test_text_pipeline_exported_the_usual_way_loads_and_runs(zoo_dir: Path) -> None:
    require_en_us_locale()
    model = build("text_tfidf", zoo_dir, seed=0, sizes=(600, 200, 200))
    portable = build("text_tfidf", zoo_dir, seed=0, sizes=(600, 200, 200), locale=PORTABLE_LOCALE)
    assert model.inputs[0].onnx_type == "tensor(string)"
    probs = model.probabilities(model.test)
    assert float((probs.argmax(axis=1) == model.test.y).mean()) > 0.7
    # exported with C.UTF-8 instead of en_US.UTF-8: the same numbers ...
    np.testing.assert_allclose(portable.probabilities(model.test), probs, atol=1e-6)
    # ... because both locales lower-case every capital of the Basic Multilingual Plane alike
    capitals = [chr(c) for c in range(0x80, 0x10000) if chr(c).isupper() and not 0xD800 <= c < 0xE000]
    assert _lower(None, capitals) == _lower(PORTABLE_LOCALE, capitals)


def test_text_pipeline_exported_with_a_portable_locale_loads_everywhere(zoo_dir: Path) -> None:
    """skl2onnx's ``locale`` option: the graph names C.UTF-8 and loads without en_US.UTF-8."""
    model = build("text_tfidf", zoo_dir, seed=0, sizes=(600, 200, 200), locale=PORTABLE_LOCALE)
    assert locale_error(PORTABLE_LOCALE) is None
    assert model.accuracy(model.test) > 0.7
    shouted = model.test.with_inputs(text=np.char.upper(model.test.inputs["text"].astype(str)).astype(object))
    np.testing.assert_allclose(model.probabilities(shouted), model.probabilities(model.test), atol=1e-6)


def test_portable_locale_lower_cases_unicode_and_c_only_ascii() -> None:
    """Why C.UTF-8 and not C: scikit-learn lower-cases with ``str.lower``."""
    texts = ["ÉCOLE ÜBER ÖL", "ΑΒΓ ДОМ", "Hello"]
    assert _lower(PORTABLE_LOCALE, texts) == [t.lower() for t in texts]
    assert _lower("C", texts) == ["École Über Öl", "ΑΒΓ ДОМ", "hello"]


def test_shipped_models_match_their_manifest() -> None:
    """bench/zoo/models/models.json names each shipped file's hash: a file regenerated alone shows here."""
    import hashlib
    import json

    models = ROOT / "bench" / "zoo" / "models"
    manifest = json.loads((models / "models.json").read_text(encoding="utf-8"))
    assert set(manifest) == {"resnet224", "resnet224_nhwc_uint8"}
    for entry in manifest.values():
        data = (models / entry["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"] and len(data) == entry["size_bytes"]
        assert len(data) < 1 << 20
