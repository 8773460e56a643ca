"""A benchmark's study: its committed records imported as trials, its records file written from the trials, and its
tables and figures rendered from them (the one renderer of every benchmark; the one runner is
:mod:`benchmarks.studies.__main__`).

A spec under ``benchmarks/studies/`` says in its ``report`` (every path relative to the spec file):

- ``records``: the results JSON the study is kept in (committed: the evidence);
- ``read`` / ``layout`` (optional, ``module:function``): how that file holds its records, for a file whose layout
  is not the default ``{..., "runs": [record, ...]}``: ``read(data) -> (records, meta)`` (``meta``: everything else
  the file holds) and its inverse ``layout(records, meta) -> data``;
- ``write`` (optional, ``module:function``): ``write(records, meta, path) -> data``, for a study whose new records
  are written with a side file (a per-query file beside them); it returns what the records file now holds;
- ``point`` (optional): the record fields of a trial's grid point, default ``{"dataset": "dataset", "row":
  "method", "seed": "seed"}``; a field a record lacks is read from the file's top level (``meta``), and a dataset
  found in neither is the spec's only dataset;
- ``outputs``: ``[{"file": ..., "renderer": "module:function"}, ...]``: each table, ``renderer(data) -> str``, or
  with ``"figure": true`` each figure, ``renderer(data, path)``; ``data`` is the records file as written (and with
  ``per_query``, a table's renderer is also given the per-query rows the records point to);
- ``per_query`` (optional): the per-query file beside the records;
- ``prepare`` (optional, ``module:function``): ``prepare(spec, points, context)``, run once before the workers
  start, given the points left (e.g. mining every dataset's negatives once, into a cache the workers read).

:func:`import_study` imports the records into the study's storage (an in-memory SQLite unless a URL is given) as
finished trials (:func:`st_hardneg.training.studies.engine.import_records`, a failed configuration as a failed
trial); :func:`render` renders every table from the finished trials, so the committed numbers are the study's
records with nothing left to run.

    python -m benchmarks.studies.render benchmarks/studies/retrieval_beir_round2.json           # print the tables
    python -m benchmarks.studies.render benchmarks/studies/retrieval_beir_round2.json --check   # == committed?
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib import import_module
from pathlib import Path
from typing import Any

from st_hardneg.training.studies.spec import Point, StudySpec, load_spec

#: where a record's commit's library tree is, when the record does not name it
TREES = "library_trees"
#: a trial's grid point in a record, by default
POINT = {"dataset": "dataset", "row": "method", "seed": "seed"}


def _resolve(spec_path: Path, name: str) -> Path:
    return (Path(spec_path).parent / name).resolve()


def hook(name: str) -> Callable[..., Any]:
    """The function a spec's ``module:function`` names.

    Raises:
        ValueError: a malformed name, a module that cannot be imported or without that function.
    """
    module, sep, function = name.partition(":")
    if not (sep and module and function):
        raise ValueError(f"a study's report names functions as 'module:function', got {name!r}")
    try:
        found = getattr(import_module(module), function, None)
    except ImportError as exc:
        raise ValueError(f"{name!r} cannot be imported: {exc}") from None
    if not callable(found):
        raise ValueError(f"{name!r}: the module {module} has no function {function!r}")
    return found  # type: ignore[no-any-return]


def records_path(spec_path: str | Path, spec: StudySpec) -> Path:
    """The spec's records file."""
    if "records" not in spec.report:
        raise ValueError(f"the study spec {spec_path} names no records file (report.records)")
    return _resolve(Path(spec_path), spec.report["records"])


