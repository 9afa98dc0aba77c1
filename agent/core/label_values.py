"""The label that says "none of the model's classes": one spelling in every label format, one stored code.

Open-world models see inputs that belong to none of their classes ("none of the above"). A labeler can say so
with the reserved label :data:`NONE_LABEL` (``"__none__"``) wherever a label is given: ``POST /v1/labels``
(``{"id": "...", "label": "__none__"}``), the CSV and JSON-lines files of ``icos-agent labels``, a Label
Studio annotation (the choice the exported labeling config adds), and the labels of the data ``check``
reads. Such a label counts as a wrong prediction for every accuracy (the model predicted one of its
classes), is no class's true positive nor support, and is reported as its own realized share. A model with
a class of that very name keeps it: the class wins. The prediction store keeps it as :data:`NONE_INDEX`.
"""

from __future__ import annotations

from collections.abc import Sequence

#: The label of an input that belongs to none of the model's classes.
NONE_LABEL = "__none__"
#: Its code among class indices (never a class index, and not the -1 of "no label known").
NONE_INDEX = -2


def none_label_index(value: object, classes: Sequence[str]) -> int | None:
    """:data:`NONE_INDEX` when ``value`` is :data:`NONE_LABEL` and no class bears that name, else None."""
    return NONE_INDEX if value == NONE_LABEL and NONE_LABEL not in classes else None
