"""SentEval transfer tasks (MR, CR, SUBJ, MPQA, SST2, TREC, MRPC) on frozen embeddings, SimCSE's "test" protocol.

A logistic regression (scikit-learn) is trained on the frozen sentence embeddings, exactly as SentEval does when
``usepytorch=False`` (its scikit-learn path, ``senteval/tools/validation.py``), with the fold counts that SimCSE /
MixCSE pass in "test" mode (``kfold=10``) or "fasttest" mode (``kfold=5``). See :func:`evaluate_transfer` for the
exact grids, folds and seeds. Reading the tasks' files is :mod:`st_hardneg.data.transfer`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score
from sklearn.model_selection import StratifiedKFold
from threadpoolctl import threadpool_limits
from tqdm.auto import tqdm

from st_hardneg.data.senteval import resolve_senteval_dir
from st_hardneg.data.transfer import (  # noqa: F401 - the data half, re-exported
    TRANSFER_TASKS,
    TransferSplit,
    check_transfer_data,
    read_transfer_task,
    transfer_files,
)
from st_hardneg.evaluation.encoding import encode_unique, parse_task_list
from st_hardneg.reporting import markdown_table

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

logger = logging.getLogger(__name__)

#: SentEval's default seed (``params.seed``); it seeds the fold shuffles and the classifier
SENTEVAL_SEED = 1111
#: fold count of SimCSE's "test" mode (``kfold=10``) and "fasttest" mode (``kfold=5``)
FULL_KFOLD = 10
FAST_KFOLD = 5
#: L2 grids (``C`` of LogisticRegression) of SentEval's scikit-learn path: 2^-2 .. 2^3 for the inner-k-fold
#: (MR, CR, SUBJ, MPQA) and split (SST2) classifiers, 2^-1 .. 2^5 for the k-fold-on-train classifier (TREC, MRPC)
FULL_GRIDS = {
    "inner": tuple(2.0**t for t in range(-2, 4)),
    "split": tuple(2.0**t for t in range(-2, 4)),
    "kfold": tuple(2.0**t for t in range(-1, 6)),
}
#: ``fast=True`` keeps every other value of each grid
FAST_GRIDS = {name: grid[::2] for name, grid in FULL_GRIDS.items()}
#: iterations allowed to lbfgs (scikit-learn's default of 100 often stops before convergence on raw embeddings)
MAX_ITER = 1000

#: protocol of each task: "inner" = k-fold CV with the C chosen by an inner k-fold on each training fold;
#: "split" = train / choose C on dev / report test; "kfold" = choose C by k-fold CV on train, report test
TASK_PROTOCOL = {"MR": "inner", "CR": "inner", "SUBJ": "inner", "MPQA": "inner", "SST2": "split", "TREC": "kfold",
                 "MRPC": "kfold"}

# --------------------------------------------------------------------------------------------- classifiers
def _classifier(c: float, seed: int) -> LogisticRegression:
    return LogisticRegression(C=c, random_state=seed, max_iter=MAX_ITER)


def _pick(grid: Sequence[float], scores: list[float]) -> tuple[float, float]:
    # SentEval rounds each mean validation accuracy to 2 decimals and takes the first maximum (smallest C on ties).
    rounded = [round(s, 2) for s in scores]
    best = int(np.argmax(rounded))
    return float(grid[best]), rounded[best]


def _accuracy(clf: LogisticRegression, x: np.ndarray, y: np.ndarray) -> float:
    return 100.0 * float(clf.score(x, y))


def _select_c(x: np.ndarray, y: np.ndarray, folds: Sequence[tuple[np.ndarray, np.ndarray]], grid: Sequence[float],
              seed: int, bar: tqdm | None = None) -> tuple[float, float]:
    """The C of ``grid`` with the best mean validation accuracy over ``folds`` (SentEval's rule, see :func:`_pick`)."""
    scores = []
    for c in grid:
        fold_scores = []
        for tr, va in folds:
            clf = _classifier(c, seed).fit(x[tr], y[tr])
            fold_scores.append(_accuracy(clf, x[va], y[va]))
            if bar is not None:
                bar.update()
        scores.append(float(np.mean(fold_scores)))
    return _pick(grid, scores)


def inner_kfold_classify(
    x: np.ndarray, y: np.ndarray, grid: Sequence[float], kfold: int, seed: int = SENTEVAL_SEED, bar: tqdm | None = None
) -> dict[str, Any]:
    """SentEval's ``InnerKFoldClassifier`` (MR, CR, SUBJ, MPQA): ``kfold`` stratified shuffled outer folds; on each
    outer training fold, C is chosen by a ``kfold`` stratified inner CV (mean accuracy), refit on the whole outer
    training fold and scored on the outer test fold. Returns the mean test accuracy (x 100) and the per-fold details.
    """
    outer = StratifiedKFold(n_splits=kfold, shuffle=True, random_state=seed)
    inner = StratifiedKFold(n_splits=kfold, shuffle=True, random_state=seed)
    test_scores, dev_scores, chosen = [], [], []
    for train_idx, test_idx in outer.split(x, y):
        x_train, y_train = x[train_idx], y[train_idx]
        c_best, dev = _select_c(x_train, y_train, list(inner.split(x_train, y_train)), grid, seed, bar)
        clf = _classifier(c_best, seed).fit(x_train, y_train)
        if bar is not None:
            bar.update()
        test_scores.append(_accuracy(clf, x[test_idx], y[test_idx]))
        dev_scores.append(dev)
        chosen.append(c_best)
    return {"acc": float(np.mean(test_scores)), "dev_acc": float(np.mean(dev_scores)), "fold_acc": test_scores,
            "C": chosen, "kfold": kfold, "inner_kfold": kfold, "grid": list(grid), "n": int(len(y))}


def kfold_classify(
    x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray, grid: Sequence[float],
    kfold: int, seed: int = SENTEVAL_SEED, bar: tqdm | None = None,
) -> dict[str, Any]:
    """SentEval's ``KFoldClassifier`` (TREC, MRPC): C chosen by ``kfold`` stratified shuffled CV on the training
    set, refit on the whole training set, scored on the test set. Returns accuracy (x 100), details and predictions.
    """
    folds = list(StratifiedKFold(n_splits=kfold, shuffle=True, random_state=seed).split(x_train, y_train))
    c_best, dev = _select_c(x_train, y_train, folds, grid, seed, bar)
    clf = _classifier(c_best, seed).fit(x_train, y_train)
    if bar is not None:
        bar.update()
    return {"acc": _accuracy(clf, x_test, y_test), "dev_acc": dev, "C": c_best, "kfold": kfold, "grid": list(grid),
            "n_train": int(len(y_train)), "n_test": int(len(y_test)), "predictions": clf.predict(x_test)}


def split_classify(
    x_train: np.ndarray, y_train: np.ndarray, x_dev: np.ndarray, y_dev: np.ndarray, x_test: np.ndarray,
    y_test: np.ndarray, grid: Sequence[float], seed: int = SENTEVAL_SEED, bar: tqdm | None = None,
) -> dict[str, Any]:
    """SentEval's ``SplitClassifier`` (SST2): one fit per C on train, C chosen on dev accuracy, test accuracy of
    that classifier (x 100)."""
    scores, models = [], []
    for c in grid:
        clf = _classifier(c, seed).fit(x_train, y_train)
        scores.append(_accuracy(clf, x_dev, y_dev))
        models.append(clf)
        if bar is not None:
            bar.update()
    c_best, dev = _pick(grid, scores)
    clf = models[list(grid).index(c_best)]  # lbfgs is deterministic: a refit with the same C is the same model
    return {"acc": _accuracy(clf, x_test, y_test), "dev_acc": dev, "C": c_best, "grid": list(grid),
            "n_train": int(len(y_train)), "n_dev": int(len(y_dev)), "n_test": int(len(y_test))}


def _num_fits(protocol: str, grid_size: int, kfold: int) -> int:
    if protocol == "inner":
        return kfold * (grid_size * kfold + 1)
    if protocol == "kfold":
        return grid_size * kfold + 1
    return grid_size


# --------------------------------------------------------------------------------------------- public API
def _check_tasks(tasks: Sequence[str] | str | None) -> list[str]:
    return parse_task_list(tasks, TRANSFER_TASKS, "transfer", default=TRANSFER_TASKS)


def evaluate_transfer(
    model: SentenceTransformer,
    data_dir: str | Path | None = None,
    tasks: Sequence[str] | str | None = None,
    fast: bool = False,
    *,
    seed: int = SENTEVAL_SEED,
    batch_size: int = 64,
    show_progress_bar: bool = True,
    return_details: bool = False,
    blas_threads: int | None = 1,
) -> dict[str, Any]:
    """Accuracy (x 100) of a logistic regression on frozen sentence embeddings for the SentEval transfer tasks,
    with SentEval's scikit-learn protocol in SimCSE's "test" mode (``fast=False``) or "fasttest" mode (``fast=True``).

    Protocol (``k`` = 10, or 5 with ``fast=True``; every fold split is ``StratifiedKFold(shuffle=True,
    random_state=seed)``; the classifier is ``LogisticRegression(C, random_state=seed, max_iter=1000)``, lbfgs):

    - **MR, CR, SUBJ, MPQA**: ``k``-fold cross-validation over the whole set; on each training fold, C is chosen
      from ``{2^-2, ..., 2^3}`` by an inner ``k``-fold CV, the classifier is refit on the training fold and scored
      on the held-out fold; the score is the mean over the ``k`` folds (``k·(6k+1)`` fits per task).
    - **SST2**: one fit per C in ``{2^-2, ..., 2^3}`` on train; the C with the best dev accuracy is scored on test.
    - **TREC**: C chosen from ``{2^-1, ..., 2^5}`` by ``k``-fold CV on train, refit on train, scored on test.
    - **MRPC**: as TREC, on the features ``[|u − v|, u ⊙ v]`` of the two sentence embeddings; reports test
      accuracy and F1 of the paraphrase class.
    - Validation accuracies are rounded to 2 decimals before the arg-max and ties go to the smaller C (SentEval).
      ``fast=True`` keeps every other grid value: ``{2^-2, 2^0, 2^2}`` and ``{2^-1, 2^1, 2^3, 2^5}``.
    - Items are ordered as SentEval orders them (by token count, then label) before splitting, so with the default
      ``seed=1111`` the folds are SentEval's. (SentEval hard-codes 1111 for the MR/CR/SUBJ/MPQA splits; here
      ``seed`` drives every split and classifier.) Results are deterministic for a given seed.
    - Differences from SentEval: ``max_iter=1000`` (SentEval relied on the scikit-learn defaults of its time, whose
      solver was liblinear), and SimCSE's reported numbers come from SentEval's PyTorch logistic regression
      (``usepytorch=True``, Adam), not from scikit-learn, so they differ slightly.

    Each distinct sentence of all requested tasks is encoded once, at the model's full length; embeddings are used
    as they come out of the model (no normalisation), as in SentEval.

    Args:
        model: a SentenceTransformer (anything with a SentenceTransformer-style ``encode``).
        data_dir: the SentEval directory (see :func:`st_hardneg.data.senteval.resolve_senteval_dir`).
        tasks: subset of ``MR, CR, SUBJ, MPQA, SST2, TREC, MRPC`` (list or comma-separated string); ``None`` = all.
        fast: SimCSE's "fasttest" analogue: 5 folds and the smaller grids, for quick checks.
        seed: seed of the fold shuffles and classifiers (SentEval's default 1111).
        batch_size: encoding batch size.
        show_progress_bar: progress bars for the encoding and for the classifier fits of each task.
        return_details: also return ``"details"``: per task the protocol, grid, fold counts, chosen C (per outer
            fold for MR/CR/SUBJ/MPQA), validation accuracy, set sizes and fitting time.
        blas_threads: BLAS threads during the classifier fits (``None`` = the library default). lbfgs on these
            sizes is a sequence of matrix-vector products, for which extra threads mostly add overhead: one
            thread was 10x faster than two on a busy 2-core machine.

    Returns:
        ``{task: accuracy, ..., "MRPC_f1": F1, "avg": mean accuracy over the evaluated tasks}`` (all x 100), plus
        ``"details"`` if asked.

    Raises:
        ValueError: an unknown task name.
        DataNotFoundError: a task's files are missing (the message lists them and says how to get them).

    Example:
        ::

            from st_hardneg.evaluation import evaluate_transfer, format_transfer_table
            from st_hardneg.models import load_default_model

            model = load_default_model()
            scores = evaluate_transfer(model, "path/to/senteval", fast=True)
            print(format_transfer_table({"MiniLM (CLS)": scores}))
    """
    tasks = _check_tasks(tasks)
    root = resolve_senteval_dir(data_dir)
    check_transfer_data(root, tasks)
    data = {task: read_transfer_task(root, task) for task in tasks}
    sentences = (s for splits in data.values() for split in splits.values()
                 for s in (*split.sentences, *(split.sentences2 or ())))
    table = encode_unique(model, sentences, batch_size=batch_size, show_progress_bar=show_progress_bar)

    def embed(texts: list[str]) -> np.ndarray:
        return np.stack([table[t] for t in texts])

    kfold = FAST_KFOLD if fast else FULL_KFOLD
    grids = FAST_GRIDS if fast else FULL_GRIDS
    results: dict[str, Any] = {}
    details: dict[str, dict[str, Any]] = {}
    for task in tasks:
        protocol = TASK_PROTOCOL[task]
        grid = grids[protocol]
        splits = data[task]
        start = time.perf_counter()
        with tqdm(total=_num_fits(protocol, len(grid), kfold), desc=f"{task}: logistic regression",
                  disable=not show_progress_bar, leave=False) as bar, threadpool_limits(limits=blas_threads):
            if protocol == "inner":
                out = inner_kfold_classify(embed(splits["all"].sentences), splits["all"].labels, grid, kfold, seed,
                                           bar)
            elif protocol == "split":
                tr, dev, te = splits["train"], splits["dev"], splits["test"]
                out = split_classify(embed(tr.sentences), tr.labels, embed(dev.sentences), dev.labels,
                                     embed(te.sentences), te.labels, grid, seed, bar)
            elif task == "MRPC":
                tr, te = splits["train"], splits["test"]
                u_tr, v_tr = embed(tr.sentences), embed(cast(list[str], tr.sentences2))
                u_te, v_te = embed(te.sentences), embed(cast(list[str], te.sentences2))
                x_tr = np.c_[np.abs(u_tr - v_tr), u_tr * v_tr]
                x_te = np.c_[np.abs(u_te - v_te), u_te * v_te]
                out = kfold_classify(x_tr, tr.labels, x_te, te.labels, grid, kfold, seed, bar)
                out["f1"] = 100.0 * float(f1_score(te.labels, out["predictions"]))
            else:
                tr, te = splits["train"], splits["test"]
                out = kfold_classify(embed(tr.sentences), tr.labels, embed(te.sentences), te.labels, grid, kfold,
                                     seed, bar)
        out.pop("predictions", None)
        out.update(protocol=protocol, seed=seed, fit_seconds=round(time.perf_counter() - start, 2))
        results[task] = out["acc"]
        if "f1" in out:
            results[f"{task}_f1"] = out["f1"]
        details[task] = out
        logger.info("%s: %.2f (dev %.2f, C=%s)", task, out["acc"], out["dev_acc"], out["C"])
    results["avg"] = float(np.mean([results[t] for t in tasks]))
    if return_details:
        results["details"] = details
    return results


def format_transfer_table(rows: dict[str, dict[str, Any]], tasks: Sequence[str] | None = None) -> str:
    """A markdown table, one row per model / method: ``{name: evaluate_transfer(...) result}``.

    MRPC shows ``accuracy / F1`` when the F1 is present; ``avg`` is the mean accuracy (as in the papers).
    """
    if not rows:
        return ""
    if tasks is None:
        first = next(iter(rows.values()))
        tasks = [t for t in TRANSFER_TASKS if t in first]
    header = ["model", *tasks, "avg"]
    body = []
    for name, scores in rows.items():
        cells = []
        for task in (*tasks, "avg"):
            if task not in scores:
                cells.append("–")
            elif f"{task}_f1" in scores:
                cells.append(f"{scores[task]:.2f} / {scores[f'{task}_f1']:.2f}")
            else:
                cells.append(f"{scores[task]:.2f}")
        body.append([name, *cells])
    return markdown_table(header, body).rstrip("\n")
