"""benchmarks.methods: the one table of methods, each benchmark's rows of it, and the committed runs' configurations
agreeing with the table under their labels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import methods

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
ROWS = {"CPU_PROTOCOL": methods.CPU_PROTOCOL, "SCREEN": methods.SCREEN, "QUEUE_SCREEN": methods.QUEUE_SCREEN,
        "SELECTION": methods.SELECTION, "MRPC": methods.MRPC, "MRPC_OPTIONAL": methods.MRPC_OPTIONAL,
        "SCIFACT": methods.SCIFACT, "SCIFACT_ABLATIONS": methods.SCIFACT_ABLATIONS,
        "SCIFACT_QUEUE": methods.SCIFACT_QUEUE, "OURS": methods.OURS}


def test_every_row_is_a_label_of_the_table_with_a_known_loss():
    from st_hardneg.training import LOSSES

    for name, labels in ROWS.items():
        assert len(set(labels)) == len(labels), name
        for label in labels:
            row = methods.METHODS[label]
            assert row.loss in LOSSES or row.loss in ("gist", "cached_mnrl"), (name, label)
            assert row.about and row.family, label
    assert len(methods.QUEUE_SCREEN) == 12
    # the registry-default rows are named after their loss; "mixcse", the label every committed result was recorded
    # under, runs the named form the registry's plain "mixcse" was until one name meant one loss (mixcse_two_way)
    recorded_as = {"mixcse": "mixcse_two_way"}
    for label in (*methods.OURS, "mnrl", "mnrl_symmetric"):
        assert methods.METHODS[label].loss == recorded_as.get(label, label) and not methods.METHODS[label].options


def test_table_gives_fresh_options_and_the_sts_form_where_it_differs():
    first, second = methods.table(["mixcse_hardest"]), methods.table(["mixcse_hardest"])
    assert first == {"mixcse_hardest": ("mixcse_two_way", {"partner": "hardest"})}
    first["mixcse_hardest"][1]["partner"] = "changed"
    assert second["mixcse_hardest"][1] == {"partner": "hardest"} == dict(methods.METHODS["mixcse_hardest"].options)
    assert methods.table(["mnrl_hardness"]) == {"mnrl_hardness": ("mnrl_hardness", {"hardness_mode": "all_negatives"})}
    assert methods.table(["mnrl_hardness"], sts=True) == {"mnrl_hardness": ("mnrl_hardness", {})}
    differs = [label for label in methods.METHODS
               if methods.table([label], sts=True) != methods.table([label])]
    assert differs == ["mnrl_hardness"]
    with pytest.raises(KeyError):
        methods.table(["no_such_label"])
    assert methods.builtin(["focal", "gist", "mnrl"]) == ("gist", "mnrl")


@pytest.mark.parametrize(("name", "labels", "sts"), [
    ("cpu_protocol", methods.CPU_PROTOCOL, True),
    ("retrieval", methods.MRPC + methods.MRPC_OPTIONAL, False),
    ("retrieval_selection", methods.SELECTION, False),
    ("scifact", methods.SCIFACT + methods.SCIFACT_ABLATIONS + methods.SCIFACT_QUEUE, False),
    ("scifact_selection", methods.SELECTION, False),
])
def test_committed_runs_ran_the_configuration_their_label_names(name, labels, sts):
    """A label means one configuration: every committed run under a table label has the table's loss and options
    in its recorded loss configuration (``batch_factor`` is the benchmark's, not the loss's)."""
    runs = [r for r in json.loads((RESULTS / f"{name}.json").read_text())["runs"]
            if r.get("method") in labels and not r.get("failed")]
    assert runs
    for run in runs:
        loss, options = methods.table([run["method"]], sts=sts)[run["method"]]
        # the name recorded at the time, under today's registry names (mixcse -> mixcse_two_way for a two-direction
        # run, methods.RENAMED_LOSSES)
        assert methods.recorded_loss(run) == loss, (name, run["method"])
        for key, value in options.items():
            if key != "batch_factor":
                assert run["loss_config"][key] == value, (name, run["method"], key)
