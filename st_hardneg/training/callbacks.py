"""Every ``TrainerCallback`` of st-hardneg, in one place.

- :class:`StepTimer`, :class:`EvaluateAtEnd`, :class:`StopAfterSteps`: the training recipe's timing, final
  evaluation and early stop (added by :func:`st_hardneg.training.train`);
- :class:`LossDiagnosticsCallback`: the loss's cosine diagnostics in the Trainer's logs;
- :class:`FalseNegativeLog`: what false-negative control masked at every step;
- :class:`StatefulLossCallback`: connects stateful losses (:class:`~st_hardneg.AdversarialNegativesLoss`) to a
  Trainer, as explained below;
- :class:`LossModelCheck` / :func:`check_loss_model`: warn when the loss was built on another model than the
  Trainer's (that model would not train; see :mod:`st_hardneg.losses.model_guard`);
- :class:`ModelCardCallback` / :func:`add_model_card_data`: the ``st-hardneg`` tag, version and documentation links
  in the model card; :func:`name_card`, :func:`add_card_evaluation` and :func:`add_run_to_card`: a run's name, base
  model, data, evaluation and command in it; :class:`CheckpointRunInfo`: the loss of the run in every checkpoint (resume checks);
- :class:`CheckpointLedgerCallback`: the checkpoints this run wrote, by name; rotation among those only (see
  :mod:`st_hardneg.training.checkpoints`).

**Stateful losses.**

A stateful loss keeps training state outside the model (AdCSE: key encoder, adversaries) and checkpoints it inside
the optimizer's ``state_dict`` (see :mod:`st_hardneg.losses.stateful`). :class:`StatefulLossCallback` gives it the
Trainer's optimizer at ``on_train_begin``, which the Trainer calls after it has created the optimizer and, on
``trainer.train(resume_from_checkpoint=...)``, loaded ``optimizer.pt`` into it, before the first forward. There the
callback

- restores the loss state saved in the checkpoint, so a resumed run continues bit-exactly;
- warns loudly when the run resumes (``state.global_step > 0``) but the loss's step counter is behind it (a
  checkpoint saved with ``save_only_model=True``, or whose loss entry was removed): the loss state restarts;
- raises when the optimizer holds none of the online model's parameters (FSDP / DeepSpeed ZeRO-3 flat parameters,
  or an optimizer for another model), the case in which the loss would otherwise never update.

Usage::

    # st_hardneg.training.loop.train adds it automatically. With a plain SentenceTransformerTrainer:
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=ds, loss=loss,
                                         callbacks=[StatefulLossCallback(loss)])
    # or, for any trainer (also with a loss factory or a dict of losses): add_stateful_loss_callback(trainer)

``model.fit`` accepts no callbacks (sentence-transformers 6.2): there the loss still updates at every optimizer
step, and restores a checkpoint at the first step after resuming (one step late, with a warning).
"""

from __future__ import annotations

import logging
import statistics
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from torch import nn
from transformers import TrainerCallback

from st_hardneg import validation
from st_hardneg.losses.model_guard import ModelGuard, loss_models, same_model
from st_hardneg.losses.stateful import OptimizerDrivenLoss

if TYPE_CHECKING:
    from transformers import Trainer, TrainerControl, TrainerState, TrainingArguments

logger = logging.getLogger(__name__)

__all__ = ["CHECKPOINT_RUN_FILE", "RUN_SECTION", "CardEvaluation", "CheckpointLedgerCallback", "CheckpointRunInfo",
           "EvaluateAtEnd", "FalseNegativeLog", "LossDiagnosticsCallback", "LossModelCheck", "ModelCardCallback",
           "StatefulLossCallback", "StepTimer", "StopAfterSteps", "add_card_evaluation", "add_model_card_data",
           "add_run_to_card", "add_stateful_loss_callback", "check_loss_model", "find_stateful_losses",
           "is_hub_name", "mteb_metric_name", "name_card", "run_card_section", "st_hardneg_losses"]


def _is_stateful(module: Any) -> bool:
    return isinstance(module, OptimizerDrivenLoss)


def find_stateful_losses(loss: Any) -> list[nn.Module]:
    """The stateful losses inside ``loss``: a module (searched with its submodules) or a dict of them."""
    found: list[nn.Module] = []
    for item in (loss.values() if isinstance(loss, dict) else [loss]):
        if isinstance(item, nn.Module):
            found.extend(m for m in item.modules() if _is_stateful(m) and not any(m is f for f in found))
    return found


