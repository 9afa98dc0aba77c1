"""Metamorphic relations of every kind of input, on :class:`Inputs`: which inputs each transforms, what
it does to them, and which relations a model's signature admits."""

from __future__ import annotations

import numpy as np
import pytest

from agent.audits.metamorphic import apply_to_inputs, check_applies, parse_specs
from agent.audits.modalities import input_kinds
from agent.audits.relations import RelationContext, applicable, default_relations
from agent.audits.report import AuditError
from agent.model.inputs import Inputs, InputSpec, Signature

TABLE = Signature(
    (
        InputSpec("age", np.dtype(np.float32), (1,)),
        InputSpec("visits", np.dtype(np.int64), (1,)),
        InputSpec("city", np.dtype(object), (1,)),
        InputSpec("review", np.dtype(object), (1,)),
    )
)
TOKENS = Signature(
    (InputSpec("input_ids", np.dtype(np.int64), (None,)), InputSpec("attention_mask", np.dtype(np.int64), (None,)))
)


def _table(n: int = 40) -> Inputs:
    rng = np.random.default_rng(0)
    return Inputs(
        {
            "age": rng.normal(40, 10, (n, 1)).astype(np.float32),
            "visits": rng.integers(0, 9, (n, 1)),
            "city": rng.choice(["paris", "rome", "oslo"], (n, 1)).astype(object),
            "review": np.array([[f"Review number {i}, quite good."] for i in range(n)], dtype=object),
        }
    )


def _apply(
    batch: Inputs, signature: Signature, items: list[object], seed: int = 0
) -> tuple[Inputs, dict[str, tuple[str, ...]]]:
    kinds = input_kinds(signature, batch)
    specs = parse_specs(items)  # type: ignore[arg-type]
    where = check_applies(specs, kinds)
    return apply_to_inputs(batch, specs, seed, RelationContext.of(batch, kinds), where), where


def test_kinds_and_defaults_follow_the_signature_and_the_values() -> None:
    kinds = input_kinds(TABLE, _table())
    assert kinds.numeric == ("age", "visits") and kinds.text == ("review",) and list(kinds.categories) == ["city"]
    assert default_relations(kinds) == [
        "scale", "noise", "typos", "case", "whitespace", "punctuation", "unseen_category", "category_swap"
    ]  # fmt: skip
    tokens = input_kinds(TOKENS)
    assert tokens.tokens == ("input_ids",) and tokens.masks == {"input_ids": "attention_mask"}
    assert default_relations(tokens) == ["token_swap", "token_drop", "truncate"]
    no_mask = input_kinds(Signature(TOKENS.inputs[:1]))
    assert applicable(no_mask) == ["token_swap"]  # dropping and truncating need the mask


def test_each_relation_touches_only_its_inputs() -> None:
    batch = _table()
    out, where = _apply(batch, TABLE, ["typos", "category_swap", "scale"])
    assert where == {"typos": ("review",), "category_swap": ("city",), "scale": ("age", "visits")}
    assert out["visits"].dtype == np.int64 and out["age"].dtype == np.float32  # integers stay integers
    assert out["review"].shape == (40, 1) and out["review"].dtype == object
    assert any(a != b for a, b in zip(out["review"][:, 0], batch["review"][:, 0], strict=True))
    # category_swap: every row gets another seen value, never its own, never an unseen one
    assert all(a != b for a, b in zip(out["city"][:, 0], batch["city"][:, 0], strict=True))
    assert set(out["city"][:, 0]) <= {"paris", "rome", "oslo"}
    only, where = _apply(batch, TABLE, [{"name": "noise", "input": "age", "sigma": 0.5}])
    assert where == {"noise": ("age",)} and np.array_equal(only["visits"], batch["visits"])
    assert not np.array_equal(only["age"], batch["age"])


def test_unseen_category_and_strength_zero() -> None:
    batch = _table()
    out, _ = _apply(batch, TABLE, ["unseen_category"])
    assert len(set(out["city"][:, 0])) == 1 and out["city"][0, 0].startswith("unseen-")
    same, _ = _apply(batch, TABLE, [{"name": "case", "strength": 0}, {"name": "unseen_category", "strength": 0}])
    assert np.array_equal(same["review"], batch["review"]) and np.array_equal(same["city"], batch["city"])


def test_token_relations_change_ids_or_the_mask() -> None:
    rng = np.random.default_rng(1)
    mask = (np.arange(10)[None, :] < rng.integers(3, 11, (30, 1))).astype(np.int64)
    batch = Inputs({"input_ids": rng.integers(1, 40, (30, 10)) * mask, "attention_mask": mask})
    swapped, _ = _apply(batch, TOKENS, [{"name": "token_swap", "strength": 0.5}])
    assert np.array_equal(swapped["attention_mask"], mask)
    assert not np.array_equal(swapped["input_ids"], batch["input_ids"])
    assert np.all(swapped["input_ids"][mask == 0] == 0)  # padding stays padding
    cut, _ = _apply(batch, TOKENS, [{"name": "truncate", "strength": 0.5}])
    assert np.array_equal(cut["input_ids"], batch["input_ids"])
    assert np.all(cut["attention_mask"].sum(axis=1) < mask.sum(axis=1))


def test_channels_last_images_are_shifted_along_height_and_width() -> None:
    sig = Signature((InputSpec("image", np.dtype(np.float32), (8, 8, 3)),))
    x = np.zeros((4, 8, 8, 3), dtype=np.float32)
    x[:, 2:6, 2:6, :] = 1.0
    out, where = _apply(Inputs({"image": x}), sig, [{"name": "shift", "max_pixels": 1}], seed=3)
    assert where == {"shift": ("image",)}
    # channels are never mixed: each pixel keeps the same value in all three channels
    assert np.array_equal(out["image"][..., 0], out["image"][..., 2]) and out["image"].sum() == x.sum()


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["shift"], "shift needs images [N, (C,) H, W]; the model's inputs are numeric inputs 'age', 'visits'"),
        (["token_drop"], "token_drop needs token ids [N, L] of a dynamic length with an attention mask"),
        ([{"name": "typos", "input": "age"}], "typos transforms a free-text input; input 'age' is numeric"),
        ([{"name": "scale", "input": "zip"}], "scale: no input 'zip' it could transform"),
    ],
)
def test_relations_that_do_not_apply_are_refused_naming_those_that_do(items: list[object], message: str) -> None:
    kinds = input_kinds(TABLE, _table())
    with pytest.raises(AuditError, match="relations that apply to this model: scale, noise, typos") as exc:
        check_applies(parse_specs(items), kinds)  # type: ignore[arg-type]
    assert message in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([{"name": "typos", "strength": 1.5}], "strength of typos must be <= 1"),
        ([{"name": "token_swap", "vocab": 2.5}], "whole number"),
        ([{"name": "case", "input": 3}], "'input' of transformation 'case'"),
    ],
)
def test_bad_parameters_are_refused(items: list[object], message: str) -> None:
    with pytest.raises(AuditError, match=message):
        parse_specs(items)  # type: ignore[arg-type]
