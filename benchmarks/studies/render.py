"""A benchmark's study spec, its committed records imported as finished trials, and its tables rendered from them.

A spec under ``benchmarks/studies/`` names, in its ``report``, the records it was run into (``records``: the results
JSON; ``per_query``: the per-query file beside it), the renderer of its tables (``renderer``: ``module:function``,
called as ``renderer(data, per_query_rows)``) and the file those tables are committed as (``output``). This script
imports the records into the study's storage (:func:`st_hardneg.training.studies.engine.import_records`; an
in-memory SQLite unless ``--storage`` is given), reads them back from the finished trials
(:func:`~st_hardneg.training.studies.engine.finished_records`) and renders the tables from those, so the committed
numbers are the study's records, with nothing left to run.

    python -m benchmarks.studies.render benchmarks/studies/retrieval_beir_round2.json           # print
    python -m benchmarks.studies.render benchmarks/studies/retrieval_beir_round2.json --check   # == committed?
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from importlib import import_module
from pathlib import Path
from typing import Any

from st_hardneg.training.studies.spec import Point, StudySpec, load_spec

#: where a record's commit's library tree is, when the record does not name it
TREES = "library_trees"


def _resolve(spec_path: Path, name: str) -> Path:
    return (spec_path.parent / name).resolve()


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


def point_of(record: Mapping[str, Any]) -> Point:
    """A benchmark record's grid point: its dataset, row (``method``) and seed."""
    return Point(record["dataset"], record["method"], record["seed"])


def import_study(spec_path: str | Path, storage: str = "sqlite:///:memory:") -> tuple[StudySpec, Any]:
    """The spec at ``spec_path`` and its study in ``storage`` with the records of ``report.records`` imported as
    finished trials (each with its commit and library tree), and the records' own fields besides the runs (commits,
    datasets, negatives, library trees) as the study's user attribute ``records_meta``."""
    from st_hardneg.training.studies.engine import import_records, open_storage, open_study

    spec_path = Path(spec_path)
    spec = load_spec(spec_path)
    records_path = _resolve(spec_path, spec.report["records"])
    data = json.loads(records_path.read_text())
    study = open_study(spec, open_storage(storage))
    trees = data.get(TREES, {})

    def provenance(record: Mapping[str, Any]) -> dict[str, Any]:
        commit = str(record.get("commit", "unknown"))
        return {"commit": commit, "library": record.get("library") or trees.get(commit, "unknown")}

    import_records(study, spec, data["runs"], point_of, source=records_path.name, provenance_of=provenance)
    if "records_meta" not in study.user_attrs:
        study.set_user_attr("records_meta", {k: v for k, v in data.items() if k not in ("protocol", "runs")})
    return spec, study


def render(spec_path: str | Path, spec: StudySpec, study: Any) -> str:
    """The spec's tables from the study's finished trials (nothing may be left to run).

    Raises:
        ValueError: trials left to run (naming how many and the first).
    """
    from st_hardneg.training.studies.engine import finished_records, progress

    state = progress(study, [point.key for point in spec.points()])
    if state.left:
        raise ValueError(f"{len(state.left)} trial(s) of {spec.name} are not finished (e.g. {state.left[0]}): the "
                         "tables are rendered from a finished study")
    records = finished_records(study, spec)
    data = {"protocol": dict(spec.protocol), "runs": records, **study.user_attrs["records_meta"]}
    module, _, function = spec.report["renderer"].partition(":")
    renderer = getattr(import_module(module), function)
    return str(renderer(data, per_query_rows(_resolve(Path(spec_path), spec.report["per_query"]), records)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", help="a study spec under benchmarks/studies/")
    parser.add_argument("--storage", default="sqlite:///:memory:", help="the study's storage (default: in memory)")
    parser.add_argument("--check", action="store_true", help="exit 1 unless the rendered tables equal the committed")
    args = parser.parse_args(argv)
    spec, study = import_study(args.spec, args.storage)
    text = render(args.spec, spec, study)
    if args.check:
        committed = _resolve(Path(args.spec), spec.report["output"]).read_text()
        print("identical" if text == committed else "differs")
        return 0 if text == committed else 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
