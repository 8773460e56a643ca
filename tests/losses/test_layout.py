"""The loss package's house rules, read from its source and measured on a traced batch: ``base.py`` holds the loss
only (the rest of a loss comes from the parts it owns, each in its own module), the parts' modules never import
``base.py``, no import circle (``text_keys`` lives outside ``batch.py``), a paper's loss reads only the private
attributes it sets itself, no private attribute is written by more than one class, and one traced MixCSE batch
runs as one pipeline: the template calls every part, no part calls another, and without a queue nothing of
``queue.py`` runs."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

LOSSES = Path(__file__).resolve().parents[2] / "st_hardneg" / "losses"
PART_MODULES = ("prepare.py", "blocks.py", "queue.py", "gradcache.py", "keys.py", "batch.py", "columns.py",
                 "false_negatives.py", "relevance.py", "options.py")
PAPERS = ("mixcse.py", "focal.py", "hncse.py", "adcse.py")


def _imported_modules(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return out


def test_base_holds_the_loss_only_and_each_part_lives_in_its_own_module() -> None:
    """base.py stays small by concept, not by a line count: it defines one class, the loss (its forward side,
    sentence-transformers' GradCache contract, the one template, the paper's hooks, its options, diagnostics and
    config), and every part the loss owns is defined in a module of its own (which never imports base.py, below)."""
    from st_hardneg.losses.base import HardNegativeLoss

    tree = ast.parse((LOSSES / "base.py").read_text())
    classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
    assert classes == ["HardNegativeLoss"]
    own = {name for name, value in vars(HardNegativeLoss).items() if callable(value) or isinstance(value, property)
           if not name.startswith("__")}
    allowed = {
        # the forward side and what forward hands the parts
        "forward", "before_embedding", "embed", "call_context", "set_false_negative_inputs",
        # sentence-transformers' GradCache contract (CachedLossMixin)
        "uses_gradient_cache", "frozen_columns", "cached_forward", "embed_minibatch", "calculate_loss",
        "supports_row_chunks", "loss_chunk_size",
        # the one compute template and the paper's hooks
        "compute_loss_from_embeddings", "compute", "_run", "_skip", "window_rows", "begin_batch", "paper_columns",
        "logit_margin", "paper_stats", "whole_batch_rows", "end_batch", "close_batch",
        # options checked and given to the parts (when built, and when one is assigned)
        "check_options", "_apply_options", "_ranking",
        # options, draws, diagnostics and config
        "cosine_only_reason", "queues_own_key_encoder_rows", "blocks", "scale", "controls_false_negatives",
        "similarity_fct", "check_logit_range", "queue_options", "generator", "diagnostics", "paper_config",
        "get_config_dict", "citation",
    }
    from st_hardneg.losses.options import QueueOptions, option_attributes

    allowed |= set(option_attributes()) | {f"queue_{name}" for name in QueueOptions.__dataclass_fields__}
    assert own - allowed == set()
    for module, part in (("prepare.py", "BatchPreparer"), ("blocks.py", "Ranking"), ("queue.py", "QueueBanks"),
                         ("gradcache.py", "GradCacheEngine"), ("model_guard.py", "ModelGuard")):
        assert part in {n.name for n in ast.parse((LOSSES / module).read_text()).body if isinstance(n, ast.ClassDef)}


@pytest.mark.parametrize("module", PART_MODULES)
def test_part_and_helper_modules_do_not_import_base(module: str) -> None:
    assert "st_hardneg.losses.base" not in _imported_modules(LOSSES / module)


def test_relevance_does_not_import_batch() -> None:
    # batch.py names KnownPositives (for a type only); relevance.py takes text_keys from keys.py, not from batch.py
    assert "st_hardneg.losses.batch" not in _imported_modules(LOSSES / "relevance.py")
    assert "st_hardneg.losses.batch" not in _imported_modules(LOSSES / "keys.py")
    # batch.py is the bottom of the loss package: it names one other loss module, for a type
    assert {m for m in _imported_modules(LOSSES / "batch.py") if m.startswith("st_hardneg.losses.")} == {
        "st_hardneg.losses.relevance", "st_hardneg.losses.relevance.KnownPositives"}
    assert "st_hardneg.losses.keys.text_keys" in _imported_modules(LOSSES / "relevance.py")


def test_the_parts_make_up_the_base_class() -> None:
    """A loss owns its parts (objects with small interfaces), each method in the part that owns its concept; the loss
    itself keeps forward and the one compute template."""
    from st_hardneg import MixCSELoss
    from st_hardneg.losses.base import HardNegativeLoss
    from st_hardneg.losses.blocks import Ranking
    from st_hardneg.losses.gradcache import GradCacheEngine
    from st_hardneg.losses.model_guard import ModelGuard
    from st_hardneg.losses.prepare import BatchPreparer
    from st_hardneg.losses.queue import QueueBanks

    loss = MixCSELoss(None)
    parts = {"preparer": BatchPreparer, "ranking": Ranking, "queues": QueueBanks, "gradcache": GradCacheEngine,
             "model_guard": ModelGuard}
    for name, part in parts.items():
        assert isinstance(getattr(loss, name), part), name
        assert not issubclass(HardNegativeLoss, part), part.__name__  # owned, not inherited
    owner = {name: cls for cls in (BatchPreparer, Ranking, QueueBanks, GradCacheEngine, HardNegativeLoss)
             for name in vars(cls)}
    expected = {"prepare": BatchPreparer, "window": BatchPreparer, "blocks": HardNegativeLoss, "rows": Ranking,
                "usable_sum": Ranking, "mean": Ranking, "reduce": Ranking, "unusable_rows": Ranking,
                "judge": Ranking, "columns": GradCacheEngine, "read": QueueBanks, "join": QueueBanks,
                "stage": QueueBanks, "compute_loss_from_embeddings": HardNegativeLoss, "compute": HardNegativeLoss,
                "window_rows": HardNegativeLoss, "forward": HardNegativeLoss}
    assert {name: owner[name] for name in expected} == expected
    # the blocks of the ranking are a method of the part (the loss's ``blocks`` is the tuple of block names)
    assert "blocks" in vars(Ranking) and callable(vars(Ranking)["blocks"])


def _private_writes() -> dict[str, set[str]]:
    """``{private attribute: {module.Class, ...}}`` of every ``self._x = ...`` (also augmented, annotated, tuple
    targets, ``vars(self)["_x"] = ...`` and ``setattr(self, "_x", ...)``) in the loss package's classes."""
    writes: dict[str, set[str]] = {}
    for path in sorted(LOSSES.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
            for node in ast.walk(cls):
                targets: list[ast.expr] = []
                if isinstance(node, ast.Assign):
                    targets = list(node.targets)
                elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                    targets = [node.target]
                flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
                names = [t.attr for t in flat if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                         and t.value.id == "self" and t.attr.startswith("_")]
                names += [t.slice.value for t in flat if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Call)
                          and getattr(t.value.func, "id", "") == "vars" and isinstance(t.slice, ast.Constant)
                          and str(t.slice.value).startswith("_")]
                if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setattr" and len(node.args) > 1
                        and isinstance(node.args[1], ast.Constant) and str(node.args[1].value).startswith("_")):
                    names.append(str(node.args[1].value))
                for name in names:
                    writes.setdefault(str(name), set()).add(f"{path.stem}.{cls.name}")
    return writes


