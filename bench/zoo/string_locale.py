"""Whether onnxruntime can load the string models here: its ``StringNormalizer`` needs a C++ locale.

skl2onnx exports every ``CountVectorizer``/``TfidfVectorizer`` with a ``StringNormalizer`` node (lower
case) and no ``locale`` attribute, so onnxruntime constructs ``std::locale("en_US.UTF-8")`` when the session
starts. Where that locale is not generated (Debian and most container images ship only ``C``,
``C.UTF-8`` and ``POSIX``) the session does not start::

    [ONNXRuntimeError] : 1 : FAIL : Exception during initialization: .../string_normalizer.cc:235
    ... Failed to construct locale with name:en_US.UTF-8:locale::facet::_S_create_c_locale name not valid:
    Please, install necessary language-pack-XX and configure locales

The environment (``LANG``, ``LC_ALL``) plays no part: the name is fixed in the graph. Two ways out:
generate the locale (``make system-tools`` as root, or ``localedef -i en_US -c -f UTF-8 en_US.UTF-8``), or
export with skl2onnx's ``locale`` option naming one that exists, ``options={TfidfVectorizer: {"locale":
"C.UTF-8"}}`` (see :data:`PORTABLE_LOCALE`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

#: The locale onnxruntime's StringNormalizer uses when the node names none (on Linux and macOS).
DEFAULT_LOCALE = "en_US.UTF-8"
#: A locale every glibc system here has (Debian's libc-bin ships ``/usr/lib/locale/C.utf8``; the python
#: images use it) that lower-cases all of Unicode as ``en_US.UTF-8`` does. ``C`` and ``POSIX`` would
#: lower-case ASCII only, unlike scikit-learn.
PORTABLE_LOCALE = "C.UTF-8"
#: The words onnxruntime's error contains when the locale is missing.
MISSING_LOCALE_MARK = "Failed to construct locale with name"
REMEDY = (
    "onnxruntime's StringNormalizer needs the en_US.UTF-8 locale: generate it with `make test` or `make "
    "system-tools` as root (Debian's locales, then `localedef -i en_US -c -f UTF-8 en_US.UTF-8`), or "
    "`sudo locale-gen en_US.UTF-8` on Ubuntu"
)


def normalizer_model(locale: str | None) -> bytes:
    """A one-node graph: ``StringNormalizer`` (lower case) with ``locale`` (``None``: no attribute)."""
    from onnx import TensorProto, helper

    attrs: dict[str, Any] = {"case_change_action": "LOWER", "is_case_sensitive": 0}
    if locale is not None:
        attrs["locale"] = locale
    node = helper.make_node("StringNormalizer", ["text"], ["lower"], **attrs)
    graph = helper.make_graph(
        [node],
        "string_normalizer",
        [helper.make_tensor_value_info("text", TensorProto.STRING, [None])],
        [helper.make_tensor_value_info("lower", TensorProto.STRING, [None])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model.SerializeToString()


@lru_cache(maxsize=8)
def locale_error(locale: str | None = None) -> str | None:
    """onnxruntime's first error line when a StringNormalizer with ``locale`` cannot start, else ``None``."""
    from invariants.onnx_session import OnnxLoadError, OnnxSession

    try:
        OnnxSession(normalizer_model(locale))
    except OnnxLoadError as exc:
        return str(exc)
    return None


def default_locale_missing() -> str | None:
    """Why string models exported the usual way cannot load here (with the remedy), or ``None``."""
    err = locale_error(None)
    return None if err is None else f"{REMEDY} ({err})"
