"""A study written as data: ``--method`` strings, the control's twins, the grid's points, and the JSON / TOML forms."""

from __future__ import annotations

import json

import pytest

from st_hardneg.training.studies.spec import Dataset, Point, Row, load_spec, parse_method, spec_from_methods


@pytest.mark.parametrize("text, label, row", [
    ("mnrl", "mnrl", Row("mnrl")),
    ("focal:temperature=0.1", "focal", Row("focal", {"temperature": 0.1})),
    ("mix=mixcse_two_way:partner=explicit,lam=0.3", "mix", Row("mixcse_two_way", {"partner": "explicit", "lam": 0.3})),
    ("f=focal:control=true", "f", Row("focal", {}, control=True)),
    ("f+ctl=focal", "f+ctl", Row("focal", {}, control=True)),
    ("q=mnrl_queue:margin=None", "q", Row("mnrl_queue", {"margin": None})),
])
def test_a_method_string_is_a_label_and_a_row(text, label, row):
    assert parse_method(text) == (label, row)


def test_control_adds_a_controlled_twin_of_each_st_hardneg_row_only():
    spec = spec_from_methods(["mnrl=mnrl", "focal=focal:temperature=0.05"], datasets={"d": Dataset("d")},
                             seeds=[0, 1], control=True)
    assert list(spec.rows) == ["mnrl", "focal", "focal+ctl"]  # sentence-transformers' mnrl takes no control
    assert spec.rows["focal+ctl"] == Row("focal", {"temperature": 0.05}, control=True)
    assert spec.choice.baseline == "mnrl"
    assert [p.key for p in spec.points()] == ["d/mnrl/0", "d/mnrl/1", "d/focal/0", "d/focal/1", "d/focal+ctl/0",
                                              "d/focal+ctl/1"]
    assert Point("d", "mnrl", None).key == "d/mnrl/-"


def test_the_json_and_toml_forms_read_back_the_same_spec(tmp_path):
    spec = spec_from_methods(["mnrl=mnrl", "f+ctl=focal:temperature=0.05"], datasets={"d": Dataset("x/d", dev="carve")},
                             seeds=[0, 2], protocol={"limit": 100}, baseline="f+ctl", tie_sds=1.5)
    (tmp_path / "s.json").write_text(json.dumps(spec.to_dict()))
    assert load_spec(tmp_path / "s.json") == spec
    (tmp_path / "s.toml").write_text(
        'name = "study"\n[protocol]\nlimit = 100\n[rows.mnrl]\nloss = "mnrl"\n'
        '[rows."f+ctl"]\nloss = "focal"\ncontrol = true\noptions = {temperature = 0.05}\n'
        '[datasets.d]\nfolder = "x/d"\ndev = "carve"\n'
        '[[grid]]\ndatasets = ["d"]\nrows = ["mnrl", "f+ctl"]\nseeds = [0, 2]\n'
        '[choice]\nmetric = "ndcg@10"\ntie_sds = 1.5\nbaseline = "f+ctl"\n')
    assert load_spec(tmp_path / "s.toml") == spec
