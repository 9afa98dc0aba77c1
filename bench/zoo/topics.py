"""Documents drawn from topics over a made-up vocabulary: the data of the text and token models.

A vocabulary of ``n_common`` words shared by every topic and ``n_per_topic`` words of each topic's own.
A document of class ``c`` has between ``min_len`` and ``max_len`` words; each word comes from topic ``c``
with probability ``p_topic``, from another topic with probability ``p_confuse`` and from the shared words
otherwise, Zipf-weighted within each group. Short documents with few topic words are ambiguous, so a good
classifier is accurate but not perfect. Documents are sequences of word indices; :mod:`.text_tfidf` spells
them with made-up words, :mod:`.token_classifier` feeds the indices as token ids.

Word indices: ``[0, n_common)`` shared words, then each topic's words in turn.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kl", "st", "tr", "sh")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou", "ea")
_CODAS = ("", "", "", "n", "r", "s", "l", "m", "x")


def made_up_words(n: int, rng: np.random.Generator, exclude: frozenset[str] = frozenset()) -> list[str]:
    """``n`` distinct pronounceable nonsense words (two to four syllables, lower-case ASCII)."""
    words: list[str] = []
    seen = set(exclude)
    for _ in range(n * 50):
        if len(words) == n:
            break
        syllables = rng.integers(2, 5)
        word = "".join(
            _ONSETS[rng.integers(len(_ONSETS))]
            + _VOWELS[rng.integers(len(_VOWELS))]
            + _CODAS[rng.integers(len(_CODAS))]
            for _ in range(syllables)
        )
        if word not in seen:
            seen.add(word)
            words.append(word)
    if len(words) != n:
        raise RuntimeError(f"could not make {n} distinct words")
    return words


def _zipf(n: int, a: float = 1.0) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1) ** a
    return w / w.sum()


@dataclass(frozen=True)
class TopicCorpus:
    """The generator: the same parameters and seed give the same documents."""

    n_topics: int
    n_common: int = 400
    n_per_topic: int = 60
    p_topic: float = 0.12
    p_confuse: float = 0.06
    min_len: int = 6
    max_len: int = 40

    @property
    def n_words(self) -> int:
        return self.n_common + self.n_topics * self.n_per_topic

    def topic_words(self, topic: int) -> np.ndarray:
        start = self.n_common + topic * self.n_per_topic
        return np.arange(start, start + self.n_per_topic)

    def is_topic_word(self, ids: np.ndarray) -> np.ndarray:
        return ids >= self.n_common

    def documents(self, y: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
        """One document (word indices int64) per class index in ``y``."""
        common_p, topic_p = _zipf(self.n_common), _zipf(self.n_per_topic, 0.8)
        docs = []
        for c in y:
            n = int(rng.integers(self.min_len, self.max_len + 1))
            u = rng.random(n)
            words = rng.choice(self.n_common, size=n, p=common_p)
            own = u < self.p_topic
            other = (u >= self.p_topic) & (u < self.p_topic + self.p_confuse)
            words[own] = self.topic_words(int(c))[rng.choice(self.n_per_topic, size=int(own.sum()), p=topic_p)]
            if other.any():
                others = (int(c) + rng.integers(1, self.n_topics, size=int(other.sum()))) % self.n_topics
                ranks = rng.choice(self.n_per_topic, size=len(others), p=topic_p)
                words[other] = self.n_common + others * self.n_per_topic + ranks
            docs.append(words.astype(np.int64))
        return docs
