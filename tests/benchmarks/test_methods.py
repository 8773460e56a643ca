"""benchmarks.methods: the one table of methods, each benchmark's rows of it, and the committed runs' configurations
agreeing with the table under their labels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import methods

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
ROWS = {"CPU_PROTOCOL": methods.CPU_PROTOCOL, "SCREEN": methods.SCREEN, "QUEUE_SCREEN": methods.QUEUE_SCREEN,
        "OURS": methods.OURS}


def test_every_row_is_a_label_of_the_table_with_a_known_loss():
    from st_hardneg.training import LOSSES

    for name, labels in ROWS.items():
        assert len(set(labels)) == len(labels), name
        for label in labels:
            row = methods.METHODS[label]
            assert row.loss in LOSSES or row.loss == "cached_mnrl", (name, label)
            assert row.about and row.family, label
    assert len(methods.QUEUE_SCREEN) == 12
    # the registry-default rows are named after their loss; "mixcse", the label the committed STS results are
    # recorded under, runs the two-direction form (mixcse_two_way)
    recorded_as = {"mixcse": "mixcse_two_way"}
    for label in (*methods.OURS, "mnrl", "mnrl_symmetric"):
        assert methods.METHODS[label].loss == recorded_as.get(label, label) and not methods.METHODS[label].options


def test_table_gives_fresh_options_and_the_sts_form_where_it_differs():
    first, second = methods.table(["mixcse_lam0.4"]), methods.table(["mixcse_lam0.4"])
    assert first == {"mixcse_lam0.4": ("mixcse_two_way", {"lam": 0.4})}
    first["mixcse_lam0.4"][1]["lam"] = "changed"
    assert second["mixcse_lam0.4"][1] == {"lam": 0.4} == dict(methods.METHODS["mixcse_lam0.4"].options)
    assert methods.table(["mnrl_hardness"]) == {"mnrl_hardness": ("mnrl_hardness", {"hardness_mode": "all_negatives"})}
    assert methods.table(["mnrl_hardness"], sts=True) == {"mnrl_hardness": ("mnrl_hardness", {})}
    differs = [label for label in methods.METHODS
               if methods.table([label], sts=True) != methods.table([label])]
    assert differs == ["mnrl_hardness"]
    with pytest.raises(KeyError):
        methods.table(["no_such_label"])
    assert methods.builtin(["focal", "mnrl_hardness", "mnrl"]) == ("mnrl_hardness", "mnrl")


@pytest.mark.parametrize(("name", "labels", "sts"), [
    ("cpu_protocol", methods.CPU_PROTOCOL, True),
])
def test_committed_runs_ran_the_configuration_their_label_names(name, labels, sts):
    """A label means one configuration: every committed run under a table label has the table's loss and options
    in its recorded loss configuration."""
    runs = [r for r in json.loads((RESULTS / f"{name}.json").read_text())["runs"]
            if r.get("method") in labels and not r.get("failed")]
    assert runs
    for run in runs:
        loss, options = methods.table([run["method"]], sts=sts)[run["method"]]
        # the name the record's own loss configuration gives (a two-direction "mixcse" run is mixcse_two_way)
        assert methods.recorded_loss(run) == loss, (name, run["method"])
        for key, value in options.items():
            assert run["loss_config"][key] == value, (name, run["method"], key)


def test_a_recorded_loss_is_named_by_the_form_its_record_shows():
    two_way = {"loss": "mixcse", "loss_config": {"directions": ["query_to_doc", "doc_to_query"]}}
    assert methods.recorded_loss(two_way) == "mixcse_two_way"
    assert methods.recorded_loss({"loss": "mixcse", "loss_config": {"symmetric": True}}) == "mixcse_two_way"
    assert methods.recorded_loss({"loss": "mixcse", "loss_config": {"directions": ["query_to_doc"]}}) == "mixcse"
    assert methods.recorded_loss({"loss": "hncse", "loss_config": {"mode": "both"}}) == "hncse_both"
    assert methods.recorded_loss({"loss": "hncse", "loss_config": {"mode": "hnm"}}) == "hncse_hnm"
    assert methods.recorded_loss({"loss": "focal"}) == "focal"