def test_no_private_attribute_is_written_by_more_than_one_class() -> None:
    writes = _private_writes()
    assert "_last_stats" in writes and "_step_clock" in writes  # the scan sees plain and vars() writes
    assert {name: sorted(classes) for name, classes in writes.items() if len(classes) > 1} == {}


@pytest.mark.parametrize("module", PAPERS)
def test_a_paper_reads_only_the_private_attributes_it_sets(module: str) -> None:
    source = (LOSSES / module).read_text()
    read = set(re.findall(r"self\.(_[a-z][a-z_0-9]*)\b(?!\s*\()", source))
    assigned = set(re.findall(r"self\.(_[a-z][a-z_0-9]*)(?:\s*:[^=\n]+)?\s*[+]?=(?!=)", source))
    assigned |= set(re.findall(r"self\.(_[a-z][a-z_0-9]*), self\.(?:_[a-z][a-z_0-9]*)\s*=", source))
    assigned |= {m for pair in re.findall(r"self\.(_[a-z][a-z_0-9]*), self\.(_[a-z][a-z_0-9]*)\s*=", source)
                 for m in pair}
    methods = set(re.findall(r"def (_[a-z][a-z_0-9]*)\(", source))
    assigned |= set(re.findall(r"^    (_[a-z][a-z_0-9]*):", source, re.MULTILINE))  # declared on the class
    assert read - assigned - methods == set()


def test_per_batch_state_lives_on_the_batch_not_on_the_loss() -> None:
    import torch

    from st_hardneg import MixCSELoss

    loss = MixCSELoss(None, seed=0)
    batch = loss.preparer.prepare([torch.randn(6, 8), torch.randn(6, 8)])
    window = loss.preparer.window(batch, 2, 4)
    assert window.state is batch.state and window.rows == (2, 4)  # every window of a batch shares its state
    assert batch.state.local_rows is None and batch.state.zero_rows is not None
    assert batch.state.zero_rows.tolist() == [False] * 6
    anchors, positives = torch.randn(6, 8), torch.randn(6, 8)
    anchors[1] = 0.0  # an unusable row: left out of the mean (the ranking returns which rows are usable)
    value = loss.compute_loss_from_embeddings([anchors, positives], None)
    assert torch.isfinite(value)
    assert [field.name for field in dataclasses.fields(type(batch.state))] == [
        "local_rows", "zero_rows", "draws", "windows"]  # what spans the windows; every other value is returned