class StatefulLossCallback(TrainerCallback):
    """Attach stateful losses to the Trainer's optimizer at ``on_train_begin`` (restore, check, warn).

    Args:
        *losses: the losses (modules containing them are searched too).
    """

    def __init__(self, *losses: nn.Module) -> None:
        found = [loss for item in losses for loss in find_stateful_losses(item)]
        if not found:
            raise ValueError(
                "StatefulLossCallback needs at least one stateful loss (e.g. AdversarialNegativesLoss), got "
                f"{[type(item).__name__ for item in losses]}"
            )
        self.losses = found

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       optimizer: Any = None, **kwargs: Any) -> TrainerControl:
        if optimizer is None:
            raise RuntimeError("StatefulLossCallback.on_train_begin received no optimizer from the Trainer")
        model = kwargs.get("model")
        if model is not None:
            for loss in self.losses:
                check_loss_model(loss, model)  # named here, before the loss refuses the re-pointed model
        for loss in self.losses:
            cast(OptimizerDrivenLoss, loss).on_train_begin(optimizer, global_step=state.global_step)
        return control


def add_stateful_loss_callback(trainer: Any) -> StatefulLossCallback | None:
    """Add a :class:`StatefulLossCallback` for the stateful losses of ``trainer.loss``, if any (idempotent)."""
    if any(isinstance(cb, StatefulLossCallback) for cb in trainer.callback_handler.callbacks):
        return None
    losses = find_stateful_losses(getattr(trainer, "loss", None))
    if not losses:
        return None
    callback = StatefulLossCallback(*losses)
    trainer.add_callback(callback)
    return callback


def check_loss_model(loss: Any, model: Any) -> list[str]:
    """Warn (``warnings`` and ``logging``) when a loss inside ``loss`` (a module or a dict of them) was built on
    another model than ``model``, the model to be trained; returns the names of those losses.

    ``SentenceTransformerTrainer(model=A, loss=Loss(B))`` makes its optimizer from the loss's parameters (B's) and
    re-points the loss to A at its first step: A gets gradients that no optimizer applies and does not train, nor
    does B (:mod:`st_hardneg.losses.model_guard`). A wrapper of ``model`` (DDP, ``torch.compile``) is the same model.
    An st-hardneg loss is named once (here or when the Trainer re-points it), other losses at every call.
    """
    wrong = [(name, module) for name, module, held in loss_models(loss) if not same_model(held, model)]
    # an st-hardneg loss warns once: here, or when the Trainer re-points it (ModelGuard), whichever comes first
    guards = {id(module): guard for _, module in wrong
              if isinstance(guard := getattr(module, "model_guard", None), ModelGuard)}
    fresh = [(name, module) for name, module in wrong if not (id(module) in guards and guards[id(module)].warned)]
    if not fresh:
        return [name for name, _ in wrong]
    for _, module in fresh:
        if id(module) in guards:
            guards[id(module)].warned = True
    names = ", ".join(name for name, _ in fresh)
    message = (
        f"{names} was built on another model than the Trainer's model: the Trainer makes its optimizer from the loss's "
        "parameters (those of the model the loss was built on) and re-points the loss to its own model only at the "
        "first step, so the Trainer's model gets gradients that no optimizer applies and does not train (nor does the "
        "other model). Build the loss on the model you train, e.g. loss = MixCSELoss(model) with the same model as "
        "SentenceTransformerTrainer(model=model, ...).")
    logger.warning(message)
    warnings.warn(message, UserWarning, stacklevel=2)
    return [name for name, _ in wrong]


