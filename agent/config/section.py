"""The base of every section of the settings."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Unknown fields are errors; each field's docstring is its description (the meaning column of
    docs/configuration.md, which ``docs/gen_config.py`` writes from it)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)