def _traced_batch(loss, features) -> list[tuple[str, str, str]]:
    """``(file, Class.method, caller's file)`` of every call one batch makes to a public method (not a property) of
    the loss or of one of its parts, in order, traced with ``sys.setprofile``; and every file of the loss package
    the batch enters at all (any function), under the key ``"entered"`` of the returned list's owner."""
    import inspect
    import sys

    parts = {id(loss)} | {id(part) for part in (loss.preparer, loss.ranking, loss.queues, loss.gradcache)}
    calls: list[tuple[str, str, str]] = []
    entered: set[str] = set()

    def profile(frame, event, arg):
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(str(LOSSES)) or not code.co_name.isidentifier():
            return
        entered.add(Path(code.co_filename).name)
        owner = frame.f_locals.get("self")
        if owner is None or id(owner) not in parts or code.co_name.startswith("_"):
            return
        if isinstance(inspect.getattr_static(type(owner), code.co_name, None), property):
            return
        caller = frame.f_back
        calls.append((Path(code.co_filename).name, code.co_qualname,
                      Path(caller.f_code.co_filename).name if caller is not None else ""))

    sys.setprofile(profile)
    try:
        loss(features, None).backward()
    finally:
        sys.setprofile(None)
    _traced_batch.entered = entered  # type: ignore[attr-defined]
    return calls


def test_one_mixcse_batch_is_one_pipeline_the_template_calls(tiny_model, tiny_sentences) -> None:
    """One real MixCSE training batch without a queue, traced: it enters ``queue.py`` zero times; every call into a
    part comes from the template (``base.py``) or from inside the part itself, never from another part or from the
    paper; per window the template calls, in order, the preparer's window masks, sentence-transformers' blocks, the
    paper's columns and the rows, then the running sum; and the batch leaves the loss's attributes as it found them
    except its stats record."""
    from st_hardneg import MixCSELoss

    loss = MixCSELoss(tiny_model, seed=0)
    features = [dict(tiny_model.preprocess(tiny_sentences[:4])), dict(tiny_model.preprocess(tiny_sentences[4:8]))]
    loss(features, None).backward()  # a first batch: the generator and the once-per-loss flags exist
    before = dict(vars(loss))
    calls = _traced_batch(loss, features)
    assert "queue.py" not in _traced_batch.entered  # type: ignore[attr-defined]
    part_files = {"prepare.py", "blocks.py", "queue.py", "gradcache.py"}
    assert [(file, method, caller) for file, method, caller in calls
            if file in part_files and caller not in ("base.py", file)] == []
    assert [(method, caller) for file, method, caller in calls if file == "mixcse.py" and caller != "base.py"] == []
    order = [method for _, method, _ in calls]
    window = order.index("BatchPreparer.window")
    assert order[window:window + 6] == ["BatchPreparer.window", "HardNegativeLoss.window_rows", "Ranking.blocks",
                                        "MixCSELoss.paper_columns", "HardNegativeLoss.paper_stats", "Ranking.rows"]
    assert order.index("Ranking.usable_sum") > order.index("Ranking.rows")
    after = dict(vars(loss))

    def same(a: object, b: object) -> bool:
        return a == b if isinstance(a, int | float | bool | str) else a is b

    rebound = sorted(name for name in {*before, *after}
                     if name not in before or name not in after or not same(before[name], after[name]))
    assert rebound == ["_last_stats"]


def test_with_a_queue_the_template_reads_joins_and_stages_it_once(tiny_model, tiny_sentences) -> None:
    """The same batch with a queue: the template reads the queue's columns before the paper's (a choice may take
    queued rows), joins them after it, and stages the batch once, after the windows (here two: GradCache's chunks)."""
    from st_hardneg import MixCSELoss

    loss = MixCSELoss(tiny_model, seed=0, queue_size=8, mini_batch_size=2)
    features = [dict(tiny_model.preprocess(tiny_sentences[:4])), dict(tiny_model.preprocess(tiny_sentences[4:8]))]
    order = [method for _, method, _ in _traced_batch(loss, features)]
    assert order.count("QueueBanks.stage") == 1 and order.count("HardNegativeLoss.window_rows") == 2
    assert order.index("QueueBanks.stage") > max(i for i, m in enumerate(order) if m == "Ranking.usable_sum")
    first = order.index("HardNegativeLoss.window_rows")
    assert order[first:first + 4] == ["HardNegativeLoss.window_rows", "Ranking.blocks", "QueueBanks.read",
                                      "MixCSELoss.paper_columns"]


def test_every_option_is_declared_once_with_its_default_check_and_documentation() -> None:
    """The options' one declaration: every field of SharedOptions and QueueOptions is made by option() (its
    documentation in its metadata), and options.py writes no option's default, type or documentation a second time
    but in LossOptions, the typing shadow that test_options.py holds to the declarations."""
    from st_hardneg.losses.options import QueueOptions, SharedOptions, loss_keywords

    for spec in (*dataclasses.fields(SharedOptions), *dataclasses.fields(QueueOptions)):
        assert spec.metadata.get("doc") and "check" in spec.metadata, spec.name
    tree = ast.parse((LOSSES / "options.py").read_text())
    typed = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "LossOptions"]
    assert [stmt.target.id for stmt in typed[0].body if isinstance(stmt, ast.AnnAssign)] == list(loss_keywords())
    assert all(stmt.value is None for stmt in typed[0].body if isinstance(stmt, ast.AnnAssign))  # types only