def read_records(spec: StudySpec, data: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``(records, meta)`` of a records file's JSON: the spec's ``report.read``, else its ``runs`` and the rest (with
    ``runs`` kept as ``None``, where the written file has it)."""
    if "read" in spec.report:
        records, meta = hook(spec.report["read"])(data)
        return [dict(r) for r in records], dict(meta)
    return [dict(r) for r in data.get("runs", [])], {**dict(data), "runs": None}


def assemble(spec: StudySpec, records: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> dict[str, Any]:
    """The records file's JSON from its records and the rest (``meta``): the spec's ``report.layout``
    (``layout(records, meta) -> data``), else ``meta`` with its ``runs`` (in their place) the records and its
    ``protocol`` (when it has one, and always in a new file) the spec's."""
    if "layout" in spec.report:
        return dict(hook(spec.report["layout"])([dict(r) for r in records], dict(meta)))
    if not meta and spec.protocol:  # a new records file: the protocol first
        meta = {"protocol": None}
    data = {**dict(meta), "runs": [dict(r) for r in records]}
    if spec.protocol and "protocol" in data:
        data["protocol"] = dict(spec.protocol)
    return data


def write_records(spec_path: str | Path, spec: StudySpec, records: Sequence[Mapping[str, Any]],
                  meta: Mapping[str, Any]) -> dict[str, Any]:
    """Write the records file (the spec's ``report.write``, else :func:`assemble` as indented JSON, atomically)
    and return what it holds."""
    path = records_path(spec_path, spec)
    if "write" in spec.report:
        return dict(hook(spec.report["write"])([dict(r) for r in records], dict(meta), path))
    from st_hardneg.reporting import write_text

    data = assemble(spec, records, meta)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(data, indent=int(spec.report.get("indent", 2))) + "\n")
    return data


def point_reader(spec: StudySpec, meta: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], Point]:
    """``record -> Point`` by the spec's ``report.point`` fields (:data:`POINT`), a missing field read from
    ``meta``, a missing dataset the spec's only one.

    Raises:
        ValueError: (when called) a record whose point cannot be read.
    """
    fields = {**POINT, **dict(spec.report.get("point") or {})}
    only = next(iter(spec.datasets)) if len(spec.datasets) == 1 else None

    def value(record: Mapping[str, Any], what: str) -> Any:
        name = fields[what]
        if name in record:
            return record[name]
        if name in meta and meta[name] is not None:
            return meta[name]
        if what == "dataset" and only is not None:
            return only
        if what == "seed":
            return None
        raise ValueError(f"a record of {spec.name} has no {name!r} (its {what}): {dict(record)!r:.120}")

    return lambda record: Point(str(value(record, "dataset")), str(value(record, "row")), value(record, "seed"))


def point_of(record: Mapping[str, Any]) -> Point:
    """A benchmark record's grid point by the default fields (:data:`POINT`): its dataset, row and seed."""
    return Point(record["dataset"], record["method"], record["seed"])


