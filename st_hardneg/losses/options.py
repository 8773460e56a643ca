"""The keyword options every st-hardneg loss shares, each declared once: a field of :class:`SharedOptions` (or, for the
cross-batch queue, of :class:`QueueOptions`) made by :func:`option`, which carries its default, its check and its
documentation. The loss's constructor signature, its keyword documentation (:class:`LossOptions`, which every loss's
docstring links to), its attributes, their assignment and ``get_config_dict`` are made from those fields.
:class:`~st_hardneg.losses.base.HardNegativeLoss` builds the checked value from its keywords (what needs the model or
the guide model is checked there). The queue's options are the flat ``queue_*`` keywords (``queue_size=4096``), the
spelling of the command line, the config and the messages; ``queue=QueueOptions(...)`` / ``queue=<size>`` is
deprecated (it warns, naming the flat keywords) and will be removed in the next release.

This module imports nothing of :mod:`st_hardneg.losses.base`.
"""

from __future__ import annotations

import inspect
import textwrap
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal, TypedDict, TypeVar, cast, get_type_hints

from torch import Tensor

from st_hardneg import validation
from st_hardneg.functional import ranking as fr

if TYPE_CHECKING:
    from st_hardneg.losses.relevance import KnownPositives

__all__ = ["LossOptions", "QueueOptions", "SharedOptions", "constructor_signature", "loss_keywords", "not_given",
           "option", "option_attributes", "owned_error"]

_T = TypeVar("_T")
_OWNER = "QueueOptions"  # whom a message about a rule between the queue's options names, unless a loss made them
_SHARED = "SharedOptions"
Check = Callable[[Any, str], Any]


def option(default: Any, *, doc: str, check: Check | None = None, attribute: bool = True, config: bool = True,
           keyword: bool = True, keyword_type: str | None = None, keyword_default: Any = None,
           aliases: Mapping[str, tuple[str, str]] | None = None, **field_arguments: Any) -> Any:
    """One option, declared once: a dataclass field of :class:`SharedOptions` or :class:`QueueOptions` whose
    metadata carries everything else that is made from it.

    Args:
        default: the option's default (the value held when the keyword is left out).
        doc: its documentation, one paragraph of reStructuredText: the entry under its keyword in
            :class:`LossOptions` (and, for a queue option, in :class:`QueueOptions`).
        check: ``check(value, keyword) -> value``, the option's own check (with :mod:`st_hardneg.validation`'s
            wording, under the keyword's name), run as the value is made; it returns the canonical value held. A rule
            between options is written in the value's ``__post_init__``.
        attribute: whether the loss also shows it as an attribute of the same name (``loss.margin``), assignable
            through the same check.
        config: whether :meth:`~st_hardneg.HardNegativeLoss.get_config_dict` records it.
        keyword: whether the loss's constructor takes it as a keyword of the same name.
        keyword_type: the keyword's type where it differs from the value held (``temperature`` may be left ``None``).
        keyword_default: the keyword's default in the signature where ``keyword_type`` is given.
        aliases: keywords the constructor takes in place of this one, shown before it: name → (type, doc).
        field_arguments: passed on to :func:`dataclasses.field` (``repr``, ``hash``).

    Returns:
        The field (typed ``Any``, as :func:`dataclasses.field`, so that it is the default of an annotated field).
    """
    metadata = {"doc": " ".join(doc.split()), "check": check, "attribute": attribute, "config": config,
                "keyword": keyword, "keyword_type": keyword_type, "keyword_default": keyword_default,
                "aliases": dict(aliases or {})}
    return field(default=default, metadata=metadata, **field_arguments)


def _run_checks(value: Any, prefix: str = "") -> None:
    """Apply every field's own check to the (frozen) dataclass ``value``, in declaration order, under the keyword's
    name (``prefix`` + the field's name), keeping what each returns."""
    for spec in fields(value):
        check = spec.metadata.get("check")
        if check is not None:
            object.__setattr__(value, spec.name, check(getattr(value, spec.name), prefix + spec.name))


def _choice(*choices: str) -> Check:
    return lambda value, name: validation.check_choice(value, name, choices)


def _count(minimum: int) -> Check:
    return lambda value, name: validation.check_count(value, name, minimum=minimum)


def _owned(error: ValueError, default: str, owner: str) -> ValueError:
    """``error`` naming ``owner`` (the loss whose keywords made the options) where it named ``default`` (the options'
    class, made by hand); any other message unchanged."""
    message = str(error)
    if message.startswith(f"{default}: "):
        return ValueError(f"{owner}: {message.removeprefix(f'{default}: ')}")
    return error


def owned_error(error: ValueError, owner: str) -> ValueError:
    """``error`` naming the loss ``owner`` where a rule between the shared options named :class:`SharedOptions`."""
    return _owned(error, _SHARED, owner)