class LossModelCheck(TrainerCallback):
    """At ``on_train_begin``: warn when the loss was built on another model than the Trainer's (see
    :func:`check_loss_model`), or when the optimizer holds none of the Trainer's model's trainable parameters (then
    that model cannot train, whatever the cause). :func:`st_hardneg.training.train` adds it; with a plain
    ``SentenceTransformerTrainer`` pass ``callbacks=[LossModelCheck(loss)]``.

    Without it, every st-hardneg loss still warns by itself, one step later, when the Trainer re-points
    ``loss.model`` (:class:`~st_hardneg.losses.model_guard.ModelGuard`); a loss of sentence-transformers does not.

    Args:
        loss: the Trainer's loss (a module or a dict of them).
    """

    def __init__(self, loss: Any) -> None:
        self.loss = loss
        self.warned = False

    def check(self, model: Any, optimizer: Any = None) -> None:
        """Warn (once) about a loss of another model, and about an optimizer without ``model``'s parameters."""
        if self.warned or model is None:
            return
        if check_loss_model(self.loss, model):
            self.warned = True
            return
        if optimizer is None:
            return
        trainable = {id(p) for p in model.parameters() if p.requires_grad}
        held = {id(p) for group in getattr(optimizer, "param_groups", []) for p in group["params"]}
        if trainable and not trainable & held:
            self.warned = True
            message = (f"the optimizer holds none of the Trainer's model's {len(trainable)} trainable parameters: "
                       "the model will not train (was the loss built on another model, or the optimizer made for "
                       "another one?)")
            logger.warning(message)
            warnings.warn(message, UserWarning, stacklevel=2)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: Any = None, optimizer: Any = None, **kwargs: Any) -> TrainerControl:
        self.check(model, optimizer)
        return control


class FalseNegativeLog(TrainerCallback):
    """Counts, after every optimizer step, the candidates an st-hardneg loss masked as false negatives in its last
    batch (``loss.diagnostics["masked_false_negatives_total"]``, 0 before anything was masked), so a run can report
    how much its false-negative control actually did.

    With gradient accumulation or GradCache the count is that of the step's last forward.

    Usage::

        log = FalseNegativeLog(loss)
        trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=ds, loss=loss, callbacks=[log])
        trainer.train()
        log.summary()   # {"steps": 40, "masked_total": 113.0, "masked_per_batch": 2.825, "batches_with_any": 31}

    Args:
        loss: a loss with a ``diagnostics`` mapping (every st-hardneg loss).

    Raises:
        TypeError: ``loss`` has no ``diagnostics``.
    """

    def __init__(self, loss: nn.Module) -> None:
        if not hasattr(loss, "diagnostics"):
            raise TypeError(f"FalseNegativeLog needs a loss with `diagnostics` (an st-hardneg loss), got "
                            f"{type(loss).__name__}")
        self.loss = loss
        #: masked candidates of each optimizer step's last batch
        self.per_step: list[float] = []
        #: of those, the candidates the loss's ``known_positives`` marked (0 without the argument)
        self.known_per_step: list[float] = []

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        diagnostics = cast(Any, self.loss).diagnostics
        self.per_step.append(float(diagnostics.get("masked_false_negatives_total", 0.0)))
        self.known_per_step.append(float(diagnostics.get("masked_known_positives_total", 0.0)))

    def summary(self) -> dict[str, float | int]:
        """``steps``, ``masked_total``, ``masked_per_batch`` (mean over steps) and ``batches_with_any``; with a loss
        that has ``known_positives`` also ``known_masked_total`` and ``known_masked_per_batch``, the candidates its
        mapping marked (part of ``masked_total``, which counts a candidate masked for several reasons once)."""
        steps = len(self.per_step)
        total = sum(self.per_step)
        summary: dict[str, float | int] = {
            "steps": steps, "masked_total": total, "masked_per_batch": total / steps if steps else 0.0,
            "batches_with_any": sum(1 for value in self.per_step if value > 0)}
        if getattr(self.loss, "known_positives", None) is not None:
            known = sum(self.known_per_step)
            summary.update(known_masked_total=known, known_masked_per_batch=known / steps if steps else 0.0)
        return summary


# --------------------------------------------------------------------------- the training recipe's own
class StepTimer(TrainerCallback):
    """Wall time of every optimizer step (forward + backward + optimizer), excluding evaluation and saving."""

    def __init__(self) -> None:
        self.step_seconds: list[float] = []
        self._start: float | None = None

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      **kwargs: Any) -> None:
        self._start = time.perf_counter()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        if self._start is not None:
            self.step_seconds.append(time.perf_counter() - self._start)
            self._start = None

    def median(self, skip: int = 3) -> float | None:
        """Median step time, leaving out the first ``skip`` (warm-up) steps when there are enough."""
        times = self.step_seconds[skip:] if len(self.step_seconds) > skip + 2 else self.step_seconds
        return statistics.median(times) if times else None


