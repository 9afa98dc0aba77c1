"""``text_tfidf``: scikit-learn ``Pipeline(TfidfVectorizer, LogisticRegression)`` over generated topic texts.

Exported as users export it, ``skl2onnx.to_onnx`` with one string input ``text`` ``[None, 1]`` (one
document per row) and ``zipmap=False`` (outputs ``label`` and ``probabilities``). The export keeps
skl2onnx's default StringNormalizer, which onnxruntime runs only where the ``en_US.UTF-8`` locale exists
(:mod:`.string_locale`); ``locale=PORTABLE_LOCALE`` exports one that loads anywhere.

Documents come from :class:`.topics.TopicCorpus` (five topics), spelled with made-up words, capitalised and
ended with a full stop. Shifts:

* ``typos``: each word, with probability ``strength``, gets one character edit (substitution, deletion,
  insertion or transposition), so the vectorizer no longer knows it;
* ``vocabulary_drift``: each topic word, with probability ``strength``, is replaced by a new word the model
  never saw (a fixed synonym per word, as when a product or a slang term is renamed).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from bench.zoo.core import (
    Shift,
    Split,
    ZooModel,
    balanced_labels,
    cache_dir,
    graph_inputs,
    load_splits,
    save_bytes,
    save_splits,
    source_digest,
)
from bench.zoo.topics import TopicCorpus, made_up_words

TOPICS = ("weather", "sports", "finance", "cooking", "travel")
CORPUS = TopicCorpus(n_topics=len(TOPICS), n_common=400, n_per_topic=60, p_topic=0.18, p_confuse=0.05, min_len=8)
SIZES = (3000, 1000, 1000)
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


class TextVocabulary:
    """The made-up words of one seed, the new words of ``vocabulary_drift`` and the spelling of documents."""

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng([seed, 101])
        self.words = made_up_words(CORPUS.n_words, rng)
        #: One unseen synonym per topic word (index ``i - n_common``).
        self.synonyms = made_up_words(CORPUS.n_words - CORPUS.n_common, rng, exclude=frozenset(self.words))
        self.index = {w: i for i, w in enumerate(self.words)}

    def spell(self, doc: np.ndarray) -> str:
        text = " ".join(self.words[i] for i in doc)
        return text[:1].upper() + text[1:] + "."

    @staticmethod
    def tokens(text: str) -> list[str]:
        return text.rstrip(".").lower().split()


def _text(split: Split) -> list[str]:
    return [str(t) for t in split.inputs["text"][:, 0]]


def _column(texts: list[str]) -> np.ndarray:
    return np.array(texts, dtype=object).reshape(-1, 1)


def _typo(word: str, rng: np.random.Generator) -> str:
    i = int(rng.integers(len(word)))
    op = int(rng.integers(4))
    letter = _LETTERS[int(rng.integers(26))]
    if op == 0:
        return word[:i] + letter + word[i + 1 :]
    if op == 1 and len(word) > 2:
        return word[:i] + word[i + 1 :]
    if op == 2:
        return word[:i] + letter + word[i:]
    j = min(i + 1, len(word) - 1)
    swapped = word[:i] + word[j] + word[i] + word[j + 1 :] if j > i else word + letter
    return swapped if swapped != word else word + letter


def typos(split: Split, strength: float, seed: int) -> Split:
    rng = np.random.default_rng([seed, 1])
    out = []
    for text in _text(split):
        words = TextVocabulary.tokens(text)
        hit = rng.random(len(words)) < strength
        words = [_typo(w, rng) if h else w for w, h in zip(words, hit, strict=True)]
        out.append(" ".join(words).capitalize() + ".")
    return split.with_inputs(text=_column(out))


def vocabulary_drift_for(vocab: TextVocabulary) -> Shift:
    def vocabulary_drift(split: Split, strength: float, seed: int) -> Split:
        rng = np.random.default_rng([seed, 2])
        out = []
        for text in _text(split):
            words = TextVocabulary.tokens(text)
            ids = [vocab.index.get(w, -1) for w in words]
            hit = rng.random(len(words)) < strength
            words = [
                vocab.synonyms[i - CORPUS.n_common] if h and i >= CORPUS.n_common else w
                for w, i, h in zip(words, ids, hit, strict=True)
            ]
            out.append(" ".join(words).capitalize() + ".")
        return split.with_inputs(text=_column(out))

    return vocabulary_drift


def generate(vocab: TextVocabulary, n: int, rng: np.random.Generator) -> Split:
    y = balanced_labels(n, len(TOPICS), rng)
    return Split({"text": _column([vocab.spell(d) for d in CORPUS.documents(y, rng)])}, y)


def export(pipeline: object, locale: str | None = None) -> bytes:
    """``to_onnx`` as users call it (``locale``: skl2onnx's option for the StringNormalizer, default none)."""
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import StringTensorType
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    options: dict[object, dict[str, object]] = {LogisticRegression: {"zipmap": False}}
    if locale is not None:
        options[TfidfVectorizer] = {"locale": locale}
    onx = to_onnx(pipeline, initial_types=[("text", StringTensorType([None, 1]))], options=options)
    return onx.SerializeToString()


def train(train_split: Split) -> object:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline

    pipe = Pipeline([("tfidf", TfidfVectorizer(min_df=2)), ("clf", LogisticRegression(C=2.0, max_iter=2000))])
    pipe.fit(_text(train_split), train_split.y)
    return pipe


def build(
    workdir: str | os.PathLike[str],
    seed: int = 0,
    sizes: tuple[int, int, int] = SIZES,
    locale: str | None = None,
) -> ZooModel:
    """The entry, trained on ``sizes[0]`` documents; ``locale`` as in :func:`export`."""
    digest = source_digest(__file__, __file__.replace("text_tfidf.py", "topics.py"))
    name = "text_tfidf" if locale is None else f"text_tfidf-{locale}"
    where = cache_dir(workdir, name, seed, sizes, digest)
    vocab = TextVocabulary(seed)
    splits = load_splits(where)
    path = where / "model.onnx"
    if splits is None or not path.is_file():
        rng = np.random.default_rng([seed, 3])
        splits = {part: generate(vocab, n, rng) for part, n in zip(("train", "val", "test"), sizes, strict=True)}
        model = export(train(splits["train"]), locale)
        save_splits(where, splits)
        save_bytes(path, model)
    return ZooModel(
        name="text_tfidf",
        kind="text",
        path=Path(path),
        inputs=graph_inputs(path.read_bytes()),
        classes=TOPICS,
        train=splits["train"],
        val=splits["val"],
        test=splits["test"],
        scores_output="probabilities",
        scores_kind="probabilities",
        shifts={"typos": typos, "vocabulary_drift": vocabulary_drift_for(vocab)},
        notes="needs the en_US.UTF-8 locale in onnxruntime unless built with locale='C.UTF-8'",
    )
