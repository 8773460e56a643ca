"""Metric names are text, not e-mail addresses.

docutils reads a bare ``nDCG@10``, ``MRR@10`` or ``R@100`` in a docstring as an e-mail address and renders a
``mailto:`` link. This transform turns every such link whose text is ``<letters>@<digits>`` back into plain text;
real addresses (a host after the ``@``) are left alone. ``tests/test_docs.py`` checks that no built page links one.
"""

from __future__ import annotations

import re
from typing import Any

from docutils import nodes

METRIC = re.compile(r"[A-Za-z][A-Za-z_.-]*@\d+")


def unlink_metric_names(app: Any, doctree: nodes.document) -> None:
    for node in list(doctree.findall(nodes.reference)):
        if str(node.get("refuri", "")).startswith("mailto:") and METRIC.fullmatch(node.astext()):
            node.replace_self(nodes.Text(node.astext()))


def setup(app: Any) -> dict[str, Any]:
    app.connect("doctree-read", unlink_metric_names)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