class EvaluateAtEnd(TrainerCallback):
    """Evaluate and save at the last step too, so the final model competes in best-checkpoint selection."""

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> TrainerControl:
        if state.max_steps and state.global_step >= state.max_steps and args.eval_strategy != "no":
            control.should_evaluate = True
            if args.save_strategy != "no":
                control.should_save = True
        return control


class StopAfterSteps(TrainerCallback):
    """End training after ``steps`` optimizer steps while keeping the LR schedule of the full run.

    A truncated run sees exactly the first ``steps`` updates of the full one (same batches, same learning rates), so
    its score is the full run's score at that step: a cheap screen for hyperparameters. This holds when both runs
    evaluate at the same steps before ``steps``: an evaluation inside the Trainer slightly changes the updates that
    follow it (measured on a tiny model: step-2 loss 4.4999 vs 4.5047 with and without an evaluation at step 1; the
    evaluator itself leaves the torch, numpy and python RNG states untouched). The model is evaluated (and
    saved, when checkpoints are on) at the stopping step, so best-checkpoint selection includes it.
    """

    def __init__(self, steps: int):
        self.steps = validation.check_optional_count(steps, "steps")
        if self.steps is None:
            raise ValueError("steps must be a positive integer, got None")

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> TrainerControl:
        if state.global_step >= cast(int, self.steps):  # the constructor refuses None
            control.should_training_stop = True
            if args.eval_strategy != "no":
                control.should_evaluate = True
                if args.save_strategy != "no":
                    control.should_save = True
        return control


# --------------------------------------------------------------------------- diagnostics
class LossDiagnosticsCallback(TrainerCallback):
    """Log the loss's ``diagnostics`` (mean cosines of the last training batch) with the Trainer's own logs.

    At every logging step, the entries ``cos_positive``, ``cos_negative`` and (for losses with synthetic
    negatives) ``cos_synthetic`` are added next to ``loss`` and ``learning_rate``: in ``trainer.state.log_history``
    (so they are saved in ``trainer_state.json`` and can be plotted with
    :func:`st_hardneg.plots.plot_training_curves`) and in the ``logs`` passed on to the callbacks after this one
    (the progress printer, TensorBoard, W&B …; :meth:`attach` puts this callback first so that all of them see
    the entries). Only read-only: the loss value and the gradients are untouched. Evaluation logs are left alone.

    The Trainer appends a copy of ``logs`` to ``state.log_history`` just before calling ``on_log``, so this
    callback updates both that entry and the ``logs`` dict.

    Args:
        loss: the training loss (any st-hardneg loss, i.e. with a ``diagnostics`` property), or a dict
            ``{dataset name: loss}`` for multi-dataset training (keys are then prefixed with the dataset name).
        prefix: prefix of the logged cosine keys (``cos_positive``, ``cos_negative``, ``cos_synthetic``); every other
            entry keeps its own name: the false-negative counts (``masked_false_negatives``,
            ``masked_false_negatives_total``, ``masked_fraction``), the degenerate-row counts
            (``rows_without_negatives``, ``zero_norm_rows``, ``unusable_fraction``) and the rest, which are not
            cosines.

    Example:
        ::

            from st_hardneg import MixCSELoss
            from st_hardneg.training.callbacks import LossDiagnosticsCallback

            loss = MixCSELoss(model, lam=0.2)
            trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train, loss=loss)
            LossDiagnosticsCallback(loss).attach(trainer)
            trainer.train()
            print(trainer.state.log_history[0])  # {'loss': ..., 'cos_positive': ..., 'cos_negative': ..., ...}
    """

    def __init__(self, loss: nn.Module | Mapping[str, nn.Module], prefix: str = "cos_") -> None:
        losses = loss if isinstance(loss, Mapping) else {"": loss}
        for name, item in losses.items():
            if not hasattr(item, "diagnostics"):
                raise TypeError(
                    f"{type(item).__name__}{f' ({name})' if name else ''} has no `diagnostics` property; "
                    "LossDiagnosticsCallback needs an st-hardneg loss (st_hardneg.losses.HardNegativeLoss)."
                )
        self.losses = dict(losses)
        self.prefix = prefix

    def attach(self, trainer: Trainer) -> LossDiagnosticsCallback:
        """Add this callback to ``trainer`` ahead of every other callback (so reporting integrations see the
        entries); returns ``self``."""
        trainer.callback_handler.callbacks.insert(0, self)
        return self

    #: the diagnostics entries that are cosines (logged with ``prefix``)
    COSINES = ("positive", "negative", "synthetic")

    def current(self) -> dict[str, float]:
        """The entries that would be logged now: ``{prefix + key: value}`` for the cosines, ``{key: value}`` for the
        other entries (counts, fractions; ``{name}_...`` for dicts)."""
        entries: dict[str, float] = {}
        for name, loss in self.losses.items():
            for key, value in cast(Any, loss).diagnostics.items():
                logged = f"{self.prefix}{key}" if key in self.COSINES else key
                entries[f"{name}_{logged}" if name else logged] = round(float(value), 6)
        return entries

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, float] | None = None, **kwargs: Any) -> TrainerControl:
        if logs is None or "loss" not in logs:  # evaluation / end-of-training summaries
            return control
        entries = self.current()
        if not entries:
            return control
        logs.update(entries)
        if state.log_history and state.log_history[-1].get("step") == state.global_step \
                and "loss" in state.log_history[-1]:
            state.log_history[-1].update(entries)
        return control


