"""Perturbations of text, categories and token ids, by name: the metamorphic audit's transformations for
these inputs (LAMPION §3: a label-preserving change must keep the model's label) and the drifts the
accuracy estimators calibrate on (:mod:`agent.offline.calibration.input_corruptions`), so both perturb data
the same way.

Every function takes values ``[N, ...]`` (text as an object array of ``str``; categories likewise; token
ids as integers with a mask), a strength in ``[0, 1]`` (the share of characters, words, rows or tokens
touched) and a generator, and returns new values of the same shape. No word list is needed: typos, case,
white space and punctuation are made character by character, and vocabulary drift draws words of letters.

* text: ``typos`` (swap, drop, double or replace letters), ``case``, ``whitespace``, ``punctuation``,
  ``word_drop``, ``word_shuffle``, ``vocabulary`` (new made-up words inserted);
* categories: ``unseen_category`` (a value never seen at fit), ``category_swap`` (another seen value);
* tokens: ``token_swap`` (random ids), ``token_drop`` (tokens masked out), ``truncate``.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence

import numpy as np

TextFn = Callable[[np.ndarray, float, np.random.Generator], np.ndarray]
LETTERS = string.ascii_lowercase
PUNCTUATION = ".,;:!?-"

__all__ = ["CATEGORY_SHIFTS", "TEXT_TRANSFORMS", "TOKEN_SHIFTS", "made_up_word", "map_text"]


def map_text(values: np.ndarray, fn: Callable[[str, np.random.Generator], str], rng: np.random.Generator) -> np.ndarray:
    """``fn`` applied to every text of an object array (its shape kept)."""
    flat = np.asarray(values, dtype=object).reshape(-1)
    out = np.empty(flat.shape, dtype=object)
    for i, v in enumerate(flat):
        out[i] = fn(str(v), rng)
    return out.reshape(np.shape(values))


def _typos(values: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
    def one(t: str, r: np.random.Generator) -> str:
        chars = list(t)
        for i in range(len(chars)):
            if chars[i].isalpha() and r.random() < 0.25 * s:
                kind = r.integers(4)
                if kind == 0 and i + 1 < len(chars):
                    chars[i], chars[i + 1] = chars[i + 1], chars[i]
                elif kind == 1:
                    chars[i] = ""
                elif kind == 2:
                    chars[i] = chars[i] * 2
                else:
                    chars[i] = LETTERS[r.integers(26)]
        return "".join(chars)

    return map_text(values, one, rng)


def _case(values: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
    def one(t: str, r: np.random.Generator) -> str:
        return "".join(c.swapcase() if r.random() < s else c for c in t)

    return map_text(values, one, rng)


def _whitespace(values: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
    def one(t: str, r: np.random.Generator) -> str:
        words = t.split(" ")
        gaps = [" " * (1 + int(r.integers(0, 3))) if r.random() < s else " " for _ in words[1:]]
        out = words[0] + "".join(g + w for g, w in zip(gaps, words[1:], strict=True))
        return (" " if r.random() < s else "") + out + ("\t" if r.random() < s else "")

    return map_text(values, one, rng)


def _punctuation(values: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
    def one(t: str, r: np.random.Generator) -> str:
        words = t.split()
        return " ".join(w + PUNCTUATION[r.integers(len(PUNCTUATION))] if r.random() < 0.5 * s else w for w in words)

    return map_text(values, one, rng)


def _word_drop(values: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
    def one(t: str, r: np.random.Generator) -> str:
        words = t.split()
        kept = [w for w in words if r.random() >= 0.6 * s]
        return " ".join(kept or words[:1])

    return map_text(values, one, rng)


def _word_shuffle(values: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
    def one(t: str, r: np.random.Generator) -> str:
        words = t.split()
        if len(words) > 1 and r.random() < s:
            r.shuffle(words)
        return " ".join(words)

    return map_text(values, one, rng)


def made_up_word(rng: np.random.Generator, length: int = 0) -> str:
    """A pronounceable word no vocabulary holds (letters alternate consonants and vowels)."""
    n = length or int(rng.integers(3, 9))
    consonants, vowels = "bcdfghjklmnpqrstvwxz", "aeiouy"
    return "".join((consonants if i % 2 == 0 else vowels)[rng.integers(6 if i % 2 else 20)] for i in range(n))


def _vocabulary(values: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
    pool = [made_up_word(rng) for _ in range(50)]  # the drifted vocabulary of this set

    def one(t: str, r: np.random.Generator) -> str:
        words = t.split()
        out: list[str] = []
        for w in words:
            if r.random() < 0.5 * s:
                out.append(pool[int(r.integers(len(pool)))])
                if r.random() < 0.5:
                    continue  # replaced rather than joined
            out.append(w)
        return " ".join(out)

    return map_text(values, one, rng)


#: Text transformations by name (label-preserving at low strength).
TEXT_TRANSFORMS: dict[str, TextFn] = {
    "typos": _typos,
    "case": _case,
    "whitespace": _whitespace,
    "punctuation": _punctuation,
    "word_drop": _word_drop,
    "word_shuffle": _word_shuffle,
    "vocabulary": _vocabulary,
}


def unseen_category(values: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
    """A share ``s`` of the rows get a category never seen (a made-up value)."""
    out = np.asarray(values, dtype=object).copy()
    flat = out.reshape(-1)
    hit = rng.random(len(flat)) < s
    new = f"unseen-{made_up_word(rng, 5)}"
    flat[hit] = new
    return out


def category_swap(values: np.ndarray, s: float, rng: np.random.Generator, seen: Sequence[str] = ()) -> np.ndarray:
    """A share ``s`` of the rows get another seen category (drawn from ``seen``, or from the values)."""
    out = np.asarray(values, dtype=object).copy()
    flat = out.reshape(-1)
    pool = list(seen) or sorted({str(v) for v in flat})
    if len(pool) < 2:
        return out
    hit = np.flatnonzero(rng.random(len(flat)) < s)
    for i in hit:
        flat[i] = pool[int(rng.integers(len(pool)))]
    return out


#: Category shifts by name.
CATEGORY_SHIFTS: dict[str, TextFn] = {"unseen_category": unseen_category, "category_swap": category_swap}


def token_swap(ids: np.ndarray, mask: np.ndarray | None, s: float, rng: np.random.Generator, vocab: int) -> np.ndarray:
    """A share ``s`` of the real (unmasked) tokens replaced by random ids below ``vocab`` (id 0 spared)."""
    out = np.array(ids, copy=True)
    real = np.ones(out.shape, dtype=bool) if mask is None else np.asarray(mask) != 0
    hit = real & (rng.random(out.shape) < s)
    out[hit] = rng.integers(1, max(vocab, 2), int(hit.sum()))
    return out


def token_drop(mask: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
    """A share ``s`` of the real tokens masked out (the first one kept)."""
    out = np.array(mask, copy=True)
    hit = (out != 0) & (rng.random(out.shape) < s)
    hit[:, 0] = False
    out[hit] = 0
    return out


def truncate(mask: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
    """Each sequence cut to ``1 − s`` of its length (at least one token)."""
    out = np.array(mask, copy=True)
    lengths = (out != 0).sum(axis=1)
    keep = np.maximum(1, np.round(lengths * (1.0 - s)).astype(int))
    cols = np.arange(out.shape[1])[None, :]
    out[cols >= keep[:, None]] = 0
    return out


#: Token shifts by name (each returns new ids or a new mask: see the functions).
TOKEN_SHIFTS = ("token_swap", "token_drop", "truncate")
