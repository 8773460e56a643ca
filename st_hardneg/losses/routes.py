"""Which route of a sentence-transformers ``Router`` (query / document towers) each input column takes.

sentence-transformers routes a column by the ``task`` (and ``modality``) its features carry: the data collator
stamps the task that ``router_mapping`` gives the column (``Router.preprocess`` does the same), and ``Router.forward``
reads it back. A loss that embeds some columns with a module other than the live model (AdCSE's momentum key
encoder) needs to know which columns share the anchors' tower: :func:`column_routes` tells it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, cast

from torch import nn

__all__ = ["column_routes", "routers"]


def routers(model: Any) -> list[nn.Module]:
    """The ``Router`` modules of ``model`` (none for a model without one, or for something that is not a module)."""
    if not isinstance(model, nn.Module):
        return []
    from sentence_transformers.base.modules import Router

    return [module for module in model.modules() if isinstance(module, Router)]


def column_routes(model: Any, sentence_features: Sequence[dict[str, Any]]) -> list[Hashable]:
    """One route per input column: for a model with ``Router`` modules, the tuple of the routes each of them resolves
    for the column's ``task`` / ``modality`` (the ones ``Router.forward`` takes); ``None`` for every column of a model
    without a ``Router``. Two columns with equal routes go through the same modules."""
    found = routers(model)
    if not found:
        return [None] * len(sentence_features)
    out: list[Hashable] = []
    for features in sentence_features:
        task, modality = features.get("task"), features.get("modality")
        resolved = []
        for router in found:
            try:
                resolved.append(cast(Any, router)._resolve_route(task=task, modality=modality))
            except ValueError:  # no route: Router.forward raises the same when it runs; compare by what selects it
                resolved.append((task, str(modality)))
        out.append(tuple(resolved))
    return out
