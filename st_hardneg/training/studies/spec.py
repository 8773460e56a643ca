"""A study written as data: its protocol, its rows, its datasets, its grid and its choice rule.

A spec is a JSON (or TOML) object; :func:`load_spec` reads and checks it, :func:`spec_from_methods` builds one from
``--method LABEL=LOSS[:key=value,...]`` strings (``st-hardneg study``). Every check runs before any model loads: an
unknown loss or option names the row, a bad seed or a grid point naming an unknown row or dataset names the point.

Example:
    ::

        {"name": "my-study",
         "protocol": {"batch_size": 32, "learning_rate": 2e-5, "epochs": 1, "warmup_ratio": 0.1},
         "rows": {"mnrl": {"loss": "mnrl"}, "focal+ctl": {"loss": "focal", "control": true}},
         "datasets": {"scifact": {"folder": "retrieval/scifact"}},
         "grid": [{"datasets": ["scifact"], "rows": ["mnrl", "focal+ctl"], "seeds": [0, 1, 2]}],
         "choice": {"metric": "ndcg@10", "tie_sds": 2.0, "baseline": "mnrl"}}

>>> from st_hardneg.training.studies.spec import load_spec, spec_from_methods
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["EXTERNAL_LOSSES", "MAX_SEED", "Choice", "Dataset", "Point", "Row", "StudySpec", "load_spec",
           "parse_method", "spec_from_methods"]

#: sentence-transformers' losses a row may name besides the registry's (:data:`~st_hardneg.training.registry.LOSSES`):
#: GISTEmbedLoss guided by the untrained model, frozen (temperature 0.01), and CachedMultipleNegativesRankingLoss
EXTERNAL_LOSSES: dict[str, tuple[str, str]] = {
    "gist": ("sentence_transformers.sentence_transformer.losses", "GISTEmbedLoss"),
    "cached_mnrl": ("sentence_transformers.sentence_transformer.losses", "CachedMultipleNegativesRankingLoss"),
}
#: the largest seed a study accepts (the Trainer's seeds are 32-bit)
MAX_SEED = 2**32 - 1
#: the metrics a choice rule may use (what :func:`~st_hardneg.training.protocol.evaluate_beir_recipe` reports)
METRICS = ("ndcg@10", "mrr@10", "recall@100")
#: the training values a protocol may set (the BEIR protocol's, :data:`~st_hardneg.training.protocol.BEIR_TRAINING`)
PROTOCOL_KEYS = ("batch_size", "learning_rate", "epochs", "warmup_ratio", "max_steps", "max_seq_length",
                 "eval_max_seq_length", "dev_fraction", "dev_seed", "limit", "mining", "model")


@dataclass(frozen=True)
class Row:
    """One configuration of a study.

    Args:
        loss: a registry name (:data:`~st_hardneg.training.registry.LOSSES`), one of :data:`EXTERNAL_LOSSES`, or
            ``None`` for the model as given, evaluated without training (a reference row).
        options: the loss's keyword arguments.
        control: the recipe's false-negative control (:func:`~st_hardneg.training.recipe.controlled_loss`).
        about: one line on what the row is.
        extra: what the records say besides (the mining a benchmark ran, the batch size of a row's own), kept as the
            records carry it.
    """

    loss: str | None
    options: Mapping[str, Any] = field(default_factory=dict)
    control: bool = False
    about: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def config(self) -> dict[str, Any]:
        """The row as JSON values (what a trial records)."""
        return json.loads(json.dumps({"loss": self.loss, "options": dict(self.options), "control": self.control,
                                      **({"extra": dict(self.extra)} if self.extra else {})}))


@dataclass(frozen=True)
class Dataset:
    """A dataset of a study: a BEIR folder, or the data a benchmark's own trial reads or makes.

    Args:
        folder: the folder or file (relative to the study's data root, or absolute); ``None`` for a trial that makes
            its own data (a timing benchmark's synthetic batches), which only a spec naming its ``trial`` may have.
        dev: ``"qrels"``: its ``qrels/dev.tsv``; ``"carve"``: a share of the training queries
            (:func:`~st_hardneg.data.beir.beir_retrieval`, the protocol's ``dev_fraction``); ``"auto"``: the first that
            the folder allows.
        test_as: the dataset whose test set this one's is (a longer protocol on the same folder), else itself.
        extra: what the records say besides (e.g. the pair sampling of a benchmark).
    """

    folder: str | None = None
    dev: str = "auto"
    test_as: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Choice:
    """The choice rule: rows ranked by their dev ``metric`` (mean over seeds, pooled over datasets); a row within
    ``tie_sds`` seed standard deviations of the best ties with it; the paired tests are against ``baseline``.

    A trial's dev value is its record's ``dev[metric]``, else its record's own field ``metric`` (a benchmark whose
    records keep their dev score at the top, as the STS records' ``stsb_dev_best``). ``metric`` ``None``: a study that
    measures and chooses nothing (a timing benchmark); its trials' value is 0."""

    metric: str | None = "ndcg@10"
    tie_sds: float = 2.0
    baseline: str | None = None


@dataclass(frozen=True, order=True)
class Point:
    """One trial of the grid: a row on a dataset at a seed (``None``: a row without training)."""

    dataset: str
    row: str
    seed: int | None

    @property
    def key(self) -> str:
        """``dataset/row/seed`` (``-`` for no seed): the trial's name in the engine."""
        return f"{self.dataset}/{self.row}/{'-' if self.seed is None else self.seed}"


@dataclass(frozen=True)
class StudySpec:
    """A study: its name, protocol values, rows, datasets, grid (:meth:`points`) and choice rule.

    Args:
        name: the study's name in the storage.
        protocol: the training values (:data:`PROTOCOL_KEYS`) and anything a benchmark's records say of it.
        rows: label → :class:`Row`, in the order the tables list them.
        datasets: name → :class:`Dataset`.
        grid: blocks ``{"datasets": [...], "rows": [...], "seeds": [...]}``; every combination is one trial.
        choice: the :class:`Choice`.
        report: where a benchmark's records and renderer are (``records``, ``renderer``), for its own tables.
        about: what the study asks, in a sentence or two.
        trial: the trial function (``module:function``, called as ``function(spec, point, context)`` and returning
            the trial's record) of a benchmark whose trials follow its own protocol (its rows' and datasets'
            ``extra``); ``None``: :func:`~st_hardneg.training.studies.beir.run_point`.
    """

    name: str
    protocol: Mapping[str, Any]
    rows: Mapping[str, Row]
    datasets: Mapping[str, Dataset]
    grid: Sequence[Mapping[str, Any]]
    choice: Choice = field(default_factory=Choice)
    report: Mapping[str, Any] = field(default_factory=dict)
    about: str = ""
    trial: str | None = None

    def points(self) -> list[Point]:
        """Every trial of the grid, in grid order, each once."""
        out = {Point(name, row, seed): None for block in self.grid for name in block["datasets"]
               for row in block["rows"] for seed in block["seeds"]}
        return list(out)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (what :func:`load_spec` reads; the study stores it and refuses another on resume)."""
        return json.loads(json.dumps({
            "name": self.name, "protocol": dict(self.protocol),
            "rows": {label: {k: v for k, v in asdict(row).items() if v or k == "loss"} for label, row in self.rows.items()},
            "datasets": {name: {k: v for k, v in asdict(d).items() if v}
                         for name, d in self.datasets.items()},
            "grid": [dict(block) for block in self.grid], "choice": asdict(self.choice),
            **({"report": dict(self.report)} if self.report else {}), **({"about": self.about} if self.about else {}),
            **({"trial": self.trial} if self.trial else {})}))


def parse_method(text: str) -> tuple[str, Row]:
    """``LABEL=LOSS[:key=value,...]`` (``--method``) → ``(label, Row)``; ``LOSS`` alone is labelled by itself, and a
    ``+ctl`` ending on the label or ``control=true`` among the options turns the control on.

    Raises:
        ValueError: no loss, a malformed ``key=value``, naming the text.
    """
    from st_hardneg.training.registry import parse_loss_args

    head, _, arguments = text.partition(":")
    label, sep, loss = head.partition("=")
    if not sep:  # LOSS[:key=value,...]: the loss is its own label
        loss = label
    label, loss = label.strip(), loss.strip()
    if not label or not loss:
        raise ValueError(f"--method expects LABEL=LOSS[:key=value,...], got {text!r}")
    options = parse_loss_args([a for a in arguments.split(",") if a.strip()], option=f"--method {label}")
    control = options.pop("control", False)
    if not isinstance(control, bool):
        raise ValueError(f"--method {label}: control must be true or false, got {control!r}")
    return label, Row(loss=loss, options=options, control=control or label.endswith("+ctl"))


def spec_from_methods(methods: Sequence[str], *, datasets: Mapping[str, Dataset], seeds: Sequence[int],
                      control: bool = False, protocol: Mapping[str, Any] | None = None, name: str = "study",
                      baseline: str | None = None, tie_sds: float = 2.0) -> StudySpec:
    """The spec of ``st-hardneg study``: one row per ``--method`` (and with ``control`` each st-hardneg row's twin
    with the control, labelled ``LABEL+ctl``), every row on every dataset at every seed; checked (:func:`check_spec`).

    Raises:
        ValueError: a bad method, a label given twice, a bad seed, an unknown loss or option.
    """
    rows: dict[str, Row] = {}
    for text in methods:
        label, row = parse_method(text)
        twins = [(label, row)]
        if control and not row.control and row.loss in _controllable():
            twins.append((f"{label}+ctl", Row(loss=row.loss, options=row.options, control=True)))
        for key, value in twins:
            if key in rows:
                raise ValueError(f"--method: the label {key!r} is given twice; give each row its own label")
            rows[key] = value
    spec = StudySpec(name=name, protocol=dict(protocol or {}), rows=rows, datasets=dict(datasets),
                     grid=[{"datasets": list(datasets), "rows": list(rows), "seeds": list(seeds)}],
                     choice=Choice(baseline=baseline if baseline is not None else next(iter(rows), None),
                                   tie_sds=tie_sds))
    check_spec(spec)
    return spec


def _controllable() -> set[str]:
    """The registry's losses that take the control (a guide and known positives)."""
    from st_hardneg.training.registry import LOSSES, loss_argument_names

    return {name for name in LOSSES if {"guide", "known_positives"} <= set(loss_argument_names(name))}


def check_row(label: str, row: Row) -> None:
    """Refuse, before any model loads, a row whose loss or options its loss would refuse.

    Raises:
        ValueError: an unknown loss, an option the loss does not take or a value it refuses, the control on a loss
            that cannot take it; naming the row.
    """
    from st_hardneg.training.registry import LOSSES, check_loss_args, check_loss_values

    where = f"row {label!r}"
    if row.loss is None:
        if row.options or row.control:
            raise ValueError(f"{where}: a row without a loss (the model as given) takes no options and no control")
        return
    if row.loss in EXTERNAL_LOSSES:
        accepted = _external_arguments(row.loss)
        unknown = sorted(set(row.options) - set(accepted))
        if unknown:
            raise ValueError(f"{where}: loss {row.loss!r} takes no argument {', '.join(unknown)}; it takes "
                             f"{', '.join(accepted)}")
        if row.control:
            raise ValueError(f"{where}: {row.loss!r} is sentence-transformers' own loss, which takes no control")
        return
    if row.loss not in LOSSES:
        raise ValueError(f"{where}: unknown loss {row.loss!r}; choose from {', '.join([*LOSSES, *EXTERNAL_LOSSES])}")
    if row.control:
        from st_hardneg.training.recipe import check_control, control_kwargs

        check_control(row.loss, dict(row.options), where)
        check_loss_values(row.loss, control_kwargs(row.loss, dict(row.options)), where)
    else:
        check_loss_args(row.loss, dict(row.options), where)
        check_loss_values(row.loss, dict(row.options), where)


def _external_arguments(name: str) -> tuple[str, ...]:
    """The keyword arguments of one of :data:`EXTERNAL_LOSSES` a row may set (not the model, nor GIST's guide)."""
    import inspect
    from importlib import import_module

    module, cls = EXTERNAL_LOSSES[name]
    parameters = inspect.signature(getattr(import_module(module), cls).__init__).parameters
    return tuple(sorted(p for p in parameters if p not in ("self", "model", "guide")))


def check_spec(spec: StudySpec) -> None:
    """Every check of a spec that needs no model: its rows (:func:`check_row`), seeds (integers in
    ``[0, MAX_SEED]``, or ``None`` for a row without training), the grid's rows and datasets, the choice rule.

    Raises:
        ValueError: naming the row, seed, dataset or rule.
    """
    from st_hardneg import validation

    if not spec.rows:
        raise ValueError("a study needs at least one row (--method LABEL=LOSS)")
    if not spec.datasets:
        raise ValueError("a study needs at least one dataset")
    for label, row in spec.rows.items():
        check_row(label, row)
    for name, dataset in spec.datasets.items():
        if dataset.folder is None and spec.trial is None:
            raise ValueError(f"dataset {name!r} has no folder: a BEIR study reads each dataset from its folder")
        if dataset.dev not in ("auto", "qrels", "carve"):
            raise ValueError(f"dataset {name!r}: dev must be 'auto', 'qrels' or 'carve', got {dataset.dev!r}")
        if dataset.test_as is not None and dataset.test_as not in spec.datasets:
            raise ValueError(f"dataset {name!r}: test_as names no dataset of the study: {dataset.test_as!r}")
    for block in spec.grid:
        missing = sorted({"datasets", "rows", "seeds"} - set(block))
        if missing:
            raise ValueError(f"a grid block without {', '.join(missing)}: {dict(block)}")
        for name in block["datasets"]:
            if name not in spec.datasets:
                raise ValueError(f"the grid names dataset {name!r}, which the study does not define")
        for label in block["rows"]:
            if label not in spec.rows:
                raise ValueError(f"the grid names row {label!r}, which the study does not define")
        if not block["seeds"]:
            raise ValueError("a grid block without seeds: give at least one (--seeds 0 1 2)")
        for seed in block["seeds"]:
            if seed is None and all(spec.rows[label].loss is None for label in block["rows"]):
                continue
            validation.check_count(seed, "seed", minimum=0)
            if seed > MAX_SEED:
                raise ValueError(f"seed must be at most {MAX_SEED}, got {seed}")
    if spec.trial is not None:
        module, sep, function = spec.trial.partition(":")
        if not (sep and module.strip() and function.strip()):
            raise ValueError(f"trial must name a function as 'module:function', got {spec.trial!r}")
    if spec.trial is None and spec.choice.metric not in METRICS:  # what the BEIR trial reports
        raise ValueError(f"the choice metric must be one of {', '.join(METRICS)}, got {spec.choice.metric!r}")
    if spec.choice.metric is not None and (not isinstance(spec.choice.metric, str) or not spec.choice.metric.strip()):
        raise ValueError(f"the choice metric must be a metric's name or null, got {spec.choice.metric!r}")
    validation.check_number(spec.choice.tie_sds, "tie_sds", minimum=0.0)
    if spec.choice.baseline is not None and spec.choice.baseline not in spec.rows:
        raise ValueError(f"the baseline {spec.choice.baseline!r} is not a row of the study ({', '.join(spec.rows)})")


def _rows(raw: Mapping[str, Any]) -> dict[str, Row]:
    out = {}
    for label, value in raw.items():
        unknown = sorted(set(value) - {"loss", "options", "control", "about", "extra"})
        if unknown:
            raise ValueError(f"row {label!r}: unknown field(s) {', '.join(unknown)}")
        out[label] = Row(loss=value.get("loss"), options=dict(value.get("options") or {}),
                         control=bool(value.get("control", False)), about=str(value.get("about", "")),
                         extra=dict(value.get("extra") or {}))
    return out


def spec_from_dict(raw: Mapping[str, Any], where: str = "the spec") -> StudySpec:
    """A :class:`StudySpec` from its JSON form, checked (:func:`check_spec`).

    Raises:
        ValueError: a missing or unknown field, or what :func:`check_spec` refuses; prefixed with ``where``.
    """
    try:
        unknown = sorted(set(raw) - {"name", "protocol", "rows", "datasets", "grid", "choice", "report", "about",
                                   "trial"})
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(unknown)}")
        missing = sorted({"name", "rows", "datasets", "grid"} - set(raw))
        if missing:
            raise ValueError(f"missing field(s) {', '.join(missing)}")
        datasets = {}
        for name, d in raw["datasets"].items():
            unknown = sorted(set(d) - {"folder", "dev", "test_as", "extra"})
            if unknown:
                raise ValueError(f"dataset {name!r}: unknown field(s) {', '.join(unknown)}")
            datasets[name] = Dataset(folder=d.get("folder"), dev=d.get("dev", "auto"), test_as=d.get("test_as"),
                                     extra=dict(d.get("extra") or {}))
        spec = StudySpec(name=str(raw["name"]), protocol=dict(raw.get("protocol") or {}), rows=_rows(raw["rows"]),
                         datasets=datasets, grid=list(raw["grid"]), choice=Choice(**(raw.get("choice") or {})),
                         report=dict(raw.get("report") or {}), about=str(raw.get("about", "")),
                         trial=None if raw.get("trial") is None else str(raw["trial"]))
        check_spec(spec)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
    return spec


def load_spec(path: str | Path) -> StudySpec:
    """Read a spec file (``.json``, or ``.toml``) and check it (:func:`spec_from_dict`).

    Raises:
        ValueError: a missing or unreadable file, or a bad spec; naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no study spec at {path}")
    try:
        if path.suffix == ".toml":
            import tomllib

            raw = tomllib.loads(path.read_text(encoding="utf8"))
        else:
            raw = json.loads(path.read_text(encoding="utf8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"the study spec {path} cannot be read: {exc}") from None
    return spec_from_dict(raw, where=f"the study spec {path}")


def seeds_text(seeds: Iterable[int | None]) -> str:
    """``0, 1, 2`` (``-`` for a row without training)."""
    return ", ".join("-" if s is None else str(s) for s in seeds)
