"""The table schema (efpsn/params/table.py) as a value: its JSON and wire forms read back, every
malformed field refused naming it, and its fit with the rest of the run (RunConfig); a table's
rows encoded from text cells, a dict of columns or a file (efpsn/data/table_encoding.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from efpsn.data.table_encoding import encode_table, plain_schema, raw_table_of
from efpsn.data.tables import DataProblems, Problem, read_raw_table, rows_text
from efpsn.params.config import RunConfig
from efpsn.params.table import TableColumn, TableSchema

SCHEMA = TableSchema(label_column="species", label="names", class_names=("a", "b", "c"),
                     columns=(TableColumn("x"), TableColumn("island", ("n", "s"))),
                     drop=("id",), agreed=("classes", "island"))


def test_the_json_and_wire_forms_read_back() -> None:
    assert TableSchema.from_json(SCHEMA.to_json()) == SCHEMA
    assert TableSchema.parse(SCHEMA.wire()) == SCHEMA == TableSchema.of(SCHEMA.wire())
    assert str(SCHEMA) == SCHEMA.wire() and json.loads(SCHEMA.wire())["label"] == "names"
    assert TableSchema.parse("") == TableSchema() == TableSchema.parse("none")
    assert TableSchema().wire() == "" and str(TableSchema()) == "none"
    assert TableSchema().to_json() == {} and TableSchema.from_json(None) == TableSchema()
    assert SCHEMA.features == 3 and SCHEMA.feature_names() == ("x", "island=n", "island=s")
    assert SCHEMA.classes == 3 and TableSchema(label_column="y", label="number",
                                               columns=(TableColumn("x"),)).classes == 1
    assert SCHEMA.describe() == "3 features from 2 columns, label 'species' (3 class names)"
    assert TableSchema().describe() == "none"


def test_the_disclosure_names_what_was_learnt_from_the_tables() -> None:
    text = SCHEMA.disclosure()
    assert text is not None
    assert "the class names that occur in any party's table" in text
    assert "the categories of 'island' that occur in any party's table" in text
    listed = TableSchema.from_json({**SCHEMA.to_json(), "agreed": []})
    assert listed.disclosure() is None


@pytest.mark.parametrize(("values", "message"), [
    ([1], "expected a JSON object"),
    ({"label_column": "y", "columns": [{"name": "x"}], "colour": 1}, "unknown field 'colour'"),
    ({"label_column": "y", "columns": "x"}, "columns must be a list"),
    ({"label_column": "y", "columns": [{"title": "x"}]}, "a column must be"),
    ({"label_column": "y", "columns": [{"name": "x"}], "drop": "id"}, "drop must be a list"),
    ({"label_column": "y", "columns": [{"name": "x", "categories": ["a", "a"]}]},
     "lists 'a' twice"),
    ({"label_column": "y", "label": "names", "class_names": ["a"],
      "columns": [{"name": "x"}]}, "at least 2 class names"),
    ({"label_column": "y", "label": "names", "columns": [{"name": "x"}]},
     "class_names come with label"),
    ({"label_column": "y", "label": "colour", "columns": [{"name": "x"}]},
     "label must be one of"),
    ({"label_column": "y", "columns": []}, "at least one feature column"),
    ({"label_column": "y", "columns": [{"name": "y"}]}, "'y' is named twice"),
    ({"label_column": "y", "columns": [{"name": "x"}], "agreed": ["x"]}, "agreed names"),
    ({"label_column": "", "columns": []}, "label_column must be a non-empty text"),
    ({"label_column": "y\x00", "columns": [{"name": "x"}]}, "control character"),
])
def test_a_malformed_schema_is_refused_naming_its_field(values: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TableSchema.from_json(values)


def test_a_file_is_read_and_its_errors_name_it(tmp_path: Path) -> None:
    path = tmp_path / "table.json"
    path.write_text(json.dumps(SCHEMA.to_json()))
    assert TableSchema.read(str(path)) == SCHEMA
    path.write_text("{not json")
    with pytest.raises(ValueError, match=rf"^{path}: table schema: not valid JSON"):
        TableSchema.read(str(path))
    with pytest.raises(ValueError, match="cannot be read .*efpsn data schema"):
        TableSchema.read(str(tmp_path / "none.json"))
    with pytest.raises(TypeError):
        TableSchema.parse(3)  # type: ignore[arg-type]


def test_the_run_refuses_a_table_that_does_not_fit_it() -> None:
    local = {"data": "local", "table": SCHEMA}
    assert RunConfig(**local, input_shape="3", classes=3).table == SCHEMA
    with pytest.raises(ValueError, match="gives 3 features per sample .* input shape is 4"):
        RunConfig(**local, input_shape="4", classes=3)
    with pytest.raises(ValueError, match="has 3 class names, but the run says 2 classes"):
        RunConfig(**local, input_shape="3", classes=2)
    with pytest.raises(ValueError, match="holds classes and the task is ridge"):
        RunConfig(**local, input_shape="3", classes=1, task="ridge")
    number = TableSchema(label_column="y", label="number", columns=(TableColumn("x"),))
    with pytest.raises(ValueError, match="use --task ridge"):
        RunConfig(data="local", table=number, input_shape="1", classes=2)
    with pytest.raises(ValueError, match="a table schema is for agent-local data"):
        RunConfig(table=SCHEMA)
    with pytest.raises(ValueError, match="task ridge predicts one number"):
        RunConfig(task="ridge", data="local", input_shape="3")
    with pytest.raises(ValueError, match="classifies, and needs classes >= 2"):
        RunConfig(data="local", input_shape="3", classes=1)


def test_rows_are_encoded_from_a_dict_of_columns_without_labels() -> None:
    raw = raw_table_of({"x": [1.5, None, float("nan")], "island": ["n", "s", ""],
                        "id": ["p", "q", "r"]})
    encoded, problems = encode_table(SCHEMA, raw, where="", labels=False)
    assert problems == [] and encoded is not None and encoded.missing == 2
    x = encoded.features
    assert x[0].tolist() == [1.5, 1.0, 0.0] and np.isnan(x[1, 0]) and x[2, 1:].tolist() == [0, 0]
    with pytest.raises(ValueError, match="as many rows"):
        raw_table_of({"x": [1], "y": [1, 2]})


def test_every_cell_problem_of_a_file_is_found(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("x,island,species,id\n1,n,a,p\nq,w,z,p\n2,s,,p\n3,n,b,p,extra\n")
    raw = read_raw_table(path, refuse=ValueError)
    encoded, problems = encode_table(SCHEMA, raw, where="t.csv")
    assert encoded is None
    assert [str(p) for p in problems] == [
        ("t.csv is ragged: row 4 (line 5) has 5 fields where the header has 4; expected every "
         "row to have one value per column")]
    path.write_text("x,island,species,id\n1,n,a,p\nq,w,z,p\n2,s,,p\n")
    _, problems = encode_table(SCHEMA, read_raw_table(path, refuse=ValueError), where="t.csv")
    texts = [str(p) for p in problems]
    assert texts[0].startswith("t.csv, row 2 (line 3), column 'x' is not a number")
    assert texts[1].startswith("t.csv, row 2 (line 3), column 'island' holds a category that "
                               "is not one of the run's (n, s)")
    assert texts[2].startswith("t.csv, row 3 (line 4), column 'species' is empty")
    assert texts[3].startswith("t.csv, row 2 (line 3), column 'species' holds a class name")
    with pytest.raises(ValueError, match="no feature column"):
        plain_schema(raw_table_of({"label": [0]}), label_column="label")


def test_a_csv_that_cannot_be_a_table_is_said_at_once(tmp_path: Path) -> None:
    cases = (("", "is empty"), ("a,a,label\n1,2,0\n", "names the column 'a' twice"),
             ("a,,label\n1,2,0\n", "has a column without a name"))
    for text, message in cases:
        (tmp_path / "t.csv").write_text(text)
        with pytest.raises(ValueError, match=message):
            read_raw_table(tmp_path / "t.csv", refuse=ValueError)
    (tmp_path / "b.csv").write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ValueError, match="not a text .csv"):
        read_raw_table(tmp_path / "b.csv", refuse=ValueError)


def test_problems_are_said_once_and_rows_cut_short() -> None:
    assert rows_text([0, 4, 9, 12], {0: 2, 4: 6, 9: 11, 12: 14}) == (
        "rows 1, 5, 10 and more (lines 2, 6, 11)")
    merged = DataProblems("D", [Problem("a.csv", "is bad"), Problem("b.csv", "is bad"),
                                Problem("c.csv", "is worse")])
    assert str(merged) == ("D: 2 problems; fix them all and run again:\n"
                           "  a.csv and b.csv is bad\n  c.csv is worse")
    assert str(DataProblems("D", [Problem("", "is bad")])) == "D: is bad"


def test_progress_as_lines(capsys: pytest.CaptureFixture[str]) -> None:
    from efpsn.launch.progress import make_progress

    lines = make_progress("lines", total=10)
    lines.update(3)
    lines.set_postfix(acc="0.9")
    lines.close()
    assert capsys.readouterr().out == "efpsn up: round 3 of 10 (acc 0.9)\n"
    with pytest.raises(ValueError, match="progress must be one of"):
        make_progress("bars", total=None)  # type: ignore[arg-type]