class _NotGiven:
    """The default of a flat ``queue_*`` keyword: shown as the value it stands for (signatures, help), and telling
    :meth:`QueueOptions.from_keywords` that the keyword was not given."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


def not_given(value: _T) -> _T:
    """The default of a flat ``queue_*`` keyword of a loss's constructor: ``value`` when the keyword is left out,
    told apart from the same value given (which :meth:`QueueOptions.from_keywords` refuses beside ``queue=``)."""
    return cast(_T, _NotGiven(value))


@dataclass(frozen=True)
class QueueOptions:
    """The options of a loss's cross-batch queue (:mod:`st_hardneg.losses.queue`), checked as they are made: every
    loss takes them as the flat keywords ``queue_size``, ``queue_warmup_steps``, ... (these fields with a ``queue_``
    prefix, the names of the command line, of the messages and of
    :meth:`~st_hardneg.HardNegativeLoss.get_config_dict`); the loss holds them as ``loss.options.queue``.
    ``queue=QueueOptions(...)`` (or ``queue=<size>``) is deprecated: it warns and will be removed in the next release.

    Raises:
        ValueError: a value out of its range (with :mod:`st_hardneg.validation`'s wording, under the flat name:
            ``queue_size must be a non-negative integer, got -1``), or ``source``, ``momentum``, ``anchors`` or
            ``as_pool`` set without a queue (``size=0``). What depends on the loss (``anchors`` without
            ``doc_to_query``, ``as_pool`` without a hardest-negative choice, a queue without a model or with a
            guide) is checked when the loss is built.

    Example:
        ::

            from st_hardneg import MixCSELoss

            loss = MixCSELoss(model, queue_size=4096, queue_warmup_steps=100, queue_source="ema")
            assert loss.options.queue == QueueOptions(size=4096, warmup_steps=100, source="ema")
    """

    size: int = option(0, check=_count(0),
        doc=("rows of the cross-batch queue (default 0 = no queue, exactly the loss without it): the detached "
             "candidates (positives and explicit negatives) of past optimizer steps join every anchor's "
             "``query_to_doc`` denominator, under the same similarity, scale and logit transform. Filled once per "
             "completed optimizer step of ``model``, never in evaluation or GradCache's replay, never cleared; a "
             "queued row whose text equals the anchor's or its positive's (``mask_duplicates``) or that passes the "
             "``margin`` is masked; the loss's own hard-negative choices (partners, top-k, adversaries) come from "
             "the batch only. With ``gather_across_devices`` every process queues the gathered rows. Needs the model "
             "(not ``None``) and no guide. The flat keywords ``queue_size``, ``queue_warmup_steps``, ... are these "
             "options (the names of the command line, of the messages and of "
             ":meth:`~st_hardneg.HardNegativeLoss.get_config_dict`)."))
    warmup_steps: int = option(0, check=_count(0),
        doc=("optimizer steps before the queue is read (default 0)."))
    max_age: int | None = option(None, check=validation.check_optional_count,
        doc=("rows older than this many optimizer steps are not read (``None``: no limit)."))
    checkpoint: bool = option(True, check=validation.check_bool,
        doc=("save the queue with the optimizer checkpoint (restored on resume by "
             ":class:`~st_hardneg.training.callbacks.StatefulLossCallback`); ``False`` leaves it out."))
    source: Literal["online", "ema"] = option("online", check=_choice("online", "ema"),
        doc=('what feeds the queue: ``"online"`` (default, XBM: the detached candidates the loss computed anyway, no '
             'extra cost) or ``"ema"`` (MoCo / ESimCSE: a momentum key encoder, a copy of ``model`` as the loss is '
             "built, dropout off, re-embeds the candidate columns without gradient; one extra forward of them per "
             "batch). AdCSE with ``untied=True`` queues its own key encoder's candidates under either source."))
    momentum: float = option(0.995, check=validation.check_momentum,
        doc=("the key encoder's EMA momentum for ``source=\"ema\"`` (default 0.995, ESimCSE's): ``θ_k ← m·θ_k + (1 - "
             "m)·θ`` after every optimizer step."))
    anchors: bool = option(False, check=validation.check_bool,
        doc=("also queue the anchors (a second bank of ``size`` rows, same source, warm-up, age and checkpoint): "
             "they join the ``doc_to_query`` denominator (each positive against past anchors), so the symmetric "
             "direction gets the extra negatives too. Needs ``\"doc_to_query\"`` in the loss's ``directions``; without "
             "it, queued rows join ``query_to_doc`` only."))
    as_pool: bool = option(False, check=validation.check_bool,
        doc=("let the loss's own hardest-negative choice also pick queued rows (default ``False``: the queue is a "
             "denominator only). Off by default because a hardest-negative choice over old rows is where a queue's "
             'failure modes concentrate: the "hardest" queued row is the most likely to be an unmasked duplicate or '
             "paraphrase of the anchor (a false negative), and it was embedded by an older encoder. Only MixCSE's "
             "``partner=\"hardest\"`` takes it (the partner is then the hardest of the batch's and the queue's "
             "unmasked rows); the other losses refuse it."))

    def __post_init__(self) -> None:
        _run_checks(self, "queue_")
        if not self.size and (self.source != "online" or self.momentum != 0.995):
            raise ValueError(f"{_OWNER}: queue_source / queue_momentum set without a queue; set queue_size > 0")
        if self.size and self.source == "online" and self.momentum != 0.995:
            raise ValueError(f"{_OWNER}: queue_momentum={self.momentum} with queue_source='online': an online queue "
                             "has no key encoder to move, so the momentum would be ignored; set queue_source='ema' or "
                             "drop queue_momentum")
        if self.anchors and not self.size:
            raise ValueError(f"{_OWNER}: queue_anchors=True without a queue; set queue_size > 0")
        if self.as_pool and not self.size:
            raise ValueError(f"{_OWNER}: queue_as_pool=True without a queue; set queue_size > 0")

    @classmethod
    def from_keywords(cls, owner: str, queue: QueueOptions | int | None = None, **flat: Any) -> QueueOptions:
        """The queue options of the loss ``owner``'s constructor: the flat ``queue_*`` keywords ``flat`` (left out:
        :func:`not_given`), or the deprecated ``queue`` (a :class:`QueueOptions`, or an ``int``: its ``size``).

        Raises:
            TypeError: ``queue`` together with a flat ``queue_*`` keyword (naming both), ``queue`` of another type,
                or an unknown ``queue_*`` name.
            ValueError: a value :class:`QueueOptions` refuses; a rule between the options names ``owner``.
        """
        names = {f"queue_{spec.name}": spec.name for spec in fields(cls)}
        unknown = sorted(set(flat) - set(names))
        if unknown:
            raise TypeError(f"{owner}.__init__() got an unexpected keyword argument {unknown[0]!r}")
        given = {names[key]: value for key, value in flat.items() if not isinstance(value, _NotGiven)}
        if queue is not None and given:
            key = next(key for key in flat if not isinstance(flat[key], _NotGiven))
            raise TypeError(f"{owner}: give the queue either as queue=... or as the flat queue_* keywords, not both; "
                            f"got queue={queue!r} and {key}={flat[key]!r}")
        if isinstance(queue, QueueOptions):
            return queue
        if queue is not None and not isinstance(queue, int):
            raise TypeError(f"{owner}: queue must be a QueueOptions or an int (its size), got "
                            f"{type(queue).__name__} {queue!r:.80}")
        try:
            return cls(size=queue) if queue is not None else cls(**given)
        except ValueError as error:  # a rule between the options: named after the loss, as its other messages
            owned = _owned(error, _OWNER, owner)
            if owned is error:
                raise
            raise owned from None

    def keywords(self) -> str:
        """The flat keywords that make these options (``queue_size=4096, queue_warmup_steps=100``; the fields left
        at their defaults left out): the spelling a deprecation warning names."""
        given = [f"queue_{spec.name}={getattr(self, spec.name)!r}" for spec in fields(self)
                 if getattr(self, spec.name) != spec.default]
        return ", ".join(given)

    def config(self) -> dict[str, Any]:
        """The options as ``get_config_dict`` records them, under the loss's flat ``queue_*`` names (none without a
        queue; ``queue_momentum`` only with ``source="ema"``)."""
        if not self.size:
            return {}
        out = {f"queue_{spec.name}": getattr(self, spec.name) for spec in fields(self) if spec.name != "momentum"}
        return {**out, **({"queue_momentum": self.momentum} if self.source == "ema" else {})}


@dataclass(frozen=True, kw_only=True)
class SharedOptions:
    """The shared options of a loss, each declared here once with its default, its check and its documentation
    (:func:`option`; :class:`LossOptions` renders the documentation under the keywords' names), checked as they are
    made, the values held in their canonical form: what :class:`~st_hardneg.losses.base.HardNegativeLoss` keeps as
    ``loss.options`` (and as the attributes of the same names). A loss builds it with :meth:`from_keywords` from its
    constructor's keywords; what needs the model, the guide model or the loss itself (the guide's tokenizer,
    ``dot_score`` on a loss whose equation needs cosines, the embedding dimension, ``known_positives``'
    tokenisation, the queue's model) is checked by the loss.

    Besides the keywords' names: ``temperature`` holds τ, resolved from ``scale`` or ``temperature``
    (:meth:`from_keywords` takes both; :attr:`scale` reads 1/τ); ``similarity_fct`` holds its name (``"cos_sim"`` or
    ``"dot_score"``); ``known_positives`` is kept as given (the loss checks and tokenises it); ``queue`` is the
    :class:`QueueOptions` (an ``int`` is its ``size``, ``None`` no queue); ``guided`` says whether a guide model is
    given, which makes ``margin`` 0 and turns ``contrast_anchors`` / ``contrast_positives`` on when they are ``None``,
    as in GISTEmbedLoss (so those three always hold their resolved values).

    Raises:
        ValueError: a value a loss's keyword refuses, with the same message (:mod:`st_hardneg.validation`'s wording,
            under the keyword's name: ``margin must be a finite number >= 0, got -1``); a rule between the options
            names its owner (``SharedOptions``, or the loss when its keywords made them).
        TypeError: ``queue`` is neither a :class:`QueueOptions`, an ``int`` nor ``None``.

    Example:
        ::

            from st_hardneg import MixCSELoss
            from st_hardneg.losses.options import QueueOptions, SharedOptions

            loss = MixCSELoss(model, scale=50.0, margin=0.1, queue_size=4096)
            assert loss.options == SharedOptions(temperature=0.02, margin=0.1, queue=QueueOptions(size=4096))
    """

    temperature: float = option(0.05, check=validation.check_temperature, keyword_type="float | None",
        aliases={"scale": ("float | None", "sentence-transformers' inverse temperature (default 20): the logits are "
                                           "``similarity · scale``.")},
        doc=("τ = 1 / scale (default 0.05). Give ``scale`` or ``temperature``, not both; τ > 1 warns (it looks like "
             "a scale)."))
    similarity_fct: Callable[[Tensor, Tensor], Tensor] | str = option(
        "cos_sim", check=lambda value, _: validation.check_similarity_fct(value), attribute=False,
        doc=("``sentence_transformers.util.cos_sim`` (default) or ``dot_score`` (scored on the raw embeddings). A "
             "loss whose equation needs cosines rejects ``dot_score`` and says why."))
    directions: tuple[fr.Direction, ...] = option(("query_to_doc",),
        doc=("sentence-transformers' interaction terms, a tuple of ``\"query_to_doc\"`` (required: query i against "
             'every document: the positives, then every explicit negative), ``"query_to_query"`` (against the other '
             'queries), ``"doc_to_query"`` (positive i against every query) and ``"doc_to_doc"`` (positive i against '
             "every document of the other pairs). Default ``(\"query_to_doc\",)``, every paper's equation. Each "
             "paper's extra negatives (mixed, synthetic, adversarial) are columns of ``query_to_doc`` (MixCSE's "
             "``reverse_mix`` also of ``doc_to_query``)."))
    partition_mode: fr.PartitionMode = option("joint",
        doc=('``"joint"`` (one softmax over every direction; default) or ``"per_direction"`` (one softmax per '
             'direction, averaged; not with ``query_to_query`` / ``doc_to_doc``). ``directions=("query_to_doc", '
             '"doc_to_query"), partition_mode="per_direction"`` is ``MultipleNegativesSymmetricRankingLoss``.'))
    hardness_mode: fr.HardnessMode | None = option(None,
        doc=("sentence-transformers' hardness weighting (Lan et al. 2025): ``None`` (default), "
             '``"in_batch_negatives"``, ``"hard_negatives"`` or ``"all_negatives"``: ``hardness_strength · sg(s)`` '
             "is added to those ``query_to_doc`` logits (after the scaling, and after a Focal-InfoNCE modulation). "
             "It composes with the papers' extra negatives, which it leaves unpenalised."))
    hardness_strength: float = option(0.0,
        doc=("α >= 0 (default 0; a mode with α = 0 warns)."))
    seed: int | None = option(None, check=validation.check_seed,
        doc=("seed of the loss's random draws (random mixing partners, HNCSE's negative pairs, AdCSE's adversary "
             "initialisation), drawn from a generator of its own; ``None`` uses torch's global generator (seeded by "
             "the Trainer's ``seed``). A loss without random draws (Focal-InfoNCE) records it and draws nothing."))
    mask_duplicates: bool = option(True, check=validation.check_bool,
        doc=("false-negative control: a candidate (another pair's positive or an explicit negative) whose embedding, "
             "or whose text when the loss is called through ``forward``, is identical to anchor ``i``'s positive is "
             "not a negative of anchor ``i``: it leaves the denominator and every hard-negative selection (mixing "
             "partners, top-k pools). The positive itself is never masked (unsupervised ``(sentence, sentence)`` "
             "pairs are fine). Default on (sentence-transformers has no such mask: ``False`` for its exact behaviour "
             "on data with duplicates)."))
    known_positives: Mapping[str, Any] | KnownPositives | None = option(None, attribute=False, repr=False, hash=False,
        doc=("false-negative control from the relevance the data already has: a mapping from anchor text to the "
             "texts known to be relevant to it (built from BEIR qrels with "
             ":func:`st_hardneg.data.relevance.known_positives_from_qrels`, or from a group column with "
             "``known_positives_from_groups``; the same mapping mining excludes), or a prebuilt "
             ":class:`~st_hardneg.losses.relevance.KnownPositives`. Every in-batch, gathered or queued candidate the "
             "mapping marks relevant to anchor ``i`` (its own positive aside) leaves row ``i``'s denominator and "
             "every hard-negative choice (mixing partners, top-k pools, HNCSE's pairs), before any of them is made; "
             "in ``query_to_query`` / ``doc_to_doc`` (and the contrast blocks) likewise the anchors and documents "
             "marked relevant to anchor ``i``. A candidate masked for several reasons (duplicate, margin, mapping) "
             "is masked once. The texts are matched by the hash of their token ids (as ``mask_duplicates`` does): "
             "the mapping's texts are tokenised once, here, with the model's ``preprocess`` (O(mapping) memory, no N "
             "× corpus table), so the loss must be called through ``forward`` (or given ``text_keys`` with "
             ":meth:`~st_hardneg.HardNegativeLoss.set_false_negative_inputs`), and a training prompt must be part of "
             "the mapping's texts. :attr:`~st_hardneg.HardNegativeLoss.diagnostics` reports "
             "``masked_known_positives`` (per anchor, mean) and ``masked_known_positives_total`` (with a queue also "
             "``queue_known_positives_masked_total``), besides the union of every reason in "
             "``masked_false_negatives_total``. ``None`` (default): off; an empty mapping warns and is the loss "
             "without it; a batch whose rows all lose every negative is refused (see ``margin``)."))
    margin: float | None = option(None, check=validation.check_optional_non_negative,
        doc=("GISTEmbedLoss's false-negative filter: ``None`` (off; ``0.0`` when a guide is given) or a margin >= 0: "
             "mask every candidate whose similarity to the anchor exceeds the positive's similarity minus the margin "
             '(``margin_strategy="absolute"``) or minus ``|positive similarity|·margin`` (``"relative"``), judged by '
             "the guide when given, else by the trained model itself (detached). ``doc_to_query`` uses the "
             "transposed mask, ``query_to_query`` / ``doc_to_doc`` the same threshold on their own similarities. A "
             "row whose every negative is masked teaches nothing and is left out of the mean (GISTEmbedLoss counts "
             "it as 0: see :meth:`~st_hardneg.losses.blocks.Ranking.unusable_rows`): the first such batch warns, a "
             "batch of only such rows is a ``ValueError``, and :attr:`~st_hardneg.HardNegativeLoss.diagnostics` "
             "reports ``masked_false_negatives`` (mean per anchor), ``masked_false_negatives_total``, "
             "``masked_fraction`` and ``rows_without_negatives``."))
    margin_strategy: Literal["absolute", "relative"] = option("absolute", check=_choice("absolute", "relative"),
        doc=('``"absolute"`` or ``"relative"``.'))
    contrast_anchors: bool | None = option(None, check=validation.check_bool,
        doc=("GISTEmbedLoss's anchor-anchor block: every anchor also against the other anchors of its process (false "
             "negatives masked as above). ``None`` (default): on with a guide (GIST's default), off without one "
             "(MNRL's). With a guide and ``gather_across_devices`` the anchors of other processes are not "
             'contrasted, as in GIST; ``directions`` with ``"query_to_query"`` contrasts them all.'))
    contrast_positives: bool | None = option(None, check=validation.check_bool,
        doc=("GISTEmbedLoss's positive-positive block: every positive against the other positives (not the explicit "
             "negatives; ``\"doc_to_doc\"`` in ``directions`` is sentence-transformers' block with them). ``None``: as "
             "``contrast_anchors``."))
    queue: QueueOptions = option(QueueOptions(), attribute=False, keyword_type="QueueOptions | int | None",
        doc=("deprecated (it warns, naming the flat keywords; removed in the next release): the queue's options as "
             "one value, a :class:`QueueOptions` or an ``int``, its ``size`` alone (``queue=4096`` is "
             "``queue_size=4096``); ``None`` (default): the flat keywords, or no queue. Give either ``queue`` or the "
             "flat keywords, not both (a ``TypeError`` names both)."))
    guided: bool = option(False, attribute=False, keyword=False,
        doc=("whether a guide model is given (the loss's ``guide``), which resolves ``margin``, ``contrast_anchors`` "
             "and ``contrast_positives`` as GISTEmbedLoss does; recorded as ``guide``, the guide model's name."))
    gather_across_devices: bool = option(False, check=validation.check_bool,
        doc=("see **Scaling up** below."))
    mini_batch_size: int | None = option(None, check=validation.check_optional_count, attribute=False,
        doc=("see **Scaling up** below (``None``, the default, is uncached; CachedMNRL's default is 32)."))
    mini_batch_num_tokens: int | None = option(None, check=validation.check_optional_count, attribute=False,
        doc=("alternatively to ``mini_batch_size``, a budget of non-padding tokens per mini-batch."))
    show_progress_bar: bool = option(False, check=validation.check_bool, config=False,
        doc=("with ``mini_batch_size``, a progress bar over the mini-batches (as in the Cached losses)."))

    def __post_init__(self) -> None:
        guided = validation.check_bool(self.guided, "guided")
        # GISTEmbedLoss: a guide alone masks every candidate it finds closer than the positive, and turns on the
        # anchor-anchor and positive-positive blocks (GIST's default; off without one, MultipleNegativesRankingLoss's)
        resolved: dict[str, Any] = {
            "guided": guided, "margin": 0.0 if self.margin is None and guided else self.margin,
            "contrast_anchors": guided if self.contrast_anchors is None else self.contrast_anchors,
            "contrast_positives": guided if self.contrast_positives is None else self.contrast_positives}
        for name, value in resolved.items():
            object.__setattr__(self, name, value)
        _run_checks(self)
        # the rules between options
        directions, partition_mode = validation.check_directions(self.directions, self.partition_mode)
        hardness_mode, hardness_strength = validation.check_hardness(self.hardness_mode, self.hardness_strength)
        paired: dict[str, Any] = {"directions": directions, "partition_mode": partition_mode,
                                  "hardness_mode": hardness_mode, "hardness_strength": hardness_strength}
        for name, value in paired.items():
            object.__setattr__(self, name, value)
        if (self.contrast_anchors or self.contrast_positives) and self.partition_mode == "per_direction":
            raise ValueError(f"{_SHARED}: contrast_anchors / contrast_positives add same-type blocks without the "
                             "positive pair, which partition_mode='per_direction' cannot normalise; use "
                             "partition_mode='joint' (or contrast_anchors=False, contrast_positives=False)")
        if self.contrast_anchors and "query_to_query" in self.directions:
            raise ValueError(f"{_SHARED}: contrast_anchors=True and directions with 'query_to_query' would contrast "
                             "the anchors twice; use one of them")
        object.__setattr__(self, "queue", QueueOptions.from_keywords(_SHARED, self.queue))

    @property
    def scale(self) -> float:
        """sentence-transformers' ``scale``, 1 / ``temperature``."""
        return 1.0 / self.temperature

    def config(self, *, known_positives: int | None = None, guide: str | None = None) -> dict[str, Any]:
        """The options as ``get_config_dict`` records them, in their declaration order: ``scale`` before
        ``temperature``; ``known_positives`` as the number of pairs of the loss's index (``known_positives``, left out
        when ``None``); the queue's options (:meth:`QueueOptions.config`, none without a queue); ``guide``: the guide
        model's name (``guide``, left out when ``None``); every other field but those declared out of the config
        (``show_progress_bar``)."""
        out: dict[str, Any] = {}
        for spec in fields(self):
            if spec.name == "temperature":
                out["scale"] = self.scale
            if not spec.metadata.get("config", True):
                continue
            if spec.name == "known_positives":
                out.update({"known_positives": known_positives} if known_positives is not None else {})
            elif spec.name == "queue":
                out.update(self.queue.config())
            elif spec.name == "guided":
                out.update({"guide": guide} if guide is not None else {})
            else:
                out[spec.name] = getattr(self, spec.name)
        return out

    @classmethod
    def from_keywords(cls, owner: str, *, scale: float | None = None, temperature: float | None = None,
                      queue: QueueOptions | int | None = None, **keywords: Any) -> SharedOptions:
        """The shared options of the loss ``owner``'s constructor, from its keywords (:class:`LossOptions`, the flat
        ``queue_*`` keywords included, left out as :func:`not_given`) and ``guided`` (a guide model is given).

        ``scale`` and ``temperature`` are resolved into one τ as the loss's keywords are
        (:func:`st_hardneg.validation.check_scale_or_temperature`: at most one of them; τ > 1 warns, it looks like a
        scale), the queue's options as :meth:`QueueOptions.from_keywords` resolves them; the deprecated ``queue``
        warns (``DeprecationWarning``), naming the flat keywords that replace it.

        Raises:
            ValueError: as :class:`SharedOptions`, and :func:`~st_hardneg.validation.check_scale_or_temperature`;
                a rule between the options names ``owner``.
            TypeError: as :meth:`QueueOptions.from_keywords`.
        """
        flat = {key: keywords.pop(key) for key in [key for key in keywords if key.startswith("queue_")]}
        # the loss's order: the similarity function, then the temperature, then the rest
        validation.check_similarity_fct(keywords.get("similarity_fct", "cos_sim"))
        tau = validation.check_scale_or_temperature(scale, temperature)
        queue_options = QueueOptions.from_keywords(owner, queue, **flat)
        if queue is not None:
            spelled = queue_options.keywords() or "no queue_* keyword (no queue)"
            warnings.warn(f"{owner}: queue={queue!r} is deprecated and will be removed in the next release; give the "
                          f"flat keywords instead: {spelled}", DeprecationWarning,
                          stacklevel=validation.user_stacklevel())
        try:
            return cls(temperature=tau, queue=queue_options, **keywords)
        except ValueError as error:
            owned = _owned(error, _SHARED, owner)
            if owned is error:
                raise
            raise owned from None


def loss_keywords() -> dict[str, tuple[str, Any, str]]:
    """Every keyword a loss's constructor takes after ``model`` and ``guide``, in the signature's order, made from
    the options' declarations: name → (type, default shown, documentation). The flat ``queue_*`` keywords are
    :class:`QueueOptions`' fields (their default :func:`not_given`), given where the ``queue`` field is declared,
    before the deprecated ``queue`` itself."""
    out: dict[str, tuple[str, Any, str]] = {}
    for spec in fields(SharedOptions):
        meta = spec.metadata
        for alias, (alias_type, alias_doc) in meta["aliases"].items():
            out[alias] = (alias_type, None, alias_doc)
        if spec.name == "queue":
            for queued in fields(QueueOptions):
                out[f"queue_{queued.name}"] = (cast(str, queued.type), not_given(queued.default),
                                               f"the queue's ``{queued.name}``: {queued.metadata['doc']}")
        if meta["keyword"]:
            shown = meta["keyword_default"] if meta["keyword_type"] is not None else spec.default
            out[spec.name] = (meta["keyword_type"] or cast(str, spec.type), shown, meta["doc"])
    return out


def _args(head: Mapping[str, str], entries: Mapping[str, str]) -> str:
    """A docstring's ``Args:`` section (unindented) of ``head`` then ``entries``: name → one paragraph."""
    lines = ["Args:"]
    for name, doc in {**head, **entries}.items():
        lines += textwrap.wrap(f"{name}: {doc}", width=116, initial_indent="    ", subsequent_indent="        ",
                               break_long_words=False, break_on_hyphens=False)
    return "\n".join(lines)


class LossOptions(TypedDict, total=False):
    """The keyword options every st-hardneg loss takes besides its paper's hyperparameters and the ``guide``.

    The shared options on every loss (all but ``guide`` keyword-only) have the names, defaults and meanings of
    sentence-transformers 6.2's ``MultipleNegativesRankingLoss`` (and its Cached / Symmetric forms) and
    ``GISTEmbedLoss``, so that swapping one of them for an st-hardneg loss changes the class name only.
    """

    # The typing shadow of the declarations (SharedOptions' and QueueOptions' fields, see loss_keywords()): a static
    # TypedDict is what type checkers read for ``**options: Unpack[LossOptions]``; tests/losses/test_options.py
    # holds these lines to loss_keywords() (names, order, types) and prints the lines to paste when they differ.
    scale: float | None
    temperature: float | None
    similarity_fct: Callable[[Tensor, Tensor], Tensor] | str
    directions: tuple[fr.Direction, ...]
    partition_mode: fr.PartitionMode
    hardness_mode: fr.HardnessMode | None
    hardness_strength: float
    seed: int | None
    mask_duplicates: bool
    known_positives: Mapping[str, Any] | KnownPositives | None
    margin: float | None
    margin_strategy: Literal["absolute", "relative"]
    contrast_anchors: bool | None
    contrast_positives: bool | None
    queue_size: int
    queue_warmup_steps: int
    queue_max_age: int | None
    queue_checkpoint: bool
    queue_source: Literal["online", "ema"]
    queue_momentum: float
    queue_anchors: bool
    queue_as_pool: bool
    queue: QueueOptions | int | None
    gather_across_devices: bool
    mini_batch_size: int | None
    mini_batch_num_tokens: int | None
    show_progress_bar: bool


_LOSS_ARGUMENTS = {
    "model": (
        "SentenceTransformer model: the model that is trained (a Trainer of another model re-points the loss at its "
        "first step, after making its optimizer from this one: that warns, see :mod:`st_hardneg.losses.model_guard`)."),
    "guide": (
        "optional SentenceTransformer (the only argument that may also be given by position, as in "
        "``GISTEmbedLoss(model, guide)``) whose embeddings (no gradient; the texts re-tokenised if its tokenizer "
        "differs or its ``max_seq_length`` is shorter) decide the false negatives instead of the trained model's. A "
        "guide alone means ``margin=0`` and turns ``contrast_anchors`` / ``contrast_positives`` on, as in GIST. Any "
        "other positional value after ``model`` is a ``TypeError`` (``Loss(model, 20.0)`` names ``scale``)."),
}
_LOSS_OPTIONS_PROSE = """\
    :meth:`~st_hardneg.HardNegativeLoss.compute`, the one compute template, runs with autocast disabled (the loss math
    is float32 under bf16/fp16 mixed precision too) and warns once if it receives labels it does not use. Every loss
    also has the sentence-transformers ``forward`` (one embedding per input column, merged forwards where ST can), the
    seeded random generator of the losses' random draws (:meth:`~st_hardneg.HardNegativeLoss.generator`), and
    :attr:`~st_hardneg.HardNegativeLoss.diagnostics`, the mean positive / negative / synthetic cosines of the last
    training batch.

    **Scaling up** (every loss takes both arguments):

    ``gather_across_devices=True`` (same name and meaning as in sentence-transformers, built on its
    ``all_gather_with_grad``): under ``torch.distributed``, the batch preparer
    (:meth:`~st_hardneg.losses.prepare.BatchPreparer.prepare`) gathers every input column of every process (with
    gradient), so everything that looks across the batch (in-batch negatives, mixing partners, hardest
    negatives, top-k pools, keys, the adversaries' gradient, the diagnostics) looks across the global batch. Each
    process computes the rows of its *own* ``n`` anchors only, against the ``W·n`` gathered candidates
    (``O(n·W·n)`` per process, as sentence-transformers' losses), and the reduction
    (:meth:`~st_hardneg.losses.blocks.Ranking.mean`) weights their sum so that the processes' mean is the global
    batch's mean; the gather's backward brings every process the gradient of its
    embeddings from every process's rows, so distributed data parallel's average of the parameter gradients is
    exactly the single-process gradient. AdCSE's adversary gradient is each process's rows' share, averaged across
    processes (all-reduce) at the ascent step, so the bank stays identical everywhere. The one global pass is
    HNCSE's positive mixing, whose mixed positives are candidates of every row: each process finds the hardest
    negative of all ``W·n`` rows (no gradient, a chunk of rows at a time). Random draws come from a generator that
    is identical on every process: the loss's own one when it has a ``seed`` (every process draws the same
    sequence), else one seeded per draw from rank 0's global RNG (:func:`st_hardneg.losses.distributed.shared_seed`).
    All processes must hold the same local batch size (use ``dataloader_drop_last=True``); a ragged batch raises.
    Without a process group the option changes nothing but the random source of the draws.

    **Counts that cannot be met** (every loss, one rule: :func:`st_hardneg.validation.clamp_count`): a count below its
    minimum is a ``ValueError``; a count above what the other arguments or the batch allow (HNCSE's ``num_mixed``
    above the ``k (k - 1)`` pairs of ``k``, ``k`` above a small batch's negatives) is clamped to that limit with a
    warning, never met by repeating or dropping work silently. **Rows that cannot teach** (one rule:
    :meth:`~st_hardneg.losses.blocks.Ranking.unusable_rows`): a row with no unmasked negative candidate, or a
    zero-norm anchor or positive, is left out of the mean, counted and warned once; a batch of only such rows is a ``ValueError``.

    ``mini_batch_size`` / ``mini_batch_num_tokens``: GradCache (Gao et al., 2021) through sentence-transformers'
    ``CachedLossMixin`` (:class:`st_hardneg.losses.gradcache.GradCacheEngine`): the encoder sees only mini-batches of
    that size (or token budget), in two passes, and the loss and gradients are those of the whole batch (the second pass
    replays the first pass's random state, so dropout masks match). The loss side is chunked too, as in
    ``CachedMultipleNegativesRankingLoss``: the one compute template (:meth:`~st_hardneg.HardNegativeLoss.compute`)
    builds the rows of :attr:`~st_hardneg.HardNegativeLoss.loss_chunk_size` anchors at a time against every candidate (logits, masks, mixed and synthetic negatives, adversaries), back-propagates
    them and frees them before the next chunk, so the loss holds O(chunk × candidates) memory, never the (N, N)
    matrices; whatever a row chooses (partners, hardest negatives, top-k, random pairs) is chosen per row or drawn
    once per batch, so chunking changes nothing (tested at chunk sizes that do not divide the batch). MixCSE's
    ``layout="official"`` (the released code's N×3N cross-entropy) is computed whole. Every side effect (random
    draws, statistics, AdCSE's adversary gradient) happens once per batch, as
    without the cache. Composes with ``gather_across_devices``.
"""
# the documentation of the keywords, rendered from their declarations (what Sphinx and help() show)
LossOptions.__doc__ = "\n\n".join([inspect.cleandoc(LossOptions.__doc__ or ""),
                                   _args(_LOSS_ARGUMENTS, {name: doc for name, (_, _, doc) in loss_keywords().items()}),
                                   textwrap.dedent(_LOSS_OPTIONS_PROSE).strip()])
_queue_doc = inspect.cleandoc(QueueOptions.__doc__ or "").split("\n\nRaises:", 1)
QueueOptions.__doc__ = "\n\n".join([_queue_doc[0], _args({}, {spec.name: spec.metadata["doc"]
                                                              for spec in fields(QueueOptions)}),
                                    "Raises:" + _queue_doc[1]])


def option_attributes() -> tuple[str, ...]:
    """The shared options a loss also shows as read-only attributes of the same names (``loss.margin`` is
    ``loss.options.margin``): every :class:`SharedOptions` field declared an ``attribute`` (not those the loss
    holds otherwise: the similarity function, the ``known_positives`` index, the queue, the GradCache sizes
    sentence-transformers reads)."""
    return tuple(spec.name for spec in fields(SharedOptions) if spec.metadata.get("attribute", True))


def constructor_signature(function: Callable[..., Any]) -> inspect.Signature:
    """The signature a loss's constructor shows (help, docs): ``self, model, guide=None`` and, keyword-only, every
    keyword of :func:`loss_keywords` with its default (``scale`` / ``temperature`` and ``queue`` ``None``; the flat
    ``queue_*`` keywords :class:`QueueOptions`'s, as :func:`not_given`), annotated with :class:`LossOptions`' types."""
    positional = [parameter for parameter in inspect.signature(function).parameters.values()
                  if parameter.kind is not inspect.Parameter.VAR_KEYWORD]
    from st_hardneg.losses.relevance import KnownPositives  # named here for type checkers only

    hints = get_type_hints(LossOptions, localns={"KnownPositives": KnownPositives})
    keywords = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hints[name])
                for name, (_, default, _) in loss_keywords().items()]
    return inspect.Signature([*positional, *keywords])