# --------------------------------------------------------------------------- model card and checkpoints
#: the file an st-hardneg run writes into each checkpoint: the loss it trains (see
#: :func:`st_hardneg.training.loop.find_checkpoint`)
CHECKPOINT_RUN_FILE = "st_hardneg_run.json"


def st_hardneg_losses(loss: Any) -> list[nn.Module]:
    """The st-hardneg losses (those with a documentation page) inside ``loss``: a module or a dict of them."""
    from st_hardneg.training.registry import loss_docs_url

    found: list[nn.Module] = []
    for item in (loss.values() if isinstance(loss, Mapping) else [loss]):
        if isinstance(item, nn.Module):
            found.extend(m for m in item.modules() if loss_docs_url(m) and not any(m is f for f in found))
    return found


def add_model_card_data(model: Any, loss: Any) -> bool:
    """Name st-hardneg in ``model.model_card_data`` when ``loss`` holds an st-hardneg loss: the ``st-hardneg`` tag,
    the package version (``version["st_hardneg"]``) and a citation entry ``st-hardneg`` with the version and the
    link to each loss's documentation page (rendered in the saved model's README.md). Returns whether it did.

    sentence-transformers fills the card's tags and citations from the losses when the Trainer is made
    (``loss:MixCSELoss`` …); :class:`ModelCardCallback` calls this after that, at the start of training.
    """
    losses = st_hardneg_losses(loss)
    card = getattr(model, "model_card_data", None)
    if not losses or card is None:
        return False
    from st_hardneg.training.registry import DOCS_URL, loss_docs_url, package_version

    version = package_version()

    card.add_tags(["st-hardneg"])
    if isinstance(getattr(card, "version", None), dict):
        card.version["st_hardneg"] = version
    names = sorted({type(m).__name__ for m in losses})
    pages = ", ".join(f"{name}: {loss_docs_url(next(m for m in losses if type(m).__name__ == name))}"
                      for name in names)
    citations = getattr(card, "citations", None)
    if isinstance(citations, dict):
        citations["st-hardneg"] = (
            "@software{st_hardneg,\n"
            "    title = {st-hardneg: hard-negative contrastive losses for sentence-transformers},\n"
            f"    version = {{{version}}},\n"
            f"    url = {{{DOCS_URL}}},\n"
            f"    note = {{trained with {pages}}},\n"
            "}")
    return True


class ModelCardCallback(TrainerCallback):
    """At ``on_train_begin`` (after sentence-transformers has filled the card from the losses), add st-hardneg's
    tag, version and documentation links to the model card (:func:`add_model_card_data`).
    :func:`st_hardneg.training.train` adds it; with a plain ``SentenceTransformerTrainer`` pass
    ``callbacks=[ModelCardCallback(loss)]``.

    Args:
        loss: the Trainer's loss (a module or a dict of them).
    """

    def __init__(self, loss: Any) -> None:
        self.loss = loss

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: Any = None, **kwargs: Any) -> TrainerControl:
        if model is not None:
            add_model_card_data(model, self.loss)
        return control


