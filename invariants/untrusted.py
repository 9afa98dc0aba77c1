"""Reading files a user (or an attacker) wrote: YAML without aliases, and values quoted at a bounded length.

YAML aliases let a few hundred bytes expand into gigabytes once the document is walked or printed (the
"billion laughs" bomb): no rule file or config of ours needs them, so the loader refuses anchors and aliases
while composing, before anything is expanded. Error messages quote user values through :func:`bounded_repr`,
so a message never grows with the input.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["YamlAliasError", "bounded_repr", "safe_load_yaml"]

#: characters of a user value an error message quotes before cutting it
REPR_LIMIT = 80


class YamlAliasError(yaml.YAMLError):
    """An anchor (``&name``) or alias (``*name``) in a document that must not have one."""


class _NoAliasLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses anchors and aliases as soon as the composer meets them."""

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            line = event.start_mark.line + 1 if event.start_mark is not None else "?"
            raise YamlAliasError(f"YAML anchors and aliases are not allowed (line {line})")
        return super().compose_node(parent, index)


def safe_load_yaml(text: str) -> Any:
    """``yaml.safe_load`` (no Python tags) that also refuses anchors and aliases."""
    loader = _NoAliasLoader(text)  # what yaml.load does, with our SafeLoader subclass
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def bounded_repr(value: object, limit: int = REPR_LIMIT) -> str:
    """``repr(value)``, cut to ``limit`` characters (with the full length said) so messages stay small."""
    if isinstance(value, (str, bytes)) and len(value) > 4 * limit:
        value = value[: 4 * limit]  # never build the repr of a huge string whole
        text = repr(value)
        return text[:limit] + "…"
    if isinstance(value, (list, tuple, dict, set)) and len(value) > limit:
        return f"<{type(value).__name__} of {len(value)} items>"
    text = repr(value)
    if len(text) > limit:
        return text[:limit] + f"… ({len(text)} characters)"
    return text
