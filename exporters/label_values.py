"""Label values made of data (class names, segment names) bounded for Prometheus: one line, at most
:data:`MAX_LABEL` characters, distinct names kept distinct.

The client library escapes what the exposition format needs (backslash, double quote, newline); what it
cannot do is keep a series' identity small: a 10,000-character class name would be copied into every sample
of every series that names the class, at every scrape. A cut value ends in a digest of the whole one, so two
names alike up to the cut stay two series."""

from __future__ import annotations

import hashlib

#: Longest label value made of data (a class or segment name): longer ones are cut.
MAX_LABEL = 80
#: Hex digits of a cut value's digest kept at its end.
LABEL_DIGEST = 6


def bounded_label(text: str) -> str:
    """``text`` on one line (whitespace runs as one space) and at most :data:`MAX_LABEL` characters; a cut
    one ends in ``…~`` and a digest of the whole ``text``."""
    flat = " ".join(text.split())
    if len(flat) <= MAX_LABEL:
        return flat
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()[:LABEL_DIGEST]
    return flat[: MAX_LABEL - LABEL_DIGEST - 2] + "…~" + digest