class CardEvaluation:
    """A result computed outside the Trainer (the 7-task STS table, dev and test nDCG@10), registered in the model
    card as sentence-transformers registers an evaluator's (:func:`add_card_evaluation`): the card's Evaluation
    section shows its metrics, the card's metadata carries them as the Hub's ``model-index``.

    Args:
        name: the data set, e.g. ``STS12`` or ``scifact-test``.
        description: the task, as sentence-transformers' evaluators name it (``Semantic Similarity``,
            ``Information Retrieval``).
        primary_metric: the metric the task is ranked by, e.g. ``cosine_spearman``, ``ndcg_at_10``.
        config: how it was computed (shown under the table).
    """

    def __init__(self, name: str, description: str, primary_metric: str,
                 config: Mapping[str, Any] | None = None) -> None:
        self.name, self.description, self.primary_metric = name, description, primary_metric
        self.config = dict(config or {})

    def get_config_dict(self) -> dict[str, Any]:
        return dict(self.config)


def mteb_metric_name(metric: str) -> str:
    """st-hardneg's metric key as mteb names it: ``ndcg@10`` → ``ndcg_at_10``, ``recall@100`` →
    ``recall_at_100``; ``spearman`` → ``cosine_spearman`` (the cosine Spearman correlation, mteb's STS main score)."""
    if metric == "spearman":
        return "cosine_spearman"
    return metric.replace("@", "_at_")


def add_card_evaluation(model: Any, name: str, metrics: Mapping[str, float], *, description: str,
                        primary_metric: str, config: Mapping[str, Any] | None = None) -> CardEvaluation | None:
    """Register ``metrics`` (mteb's names and scale, e.g. ``{"ndcg_at_10": 0.6623}``) of data set ``name`` in
    ``model.model_card_data``, rendered when the model is saved; returns the registered entry (``None`` for a model
    without card data).

    Example:
        ::

            add_card_evaluation(model, "scifact-test", {"ndcg_at_10": 0.6623}, description="Information Retrieval",
                                primary_metric="ndcg_at_10")
            model.save("out")  # README.md: an Evaluation section and the model-index metadata
    """
    card = getattr(model, "model_card_data", None)
    if card is None or not isinstance(getattr(card, "eval_results_dict", None), dict):
        return None
    entry = CardEvaluation(name, description, primary_metric, config)
    card.eval_results_dict[entry] = {key: float(value) for key, value in metrics.items()}
    return entry


def is_hub_name(name: str) -> bool:
    """Whether ``name`` reads as a Hugging Face Hub model id (``org/name`` or ``name``) rather than a local path."""
    import os
    import re

    if os.path.exists(os.path.expanduser(name)):
        return False
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?", name) is not None


def name_card(model: Any, *, model_name: str, base_model: str, dataset: Any = None,
              dataset_name: str | None = None) -> None:
    """Before training: the card's title (``model_name``), its base model (a Hub id; a local path is named in the
    card's st-hardneg section instead, :func:`add_run_to_card`, since the Hub's metadata takes only model ids), and
    the training ``dataset``'s name, ``dataset_name`` (its ``info.dataset_name``, which sentence-transformers'
    card reads when the Trainer is made, adding its size, columns and examples)."""
    card = getattr(model, "model_card_data", None)
    if card is not None:
        card.model_name = model_name
        card.local_files_only = True  # nothing looked up on the Hub: the run knows what it trained
        card.base_model = base_model if is_hub_name(base_model) else None
    info = getattr(dataset, "info", None)
    if dataset_name is not None and info is not None:
        info.dataset_name = dataset_name


#: the heading of the card's section that :func:`add_run_to_card` writes
RUN_SECTION = "## Training with st-hardneg"


