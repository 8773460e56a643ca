"""One training recipe shared by the CLI, the benchmarks and the notebooks: the papers' unsupervised protocol on the
sentence-transformers Trainer, with STS-B dev model selection and honest step timing.

>>> from st_hardneg.training import TrainConfig, build_loss, train
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from st_hardneg.training.callbacks import CHECKPOINT_RUN_FILE, EvaluateAtEnd, StepTimer, StopAfterSteps

if TYPE_CHECKING:
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainingArguments
    from sentence_transformers.base.evaluation.evaluator import BaseEvaluator
    from torch import nn
    from transformers import TrainerCallback

logger = logging.getLogger(__name__)

__all__ = ["TrainConfig", "TrainResult", "check_hub_access", "check_precision", "find_checkpoint",
           "parse_training_args", "train", "training_arguments"]


# --------------------------------------------------------------------------- the recipe
@dataclass
class TrainConfig:
    """Hyperparameters of the unsupervised protocol (defaults: the papers' BERT-base setting).

    ``max_steps`` (> 0) shortens the run *and* its LR schedule; ``stop_after_steps`` (> 0) keeps the full run's
    schedule and stops early (see :class:`StopAfterSteps`), for screening hyperparameters. ``warmup_ratio`` is the
    share of the steps, in [0, 1), with linear warm-up. Every value is checked when the config is made: a
    ``ValueError`` names all bad ones. ``extra_args`` are ``SentenceTransformerTrainingArguments`` fields that
    override the recipe's values (see :func:`parse_training_args`); with ``resume_from_checkpoint`` (a checkpoint
    folder) :func:`train` resumes from it.
    """

    output_dir: str = "output/st-hardneg"
    batch_size: int = 64
    learning_rate: float = 3e-5
    epochs: float = 1.0
    max_steps: int = -1
    stop_after_steps: int = 0
    warmup_ratio: float = 0.0
    seed: int = 0
    eval_steps: int = 125
    logging_steps: int = 10
    no_duplicates: bool = True
    drop_last: bool = True
    save_checkpoints: bool = True
    fp16: bool = False
    bf16: bool = False
    show_progress_bar: bool = True
    extra_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # checked here, where the config is made (before any data, model or mining): a bad value never reaches the
        # Trainer, which would fail late or, for warmup_ratio = 1.0, silently warm up for one step
        def whole(value: Any) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        def real(value: Any) -> bool:
            return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

        problems = []
        if not whole(self.batch_size) or self.batch_size < 1:
            problems.append(f"batch_size must be a positive integer, got {self.batch_size!r}")
        if not real(self.learning_rate) or self.learning_rate <= 0:
            problems.append(f"learning_rate must be a positive number, got {self.learning_rate!r}")
        if not real(self.epochs) or self.epochs <= 0:
            problems.append(f"epochs must be a positive number, got {self.epochs!r}")
        if not real(self.warmup_ratio) or not 0 <= self.warmup_ratio < 1:
            problems.append(f"warmup_ratio must be in [0, 1) (a share of the steps), got {self.warmup_ratio!r}")
        if not whole(self.max_steps) or (self.max_steps < 1 and self.max_steps != -1):
            problems.append(f"max_steps must be a positive integer or -1 (use epochs), got {self.max_steps!r}")
        for name in ("stop_after_steps", "eval_steps"):
            value = getattr(self, name)
            if not whole(value) or value < 0:
                problems.append(f"{name} must be a non-negative integer (0 = off), got {value!r}")
        if not whole(self.logging_steps) or self.logging_steps < 1:
            problems.append(f"logging_steps must be a positive integer, got {self.logging_steps!r}")
        if self.fp16 and self.bf16:
            problems.append("fp16 and bf16 are exclusive: choose one")
        if problems:
            raise ValueError("TrainConfig: " + "; ".join(problems))


@dataclass
class TrainResult:
    """What :func:`train` measured."""

    train_seconds: float
    steps: int
    median_step_seconds: float | None
    step_seconds: list[float]
    best_metric: float | None
    best_checkpoint: str | None
    log_history: list[dict[str, Any]]
    #: the checkpoint folders (names inside the output folder) this run wrote and kept; nothing else there is its
    checkpoints: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def training_arguments(config: TrainConfig, with_evaluator: bool) -> SentenceTransformerTrainingArguments:
    """``SentenceTransformerTrainingArguments`` for the protocol in ``config``."""
    from sentence_transformers import SentenceTransformerTrainingArguments
    from sentence_transformers.base.sampler import BatchSamplers

    evaluate = with_evaluator and config.eval_steps > 0
    save = evaluate and config.save_checkpoints
    kwargs: dict[str, Any] = dict(
        output_dir=config.output_dir,
        per_device_train_batch_size=config.batch_size,
        learning_rate=config.learning_rate,
        num_train_epochs=config.epochs,
        max_steps=config.max_steps,
        warmup_steps=float(config.warmup_ratio),  # a float in [0, 1) is a share of the steps (transformers >= 5)
        lr_scheduler_type="linear",
        seed=config.seed,
        data_seed=config.seed,
        batch_sampler=BatchSamplers.NO_DUPLICATES if config.no_duplicates else BatchSamplers.BATCH_SAMPLER,
        dataloader_drop_last=config.drop_last,
        logging_steps=config.logging_steps,
        eval_strategy="steps" if evaluate else "no",
        eval_steps=config.eval_steps if evaluate else None,
        save_strategy="steps" if save else "no",
        save_steps=config.eval_steps if save else None,
        save_total_limit=2 if save else None,
        load_best_model_at_end=save,
        metric_for_best_model="eval_sts-dev_spearman" if save else None,
        greater_is_better=True,
        report_to=[],
        fp16=config.fp16,
        bf16=config.bf16,
        disable_tqdm=not config.show_progress_bar,
        dataloader_pin_memory=_has_cuda(),  # pinning without a GPU only warns
    )
    kwargs.update(config.extra_args)
    return SentenceTransformerTrainingArguments(**kwargs)


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _rows(dataset: Any) -> str:
    try:
        return str(len(dataset))
    except TypeError:  # an iterable dataset
        return "its"


def _check_some_steps(train_dataset: Any, args: SentenceTransformerTrainingArguments) -> None:
    """Raise ``ValueError`` when ``train_dataset`` (a sized dataset) cannot fill one batch of ``args``: the run
    would make 0 optimizer steps and return an untrained model."""
    if isinstance(train_dataset, dict) or not hasattr(train_dataset, "__len__"):
        return  # several datasets or an iterable one: the Trainer's step count is checked after training
    rows = len(train_dataset)
    batch = args.per_device_train_batch_size * max(args.world_size, 1)
    if rows == 0:
        raise ValueError("train_dataset has no rows: the run would make 0 optimizer steps")
    if rows < batch and args.dataloader_drop_last:
        raise ValueError(
            f"train_dataset has {rows} row(s), fewer than one batch of {batch}, and the last partial batch is dropped "
            "(drop_last): the run would make 0 optimizer steps. Use more data or a smaller batch_size.")


def train(model: SentenceTransformer, train_dataset: Dataset, loss: nn.Module, config: TrainConfig,
          evaluator: BaseEvaluator | None = None, callbacks: list[TrainerCallback] | None = None) -> TrainResult:
    """Train ``model`` with ``loss`` on ``train_dataset`` (columns anchor, positive) using the ST Trainer.

    With an ``evaluator`` (e.g. :class:`~st_hardneg.evaluation.SentEvalSTSEvaluator` on STS-B dev) the model is
    evaluated every ``config.eval_steps`` steps and at the end, and the best checkpoint is loaded at the end
    (the papers' selection rule). The model is modified in place. Checkpoints are rotated among this run's own
    (``save_total_limit``), never a folder the run did not write
    (:class:`~st_hardneg.training.callbacks.CheckpointLedgerCallback`); ``TrainResult.checkpoints`` names those it
    kept. ``config.extra_args["resume_from_checkpoint"]``
    resumes from that checkpoint folder (a stateful loss too, exactly:
    :class:`~st_hardneg.training.callbacks.StatefulLossCallback`). The model card names st-hardneg
    (:class:`~st_hardneg.training.callbacks.ModelCardCallback`).

    Raises:
        ValueError: ``train_dataset`` has fewer rows than one batch (with ``drop_last``) or no row: the run would
            make no optimizer step (checked before the Trainer is built).
        RuntimeError: the Trainer made no optimizer step all the same (e.g. ``BatchSamplers.NO_DUPLICATES`` could
            not fill one batch of distinct texts): the model is untrained, and no result is returned for it.

    Warns:
        UserWarning: ``loss`` was built on another model than ``model`` (see
            :func:`~st_hardneg.training.callbacks.check_loss_model`; before the Trainer is built), or the Trainer's
            optimizer holds none of ``model``'s parameters (at the start of training): ``model`` would not train.
    """
    from sentence_transformers import SentenceTransformerTrainer

    from st_hardneg.training.callbacks import (
        CheckpointLedgerCallback,
        LossModelCheck,
        ModelCardCallback,
        add_stateful_loss_callback,
    )

    timer = StepTimer()
    stop = [StopAfterSteps(config.stop_after_steps)] if config.stop_after_steps else []
    args = training_arguments(config, with_evaluator=evaluator is not None)
    # rotation among this run's own checkpoints only: transformers' would delete every checkpoint-* folder it finds
    ledger = CheckpointLedgerCallback(args.save_total_limit)
    args.save_total_limit = None
    _check_some_steps(train_dataset, args)
    model_check = LossModelCheck(loss)
    model_check.check(model)  # before the Trainer exists: a loss of another model is named before any work
    trainer = SentenceTransformerTrainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        loss=loss,
        evaluator=evaluator if args.eval_strategy != "no" else None,
        # the ledger last: it sees every callback's decision to save, and records the files they write into a checkpoint
        callbacks=[timer, EvaluateAtEnd(), model_check, ModelCardCallback(loss), *stop, *(callbacks or []), ledger],
    )
    add_stateful_loss_callback(trainer)  # stateful losses (AdCSE) restore their state on resume
    start = time.perf_counter()
    # TrainingArguments.resume_from_checkpoint is only a field; the Trainer resumes when train() is given it
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint or None)
    seconds = time.perf_counter() - start
    if trainer.state.global_step < 1:
        raise RuntimeError(
            f"training made 0 optimizer steps on {_rows(train_dataset)} rows (batch size {args.per_device_train_batch_size}"
            f", dataloader_drop_last={args.dataloader_drop_last}): the model is untrained. Use more data or a smaller "
            "batch size (BatchSamplers.NO_DUPLICATES needs enough distinct texts to fill a batch).")
    return TrainResult(
        train_seconds=seconds,
        steps=trainer.state.global_step,
        median_step_seconds=timer.median(),
        step_seconds=timer.step_seconds,
        best_metric=trainer.state.best_metric,
        best_checkpoint=trainer.state.best_model_checkpoint,
        log_history=list(trainer.state.log_history),
        checkpoints=list(ledger.written),
    )


# --------------------------------------------------------------------------- every TrainingArguments field by name
_TRUE = ("true", "yes", "1", "on")
_FALSE = ("false", "no", "0", "off")


def _convert_field(name: str, raw: str, hint: Any, option: str) -> Any:
    """``raw`` (a command-line string) as a value of the field ``name`` whose type is ``hint``."""
    import enum
    import json
    import types
    import typing

    origin = typing.get_origin(hint)
    members = typing.get_args(hint) if origin in (typing.Union, types.UnionType) else (hint,)
    plain = [typing.get_origin(m) or m for m in members]
    text = raw.strip()
    wrong = f"{option} {name}={raw!r}"
    if type(None) in plain and str not in plain and text.lower() in ("none", "null"):
        return None
    if bool in plain:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        if str not in plain:
            raise ValueError(f"{wrong}: {name} is true or false")
    if typing.Literal in plain and text.lower() in _FALSE:
        return False
    if int in plain:
        try:
            return int(text)
        except ValueError:
            if float not in plain:
                raise ValueError(f"{wrong}: {name} is a whole number") from None
    if float in plain:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{wrong}: {name} is a number") from None
    choices = [m for m in plain if isinstance(m, type) and issubclass(m, enum.Enum)]
    if choices:
        values = [str(member.value) for member in choices[0]]
        if text not in values:
            import difflib

            close = difflib.get_close_matches(text, values, 1)
            hint_text = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(f"{wrong}: not a choice of {name}{hint_text}; choose from {', '.join(values)}")
        return text
    if dict in plain and text.startswith("{"):
        try:
            value = json.loads(text)
        except ValueError:
            raise ValueError(f"{wrong}: {name} takes a JSON object such as {{\"key\": 1}}") from None
        if not isinstance(value, dict):
            raise ValueError(f"{wrong}: {name} takes a JSON object")
        return value
    if list in plain and ("," in text or str not in plain):
        return [item.strip() for item in text.split(",") if item.strip()]
    if str in plain:
        return text
    raise ValueError(f"{wrong}: {name} ({hint}) cannot be set from the command line")


def parse_training_args(items: list[str] | None, *, reserved: dict[str, str] | None = None,
                        option: str = "--training-arg") -> dict[str, Any]:
    """``["gradient_accumulation_steps=2", "bf16=true", "report_to=tensorboard"]`` → ``{"gradient_accumulation_steps":
    2, "bf16": True, "report_to": "tensorboard"}``: any field of ``SentenceTransformerTrainingArguments``, converted
    to the field's type (``true``/``false``; whole numbers; numbers; a choice of the field's enum; ``none``; a JSON
    object for a dict field; ``a,b`` for a list field). The result goes into ``TrainConfig.extra_args``, where it
    overrides the recipe's value.

    Args:
        items: ``KEY=VALUE`` strings.
        reserved: fields that have their own option, field → option (e.g. ``{"learning_rate": "--lr"}``): refused
            with that option's name.
        option: the command-line option named in the error messages.

    Returns:
        The converted values by field name.

    Raises:
        ValueError: an item without ``=``, an unknown field (with the closest field's name), a field given twice or
            reserved, or a value of the wrong type.

    Example:
        ::

            >>> parse_training_args(["gradient_accumulation_steps=2", "save_strategy=steps"])
            {'gradient_accumulation_steps': 2, 'save_strategy': 'steps'}
    """
    import dataclasses
    import difflib
    import typing

    from sentence_transformers import SentenceTransformerTrainingArguments

    fields = {f.name: f for f in dataclasses.fields(SentenceTransformerTrainingArguments) if f.init}
    hints = typing.get_type_hints(SentenceTransformerTrainingArguments)
    result: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        name = key.strip().replace("-", "_")
        if not sep or not name:
            raise ValueError(f"{option} expects KEY=VALUE, got {item!r}")
        if name not in fields:
            close = difflib.get_close_matches(name, list(fields), 1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(f"{option}: SentenceTransformerTrainingArguments has no field {name}{hint}")
        if reserved and name in reserved:
            raise ValueError(f"{option} {name}: set it with {reserved[name]}")
        if name in result:
            raise ValueError(f"{option} gives {name} twice; give it once")
        result[name] = _convert_field(name, raw, hints[name], option)
    return result


#: ``--training-arg`` fields transformers checks late (at ``train()``) or never, with the range each must lie in:
#: field → (lowest, highest, lowest included, highest included, what it is)
TRAINING_ARG_RANGES: dict[str, tuple[float, float, bool, bool, str]] = {
    "gradient_accumulation_steps": (1, math.inf, True, False, "a whole number of batches >= 1"),
    "per_device_eval_batch_size": (1, math.inf, True, False, "a batch size >= 1"),
    "dataloader_num_workers": (0, math.inf, True, False, "a number of worker processes >= 0"),
    "max_grad_norm": (0, math.inf, True, False, "a gradient norm >= 0 (0 = no clipping)"),
    "weight_decay": (0, math.inf, True, False, "a decay >= 0"),
    "label_smoothing_factor": (0, 1, True, False, "a share in [0, 1)"),
    "adam_beta1": (0, 1, True, False, "a decay rate in [0, 1)"),
    "adam_beta2": (0, 1, True, False, "a decay rate in [0, 1)"),
    "adam_epsilon": (0, math.inf, False, False, "a number > 0"),
    "save_total_limit": (1, math.inf, True, False, "a number of checkpoints >= 1 (or none: keep all)"),
}


def check_training_values(extra_args: dict[str, Any], option: str = "--training-arg") -> None:
    """The range checks transformers makes only when training starts, or never (:data:`TRAINING_ARG_RANGES`), and
    ``report_to`` integrations that are not installed: all before any model loads.

    Raises:
        ValueError: one line naming the field, the value and the range (or the missing package).
    """
    for name, (low, high, low_in, high_in, what) in TRAINING_ARG_RANGES.items():
        if name not in extra_args or extra_args[name] is None:
            continue
        value = extra_args[name]
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        inside = number and (value >= low if low_in else value > low) and (value <= high if high_in else value < high)
        if not inside:
            raise ValueError(f"{option} {name}={value!r}: {name} is {what}")
    report = extra_args.get("report_to")
    wanted = [report] if isinstance(report, str) else list(report or [])
    wanted = [item for item in wanted if item not in ("none", "all")]
    if wanted:
        from transformers.integrations import get_available_reporting_integrations, get_reporting_integration_callbacks

        try:
            get_reporting_integration_callbacks(wanted)
        except ValueError as exc:
            raise ValueError(f"{option} report_to: {' '.join(str(exc).split())}") from None
        installed = get_available_reporting_integrations()
        missing = [item for item in wanted if item not in installed]
        if missing:
            raise ValueError(f"{option} report_to={','.join(wanted)}: {', '.join(missing)} is not installed (pip install "
                             f"{' '.join(missing)}); installed: {', '.join(installed) or 'none'}")


def check_precision(extra_args: dict[str, Any]) -> dict[str, Any]:
    """Check ``bf16`` / ``fp16`` of ``extra_args`` against this machine before any model loads; returns
    ``extra_args``, with ``use_cpu=True`` added for ``bf16`` on a machine without a GPU (CPU autocast, which the
    Trainer otherwise refuses with "Your setup doesn't support bf16/gpu").

    Raises:
        ValueError: ``bf16`` on a GPU without bfloat16 (or a CPU build of torch without it), ``fp16`` without a
            CUDA GPU, or both.
    """
    import torch

    bf16, fp16 = bool(extra_args.get("bf16")), bool(extra_args.get("fp16"))
    if bf16 and fp16:
        raise ValueError("bf16 and fp16 are exclusive: choose one")
    cpu = bool(extra_args.get("use_cpu")) or not torch.cuda.is_available()
    if bf16:
        if not cpu and not torch.cuda.is_bf16_supported():
            raise ValueError(f"bf16=true: this GPU ({torch.cuda.get_device_name()}) cannot compute in bfloat16; use "
                             "fp16=true or neither")
        if cpu:
            from transformers.utils import is_torch_bf16_available_on_device

            if not is_torch_bf16_available_on_device("cpu"):
                raise ValueError("bf16=true: this machine has no GPU and torch cannot run bfloat16 on its CPU")
            return {**extra_args, "use_cpu": True}
    if fp16 and cpu:
        raise ValueError("fp16=true needs a CUDA GPU and this run has none; use bf16=true on a CPU")
    return extra_args


def check_hub_access(extra_args: dict[str, Any]) -> None:
    """``push_to_hub=True`` needs ``hub_model_id``, a token and the Hub within reach: checked before any model
    loads (the Trainer would otherwise train for hours and fail at its first push).

    Raises:
        ValueError: no ``hub_model_id``, ``HF_HUB_OFFLINE`` set, no token, or the Hub not reachable with it.
    """
    if not extra_args.get("push_to_hub"):
        if extra_args.get("hub_model_id"):
            raise ValueError("hub_model_id is set but push_to_hub is not: add push_to_hub=true or drop hub_model_id")
        return
    if not extra_args.get("hub_model_id"):
        raise ValueError("push_to_hub=true needs hub_model_id=USER/NAME: the repository to push to")
    from huggingface_hub import constants, get_token

    if constants.HF_HUB_OFFLINE:
        raise ValueError("push_to_hub=true, but HF_HUB_OFFLINE is set: this run cannot reach the Hugging Face Hub")
    token = extra_args.get("hub_token") or get_token()
    if not token:
        raise ValueError("push_to_hub=true needs a Hugging Face token: run `hf auth login`, set HF_TOKEN, or pass "
                         "hub_token=...")
    from huggingface_hub import HfApi

    try:
        HfApi().whoami(token=token)
    except Exception as exc:  # no network, a revoked token: either way nothing could be pushed
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"push_to_hub=true, but the Hugging Face Hub does not answer with this token: {first}") \
            from None


def find_checkpoint(path: str, run: dict[str, Any] | None = None, option: str = "resume_from_checkpoint") -> str:
    """The checkpoint folder to resume from: ``path`` itself (a folder with ``trainer_state.json``) or the latest
    ``checkpoint-N`` inside it; with ``run`` (``{"loss": ..., "loss_args": ...}``), the checkpoint must have been
    written by a run of the same loss and loss arguments (its :data:`CHECKPOINT_RUN_FILE`).

    Raises:
        ValueError: no such folder, no checkpoint in it, or a checkpoint of another loss or other loss arguments.
    """
    import json
    from pathlib import Path

    from transformers.trainer_utils import get_last_checkpoint

    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ValueError(f"{option} {folder}: no such folder")
    if not (folder / "trainer_state.json").is_file():
        last = get_last_checkpoint(str(folder))
        if last is None:
            raise ValueError(f"{option} {folder} holds no checkpoint (no trainer_state.json, no checkpoint-N folder)")
        folder = Path(last)
    if run is not None:
        info_file = folder / CHECKPOINT_RUN_FILE
        if not info_file.is_file():
            raise ValueError(f"{option} {folder} was not written by st-hardneg train (no {CHECKPOINT_RUN_FILE}): its "
                             "loss is unknown")
        try:
            saved = json.loads(info_file.read_text(encoding="utf-8"))
            if not isinstance(saved, dict):
                raise ValueError("not a JSON object")
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"{option}: {info_file} is damaged ({str(exc).splitlines()[0]}); it records the loss "
                             "of the checkpoint: resume from another checkpoint") from None
        for key in ("loss", "loss_args"):
            if json.dumps(saved.get(key), sort_keys=True) != json.dumps(run.get(key), sort_keys=True, default=str):
                raise ValueError(f"{option} {folder} is a checkpoint of {key} {saved.get(key)!r}, this run trains "
                                 f"{run.get(key)!r}: resume with the same loss and loss arguments")
    return str(folder)
