"""Studies: a grid of training runs (rows × seeds × datasets) written as data, run by Optuna's storage and workers,
chosen on dev and reported from its records (``st-hardneg study``; the engine and why it is Optuna:
:mod:`~st_hardneg.training.studies.engine`).

- :mod:`~st_hardneg.training.studies.spec`: :class:`StudySpec` (protocol, rows, datasets, grid, choice rule),
  :func:`load_spec`, :func:`spec_from_methods`, every check before a model loads;
- :mod:`~st_hardneg.training.studies.engine`: the storage, the grid, the workers, committed records imported as
  finished trials;
- :mod:`~st_hardneg.training.studies.beir`: one trial on a BEIR folder (train, dev and test scores, the per-query
  file);
- :mod:`~st_hardneg.training.studies.report`: the table, the dev choice or its tie, the paired tests, the figure.

Needs the ``study`` extra (``pip install st-hardneg[study]``: Optuna). Nothing here is imported by
``import st_hardneg.training``.

>>> from st_hardneg.training.studies import load_spec, run_study
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "StudySpec": "spec", "Row": "spec", "Dataset": "spec", "Point": "spec", "load_spec": "spec",
    "spec_from_methods": "spec", "parse_method": "spec",
    "open_storage": "engine", "open_study": "engine", "run_study": "engine", "work": "engine",
    "import_records": "engine", "finished_records": "engine", "progress": "engine", "provenance": "engine",
    "trial_function": "engine",
    "run_point": "beir", "write_report": "report", "choice": "report", "summary": "report",
}

__all__ = ["Dataset", "Point", "Row", "StudySpec", "choice", "finished_records", "import_records", "load_spec",
           "open_storage", "open_study", "parse_method", "progress", "provenance", "run_point", "run_study",
           "spec_from_methods", "summary", "trial_function", "work", "write_report"]

if TYPE_CHECKING:  # pragma: no cover
    from st_hardneg.training.studies.beir import run_point
    from st_hardneg.training.studies.engine import (
        finished_records,
        import_records,
        open_storage,
        open_study,
        progress,
        provenance,
        run_study,
        trial_function,
        work,
    )
    from st_hardneg.training.studies.report import choice, summary, write_report
    from st_hardneg.training.studies.spec import (
        Dataset,
        Point,
        Row,
        StudySpec,
        load_spec,
        parse_method,
        spec_from_methods,
    )


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