def run_card_section(run: Mapping[str, Any]) -> str:
    """The card's st-hardneg section (markdown) for ``run``: its ``model_name``, ``base_model`` (and
    ``model_changes``, what the run changed in it, one line each), ``training_data``
    (``name``, ``size``, ``description``), ``loss`` / ``loss_call`` / ``loss_config``, ``evaluation`` (``{data set:
    {metric: value}}`` in mteb's names and scale), ``command`` and ``version``."""
    import json

    data = run["training_data"]
    lines = [RUN_SECTION, "",
             f"- **Model name:** {run['model_name']}",
             f"- **Base model:** `{run['base_model']}`"
             + "".join(f"\n  - {change}" for change in run.get("model_changes") or []),
             f"- **Training data:** {data['name']}, {data['size']:,} rows"
             + (f" ({data['description']})" if data.get("description") else ""),
             f"- **Loss:** `{run['loss']}`: `{run['loss_call']}`",
             f"- **st-hardneg version:** {run['version']}", "",
             "Loss configuration:", "", "```json", json.dumps(run["loss_config"], indent=2, default=str), "```", ""]
    evaluation = run.get("evaluation") or {}
    if evaluation:
        metrics = list(dict.fromkeys(metric for scores in evaluation.values() for metric in scores))
        lines += ["Evaluation (mteb's metric names and scale):", "",
                  "| data | " + " | ".join(metrics) + " |", "|---|" + "---|" * len(metrics)]
        lines += [f"| {name} | " + " | ".join(f"{scores[m]:.4f}" if m in scores else "–" for m in metrics) + " |"
                  for name, scores in evaluation.items()]
        lines.append("")
    lines += ["Trained with:", "", "```bash", run["command"], "```", ""]
    return "\n".join(lines)


def add_run_to_card(folder: str | Path, run: Mapping[str, Any]) -> Path:
    """Write :func:`run_card_section` into the saved model's ``README.md`` (before "## Training Details", or at the
    end; a section written before is replaced) and name a local base model where sentence-transformers leaves it
    "Unknown"; returns the file.

    Raises:
        FileNotFoundError: ``folder`` holds no ``README.md``.
    """
    readme = Path(folder) / "README.md"
    text = readme.read_text(encoding="utf-8")
    section = run_card_section(run)
    if RUN_SECTION in text:
        start = text.index(RUN_SECTION)
        following = text.find("\n## ", start + len(RUN_SECTION))
        text = text[:start] + text[following + 1:] if following >= 0 else text[:start]
    marker = "\n## Training Details"
    text = text.replace(marker, f"\n{section}{marker}", 1) if marker in text else f"{text.rstrip()}\n\n{section}"
    unknown = "<!-- - **Base model:** [Unknown](https://huggingface.co/unknown) -->"
    text = text.replace(unknown, f"- **Base model:** `{run['base_model']}` (a local model)")
    from st_hardneg.reporting import write_text

    return write_text(readme, text, readme.parent)


class CheckpointRunInfo(TrainerCallback):
    """Write ``info`` (e.g. ``{"loss": "adcse", "loss_args": {...}}``) as :data:`CHECKPOINT_RUN_FILE` into every
    checkpoint the Trainer saves, so a resumed run can refuse a checkpoint of another loss
    (:func:`st_hardneg.training.loop.find_checkpoint`).

    Args:
        info: a JSON-serialisable mapping.
    """

    def __init__(self, info: dict[str, Any]) -> None:
        self.info = dict(info)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> TrainerControl:
        import json
        import os

        from st_hardneg.reporting import write_text

        if state.is_world_process_zero:
            folder = os.path.join(args.output_dir or ".", f"checkpoint-{state.global_step}")
            if os.path.isdir(folder) and not os.path.islink(folder):  # inside the output folder, never via a link
                write_text(os.path.join(folder, CHECKPOINT_RUN_FILE),
                           json.dumps(self.info, indent=2, sort_keys=True, default=str), args.output_dir or ".")
        return control