def per_query_rows(path: Path, records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows of the per-query file that the records point to (``"per_query": "<file>#<n>"`` of record ``n``, the
    same dataset, row, seed and stage), in the file's order."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []

    def pointed(row: Mapping[str, Any]) -> bool:
        number = row.get("run")
        if not isinstance(number, int) or not 0 <= number < len(records):
            return False
        record = records[number]
        return (record.get("per_query") == f"{path.name}#{number}" and record.get("stage", "main") == row.get("stage")
                and all(record.get(key) == row.get(key) for key in ("dataset", "method", "seed")))

    return [row for row in rows if pointed(row)]


def import_study(spec_path: str | Path, storage: str = "sqlite:///:memory:", *,
                 heartbeat: int | None = None) -> tuple[StudySpec, Any]:
    """The spec at ``spec_path`` and its study in ``storage`` with the records of ``report.records`` (when the file
    is there) imported as trials, each with its commit and library tree; the file's other fields are the study's
    user attribute ``records_meta`` (kept from the first import).

    Raises:
        ValueError: a bad spec, a records file made under another protocol than the spec's (naming the changed
            keys), a record outside the grid or recorded twice.
    """
    from st_hardneg.training.studies.engine import DEFAULT_HEARTBEAT, import_records, open_storage, open_study

    spec_path = Path(spec_path)
    spec = load_spec(spec_path)
    path = records_path(spec_path, spec)
    study = open_study(spec, open_storage(storage, heartbeat or DEFAULT_HEARTBEAT))
    data = json.loads(path.read_text()) if path.is_file() else {}
    records, meta = read_records(spec, data) if data else ([], {})
    stored = meta.get("protocol")
    if isinstance(stored, Mapping) and spec.protocol and dict(stored) != dict(spec.protocol):
        changed = sorted(k for k in set(stored) | set(spec.protocol) if stored.get(k) != spec.protocol.get(k))
        raise ValueError(f"the records {path} were made under another protocol than the spec's (changed: "
                         f"{', '.join(changed)}); move them away or restore the protocol")
    trees = meta.get(TREES) or {}

    def provenance(record: Mapping[str, Any]) -> dict[str, Any]:
        commit = str(record.get("commit", "unknown"))
        return {"commit": commit, "library": record.get("library") or trees.get(commit, "unknown")}

    import_records(study, spec, records, point_reader(spec, meta), source=path.name, provenance_of=provenance)
    if "records_meta" not in study.user_attrs:
        study.set_user_attr("records_meta", meta)
    return spec, study


def study_data(spec: StudySpec, study: Any) -> dict[str, Any]:
    """The records file the study's trials make (:func:`assemble`): the finished and the failed trials' records, in
    the engine's order, and the imported file's other fields.

    Raises:
        ValueError: trials left to run (naming how many and the first).
    """
    from st_hardneg.training.studies.engine import finished_records, progress

    state = progress(study, [point.key for point in spec.points()])
    if state.left:
        raise ValueError(f"{len(state.left)} trial(s) of {spec.name} are not finished (e.g. {state.left[0]}): the "
                         "tables are rendered from a finished study")
    return assemble(spec, finished_records(study, spec, failed=True), study.user_attrs.get("records_meta") or {})


def outputs(spec: StudySpec) -> list[dict[str, Any]]:
    """The spec's ``report.outputs``."""
    found = spec.report.get("outputs") or []
    for output in found:
        if not {"file", "renderer"} <= set(output):
            raise ValueError(f"{spec.name}: each report output names its file and its renderer, got {output!r}")
    return list(found)


def _table(spec_path: Path, spec: StudySpec, output: Mapping[str, Any], data: Mapping[str, Any]) -> str:
    renderer = hook(output["renderer"])
    if "per_query" in spec.report:
        return str(renderer(data, per_query_rows(_resolve(spec_path, spec.report["per_query"]), data["runs"])))
    return str(renderer(data))


def render(spec_path: str | Path, spec: StudySpec, study: Any,
           data: Mapping[str, Any] | None = None) -> dict[Path, str]:
    """Every table of the spec (``report.outputs`` without ``figure``) rendered from the study's records (or from
    ``data``, the records file just written): ``{file: text}``.

    Raises:
        ValueError: trials left to run.
    """
    spec_path = Path(spec_path)
    data = dict(data) if data is not None else study_data(spec, study)
    return {_resolve(spec_path, o["file"]): _table(spec_path, spec, o, data) for o in outputs(spec) if not o.get("figure")}


def draw(spec_path: str | Path, spec: StudySpec, study: Any, data: Mapping[str, Any] | None = None) -> list[Path]:
    """Every figure of the spec (``report.outputs`` with ``figure``), drawn from the study's records (or ``data``)
    into its file; returns the files."""
    spec_path = Path(spec_path)
    data = dict(data) if data is not None else study_data(spec, study)
    drawn = []
    for output in outputs(spec):
        if output.get("figure"):
            path = _resolve(spec_path, output["file"])
            hook(output["renderer"])(data, path)
            drawn.append(path)
    return drawn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", help="a study spec under benchmarks/studies/")
    parser.add_argument("--storage", default="sqlite:///:memory:", help="the study's storage (default: in memory)")
    parser.add_argument("--check", action="store_true", help="exit 1 unless every rendered table equals the committed")
    args = parser.parse_args(argv)
    try:
        spec, study = import_study(args.spec, args.storage)
        tables = render(args.spec, spec, study)
    except ValueError as exc:
        parser.error(str(exc))
    return show(tables, check=args.check)


def show(tables: Mapping[Path, str], *, check: bool = False, quiet: bool = False) -> int:
    """Print the tables (nothing with ``quiet``), or with ``check`` whether each equals its committed file; returns
    the exit status (1: a table differs from its file)."""
    if check:
        differ = [path for path, text in tables.items() if not path.is_file() or path.read_text() != text]
        for path in tables:
            print(f"{path.name}: {'differs' if path in differ else 'identical'}")
        return 1 if differ else 0
    if not quiet:
        for text in tables.values():
            sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
