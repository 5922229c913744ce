"""What a database's ``metrics/default.yaml`` says of its metrics that ``meta.db`` does not.

``meta.db`` gives a metric a name and nothing else; hpcprof (and callpath's writer) put its
description in the metric taxonomy beside it, which hpcviewer reads. This reads the roots'
names and descriptions without a YAML library (the file is machine-written: one root per
``  - name:`` line, its ``    description:`` right below), so that callpath's views show the
descriptions too (the viewer's column tooltips), e.g. hpcrun's "GPU time: kernel execution
(seconds)" for ``GKER (sec)``.
"""

from __future__ import annotations

import json
import re

_ROOT = re.compile(r"^  - name: (.*)$")
_DESCRIPTION = re.compile(r"^    description: (.*)$")


def _scalar(text: str) -> str:
    """A YAML scalar as hpcprof's yaml-cpp and callpath's writer emit them: double-quoted
    (JSON escapes), single-quoted (``''`` for a quote) or plain."""
    text = text.strip()
    if text.startswith('"'):
        try:
            got = json.loads(text)
        except ValueError:
            return text.strip('"')
        return got if isinstance(got, str) else text
    if text.startswith("'") and text.endswith("'") and len(text) >= 2:
        return text[1:-1].replace("''", "'")
    return text


def root_descriptions(text: str) -> dict[str, str]:
    """Metric name → description of every root of a ``metrics/default.yaml`` text."""
    out: dict[str, str] = {}
    name: str | None = None
    for line in text.splitlines():
        m = _ROOT.match(line)
        if m is not None:
            name = _scalar(m.group(1))
            continue
        d = _DESCRIPTION.match(line)
        if d is not None and name is not None:
            out.setdefault(name, _scalar(d.group(1)))
            name = None
    return out