class CheckpointLedgerCallback(TrainerCallback):
    """Record every checkpoint this run saves in the output folder's ledger
    (:class:`~st_hardneg.training.checkpoints.CheckpointLedger`), with the files the save wrote into it, and rotate
    among this run's checkpoints only: at most ``save_total_limit`` of them are kept, the newest and the best always;
    a checkpoint is removed file by file, only the files this run wrote and that are unchanged since, so a file the
    user added stays (named in a warning); a folder this run did not write is never removed.
    :func:`st_hardneg.training.train` adds it, last among the callbacks (it sees every callback's decision to save,
    and the files the others write into the checkpoint), and gives transformers' own rotation, which deletes every
    ``checkpoint-*`` folder it finds, nothing to do (``save_total_limit=None``).

    Args:
        save_total_limit: how many of this run's checkpoints to keep (``None`` or ``<= 0``: all).

    Raises:
        RuntimeError: at the step before a save, when the folder the Trainer would save into exists and no
            st-hardneg run wrote it (a user's ``checkpoint-N``): it would be overwritten.
        OutsideOutputFolderError: at the step before a save, when the checkpoint folder, or an entry in it, is a
            symbolic link (the Trainer would write through it), or the run's ``eval/`` folder is one
            (:func:`~st_hardneg.reporting.check_output_tree`).
    """

    def __init__(self, save_total_limit: int | None = None) -> None:
        self.save_total_limit = save_total_limit
        #: the checkpoint folder names this run wrote, oldest first
        self.written: list[str] = []
        #: the files this run wrote into each of them: relative path → [size, mtime_ns]
        self.files: dict[str, dict[str, list[int]]] = {}
        self._before: dict[str, dict[str, list[int]]] = {}
        self._eval_existed = True

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> TrainerControl:
        import os

        from st_hardneg.reporting import check_output_tree
        from st_hardneg.training.checkpoints import CheckpointLedger

        self.written, self.files, self._before = [], {}, {}
        folder = args.output_dir or "."
        self._eval_existed = os.path.lexists(os.path.join(folder, "eval"))
        if state.is_world_process_zero:
            check_output_tree(os.path.join(folder, "eval"), folder)  # the evaluator writes there
            if args.save_strategy != "no":
                CheckpointLedger(folder).begin()
        return control

    def _record_run_folders(self, folder: str) -> None:
        import os

        from st_hardneg.training.checkpoints import CheckpointLedger

        path = os.path.join(folder, "eval")
        if not self._eval_existed and os.path.isdir(path) and not os.path.islink(path):
            CheckpointLedger(folder).add_folder("eval")  # the Trainer made it for the evaluator: the run's own
            self._eval_existed = True

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> TrainerControl:
        if state.is_world_process_zero:
            self._record_run_folders(args.output_dir or ".")
        return control

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> TrainerControl:
        import os

        from st_hardneg.reporting import check_output_tree
        from st_hardneg.training.checkpoints import CheckpointLedger, file_record

        if not state.is_world_process_zero:
            return control
        name = f"checkpoint-{state.global_step}"
        folder = args.output_dir or "."
        target = os.path.join(folder, name)
        if control.should_save:
            check_output_tree(target, folder)
            if os.path.lexists(target) and name not in CheckpointLedger(folder).written():
                raise RuntimeError(f"{target} exists and no st-hardneg run wrote it: saving this step's checkpoint "
                                   "would overwrite it; move it or choose another output folder")
        if os.path.isdir(target) and not os.path.islink(target):  # what is there before a save is not this run's
            self._before[name] = file_record(target)
        return control

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> TrainerControl:
        import os

        from st_hardneg.training.checkpoints import CheckpointLedger, file_record, remove_checkpoint

        if not state.is_world_process_zero:
            return control
        folder = args.output_dir or "."
        name = f"checkpoint-{state.global_step}"
        self._record_run_folders(folder)
        target = os.path.join(folder, name)
        if not os.path.isdir(target) or os.path.islink(target):
            return control
        ledger = CheckpointLedger(folder)
        before = self._before.pop(name, {})
        # this run's files: those the save created or changed; an earlier st-hardneg run's unchanged files stay
        # recorded as st-hardneg's, anything else in the folder is not recorded (a user's file)
        mine = {rel: fp for rel, fp in file_record(target).items() if before.get(rel) != fp}
        earlier = {rel: fp for rel, fp in ledger.ours(name).items() if rel not in mine} if name in before else {}
        ledger.add(name, {**earlier, **mine})
        self.files[name] = mine
        if name not in self.written:
            self.written.append(name)
        limit = self.save_total_limit
        if limit is None or limit <= 0 or len(self.written) <= limit:
            return control
        best = os.path.basename(os.path.normpath(state.best_model_checkpoint)) if state.best_model_checkpoint else None
        protected = {self.written[-1], best}
        keep = max(limit, len(protected - {None}))
        for old in list(self.written):
            if len(self.written) <= keep:
                break
            if old not in protected:
                remove_checkpoint(folder, old, self.files.pop(old, {}), ledger)  # file by file; the user's stay
                self.written.remove(old)
        return control
