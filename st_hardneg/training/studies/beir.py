"""One trial of a BEIR study: a row of the spec trained on a BEIR folder at a seed, its final model scored on the
dev task and, once, on the test task (``st-hardneg study``).

The protocol is the library's BEIR protocol (:data:`~st_hardneg.training.protocol.BEIR_TRAINING`: 128 training
tokens, batch 32, lr 2e-5, 10 % warm-up, 1 epoch, evaluation at 256 tokens), the negatives are mined once per dataset
by the untrained model (:func:`~st_hardneg.training.protocol.mined_beir_triplets`) and cached in the study's folder,
the dev task is the folder's ``qrels/dev.tsv`` or 20 % of the training queries carved as the protocol does
(:func:`~st_hardneg.data.beir.beir_retrieval`). The spec's ``protocol`` replaces any of these values.

>>> from st_hardneg.training.studies.beir import check_dataset, run_point
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from st_hardneg.training.studies.spec import EXTERNAL_LOSSES, Dataset, Point, Row, StudySpec

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from torch import nn

    from st_hardneg.data.beir import BEIRData, BEIRRetrieval

__all__ = ["check_dataset", "dataset_folder", "prepare", "protocol_values", "run_point", "trial_folder"]

logger = logging.getLogger(__name__)

#: what one process has read and mined, per (dataset, protocol): every trial of a worker reuses it
_PREPARED: dict[str, tuple[Any, Any, Any, dict[str, Any]]] = {}


def protocol_values(spec: StudySpec) -> dict[str, Any]:
    """The BEIR protocol (:data:`~st_hardneg.training.protocol.BEIR_TRAINING`, the protocol's mining, no limit) with
    the spec's ``protocol`` on top."""
    from st_hardneg.training.protocol import BEIR_TRAINING, MINING

    values = {**BEIR_TRAINING, "mining": dict(MINING), "limit": 0, "max_steps": -1, "model": None}
    values.update({k: v for k, v in spec.protocol.items() if k in values})
    return values


def dataset_folder(dataset: Dataset, data_root: str | Path | None) -> Path:
    """The dataset's folder: absolute as given, else under ``data_root``."""
    if dataset.folder is None:
        raise ValueError("a BEIR study's dataset needs a folder")
    folder = Path(dataset.folder).expanduser()
    return folder if folder.is_absolute() or data_root is None else Path(data_root) / folder


def check_dataset(name: str, dataset: Dataset, data_root: str | Path | None) -> BEIRData:
    """Read the dataset's folder and refuse, before any model loads, one without the splits the study needs: the
    training and test qrels, and the dev qrels where the spec asks for them (``dev="qrels"``).

    Raises:
        ValueError: naming the folder and the missing split (a malformed file: naming the file and line).
    """
    from st_hardneg.data.beir import load_beir
    from st_hardneg.data.senteval import DataNotFoundError

    folder = dataset_folder(dataset, data_root)
    try:
        data = load_beir(folder, name=name)
    except DataNotFoundError as exc:
        raise ValueError(str(exc)) from None
    needed = ["train", "test", *(["dev"] if dataset.dev == "qrels" else [])]
    missing = [split for split in needed if split not in data.qrels]
    if missing:
        raise ValueError(f"the BEIR folder {folder} has no {' and no '.join(f'qrels/{s}.tsv' for s in missing)}, "
                         f"which the study needs ({', '.join(f'{s} split' for s in missing)})")
    return data


def _split(data: BEIRData, dataset: Dataset, protocol: Mapping[str, Any]) -> BEIRRetrieval:
    """Test task, dev task and training pairs: the folder's dev qrels (``dev`` ``"qrels"``, or ``"auto"`` with a
    ``qrels/dev.tsv``), else a dev split carved from the training queries as the protocol does."""
    from st_hardneg.data.beir import BEIRRetrieval, beir_retrieval

    if dataset.dev == "carve" or (dataset.dev == "auto" and "dev" not in data.qrels):
        return beir_retrieval(data, dev_fraction=protocol["dev_fraction"], seed=protocol["dev_seed"])
    plain = beir_retrieval(data, dev_fraction=0)
    dev = data.task("dev", name=f"{data.name}-dev")
    held = set(dev.queries.values())
    pairs = [(query, doc) for query, doc in plain.train_pairs if query not in held]
    if not pairs:
        raise ValueError(f"no training pair of {data.root} is left after holding out its dev and test queries")
    known = {query: docs for query, docs in plain.known_paraphrases.items() if query not in held}
    return BEIRRetrieval(task=plain.task, dev_task=dev, train_pairs=pairs, train_corpus=plain.train_corpus,
                         known_paraphrases=known, stats={**plain.stats, "dev_queries": len(dev.queries),
                                                         "train_pairs": len(pairs)})


def prepare(spec: StudySpec, name: str, context: Mapping[str, Any]) -> tuple[Any, Any, Any, dict[str, Any]]:
    """``(data, split, training set, mining info)`` of dataset ``name`` under the spec's protocol: read, split and
    mined once per process (the negatives cached on disk under the study's ``cache_dir``)."""
    from st_hardneg.training.protocol import mined_beir_triplets

    protocol = protocol_values(spec)
    dataset = spec.datasets[name]
    memo = json.dumps([name, dataset.folder, dataset.dev, protocol, str(context.get("model"))], default=str)
    if memo not in _PREPARED:
        data = check_dataset(name, dataset, context.get("data_root"))
        split = _split(data, dataset, protocol)
        triplets, info = mined_beir_triplets(data, split, context.get("model"), mining=protocol["mining"],
                                             cache_dir=context["cache_dir"], limit=protocol["limit"],
                                             min_rows=protocol["batch_size"])
        _PREPARED[memo] = (data, split, triplets, info)
    return _PREPARED[memo]


def trial_folder(output_dir: str | Path, point: Point) -> Path:
    """``OUTPUT/trials/<dataset>/<row>/seed<k>``: the trial's per-query file and TREC run."""
    seed = "untrained" if point.seed is None else f"seed{point.seed}"
    safe = "".join(c if c.isalnum() or c in "+-_.@," else "_" for c in point.row)
    return Path(output_dir) / "trials" / point.dataset / safe / seed


def _frozen_guide(model: SentenceTransformer) -> Any:
    from st_hardneg.losses.momentum import frozen_copy

    return frozen_copy(model).eval()


def build_row_loss(row: Row, model: SentenceTransformer, known: dict[str, set[str]]) -> nn.Module:
    """The loss of ``row`` for ``model``: the registry's loss, with the recipe's control when ``row.control``, or
    one of sentence-transformers' :data:`~st_hardneg.training.studies.spec.EXTERNAL_LOSSES` (GIST guided by the
    model as given, frozen, at temperature 0.01 unless the row sets it)."""
    from importlib import import_module

    from st_hardneg.training.recipe import controlled_loss
    from st_hardneg.training.registry import build_loss

    assert row.loss is not None
    if row.loss in EXTERNAL_LOSSES:
        module, cls = EXTERNAL_LOSSES[row.loss]
        options = dict(row.options)
        if row.loss == "gist":
            options = {"temperature": 0.01, **options, "guide": _frozen_guide(model)}
        loss: nn.Module = getattr(import_module(module), cls)(model, **options)
        return loss
    if row.control:
        return controlled_loss(row.loss, model, known, **dict(row.options))
    return build_loss(row.loss, model, **dict(row.options))


def run_point(spec: StudySpec, point: Point, context: Mapping[str, Any]) -> dict[str, Any]:
    """Train ``point``'s row on its dataset at its seed (the model given in ``context["model"]``, as published),
    score the final model on the dev and test tasks (one corpus encoding) and write the test task's per-query file
    in :func:`trial_folder`. Returns the trial's record: the point, the row's configuration, ``dev`` and ``test``
    metrics (x 100), ``per_query`` (the file, relative to the output folder), the training's cost and data.

    Raises:
        ValueError: a loss that refuses its options or a batch; RuntimeError: a run of zero steps.
    """
    from transformers import set_seed

    from st_hardneg.models import training_model
    from st_hardneg.training.experiment import run_training
    from st_hardneg.training.protocol import evaluate_beir_recipe, train_config

    protocol = protocol_values(spec)
    row = spec.rows[point.row]
    data, split, triplets, info = prepare(spec, point.dataset, context)
    folder = trial_folder(context["output_dir"], point)
    folder.mkdir(parents=True, exist_ok=True)
    built = training_model(context.get("model"), bare_pooling=protocol["pooling"],
                           train_length=protocol["max_seq_length"])

    def score(trained: Any) -> dict[str, Any]:
        return evaluate_beir_recipe(trained, split, batch_size=int(context.get("eval_batch_size", 64)),
                                    max_seq_length=trained.max_seq_length, files_dir=folder,
                                    tag=f"st-hardneg-{point.row}")

    record: dict[str, Any] = {"dataset": point.dataset, "row": point.row, "seed": point.seed, **row.config()}
    if row.loss is None:
        scores = score(built.for_saving())
        cost: dict[str, Any] = {"train_seconds": 0.0, "median_step_seconds": None, "steps": 0}
    else:
        set_seed(point.seed or 0)
        loss = build_row_loss(row, built.model, split.known_paraphrases)
        config = train_config(folder / "checkpoints", seed=point.seed or 0, batch_size=protocol["batch_size"],
                              learning_rate=protocol["learning_rate"], epochs=protocol["epochs"],
                              warmup_ratio=protocol["warmup_ratio"], max_steps=protocol["max_steps"],
                              show_progress_bar=False)
        run = run_training(built.model, loss, triplets, config, keep_checkpoints=False,
                           score=lambda trained: score(built.for_saving()))
        scores = run.scores
        cost = {"train_seconds": round(run.train.train_seconds, 1),
                "median_step_seconds": run.train.median_step_seconds, "steps": run.train.steps,
                "loss_config": run.loss_config}
    per_query = folder / scores.get("files", {}).get("per_query", "per_query.tsv")
    record.update(dev=scores["dev"], test=scores["test"], eval_seconds=scores["eval_seconds"],
                  per_query=str(per_query.relative_to(context["output_dir"])), **cost,
                  training_data={k: v for k, v in info.items() if k in ("source", "rows", "pairs", "cache_file")},
                  split=split.stats)
    return record
