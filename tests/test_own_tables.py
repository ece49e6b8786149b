"""Tables as users have them (tests/own_tables.py): string labels, category columns, empty cells,
ids, free text, dates and numeric targets, checked in one pass before anything starts, and run
by the simulator with the network's policies (class names and categories agreed, empty cells
filled with the network's column means, ridge for a number). The networked runs are in
tests/test_own_tables_network.py."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
from commands import efpsn
from own_tables import SPREADSHEET, cellar, diabetes, reference_classifier, reference_ridge

from efpsn.data.folders import load_data_dir
from efpsn.data.inspection import inspect_folder
from efpsn.data.tables import DataProblems
from efpsn.flags.names import config_from_values
from efpsn.params.config import RunConfig
from efpsn.params.table import TableSchema
from efpsn.problem import build_problem
from efpsn.simulator import run_simulation
from efpsn.stats.standardise import simulate_standardising
from efpsn.tasks.optimum import centralized_optimum


def simulated(folder: Path, *, label: str, drop: tuple[str, ...] = (), **given: object):
    """The simulator's run of a folder as `efpsn simulate --data-dir` runs it (holdout 0)."""
    inspected = inspect_folder(folder, label_column=label, drop=drop, given=given)
    config = config_from_values(given, folder=inspected, resolve=False)
    local = load_data_dir(config, inspected.layout, holdout=0.0)
    config, local, _ = simulate_standardising(config, local)
    config = config.resolved()
    problem = build_problem(config, local=local)
    x_star = centralized_optimum(problem.task, problem.shards).x
    return config, run_simulation(config, problem=problem, x_star=x_star)


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tables")
    return {"cellar": cellar(root / "cellar"), "extra": cellar(root / "extra", extra=True),
            "diabetes": diabetes(root / "diabetes")}


# ----------------------------------------------------------------------------- one pass


@pytest.mark.process
def test_every_problem_of_every_file_in_one_message_before_anything_starts(
        tmp_path: Path, tables: dict[str, Path]) -> None:
    # prepare: the cellar with an id, free text and a date, and, in three files, an empty
    # label, a ragged row and a category no other file has
    root = cellar(tmp_path / "D", extra=True)
    path = root / "agent2" / "train.csv"
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    rows[3][rows[0].index("cultivar")] = ""  # row 3 (line 4): no label
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    with open(root / "agent3" / "train.csv", "a") as fh:
        fh.write("B-9,13.1,2.0\n")  # ragged
    # execute: efpsn up, which would start a coordinator and four agents
    proc = efpsn("up", "--data-dir", str(root), "--label-column", "cultivar", "--results",
                 str(tmp_path / "R"))
    # assert: exit 2, one message naming every file and column at fault, and what to do;
    # nothing was started (no results folder: no certificate, no log, no port file)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr
    assert err.startswith(f"efpsn: error: data folder {root}: 5 problems; fix them all")
    for found in ("every file, column 'bottle_id' looks like an id (every value distinct)",
                  "every file, column 'tasting_note' looks like free text",
                  "every file, column 'bottled' holds dates",
                  "agent3's train.csv is ragged: row ",
                  ("agent2's train.csv, row 3 (line 4), column 'cultivar' is empty; expected "
                   "a label in every row")):
        assert found in err, err
    assert "--drop bottle_id" in err and '"drop": ["tasting_note"] in schema.json' in err
    assert not (tmp_path / "R").exists()
    # ... and the simulator says the same before it computes anything
    sim = efpsn("simulate", "--data-dir", str(root), "--label-column", "cultivar")
    assert sim.returncode == 2 and sim.stderr.replace("simulate", "up") == err.replace(
        "simulate", "up")


@pytest.mark.process
def test_an_agent_checks_its_own_files_before_it_makes_a_port(tmp_path: Path) -> None:
    own = tmp_path / "mine.csv"
    own.write_text("a,b,label\n1,2,x\n3,4\n5,6,\n")
    proc = efpsn("agent", "--name", "agent1", "--listen", "127.0.0.1:0", "--coordinator",
                 "127.0.0.1:9", "--insecure", "--data", str(own), "--test-data",
                 str(tmp_path / "none.csv"), "--port-file", str(tmp_path / "port"))
    assert proc.returncode == 2
    assert proc.stderr.count("\n  ") == 3, proc.stderr  # 3 problems, one message
    assert "row 2 (line 3) has 2 fields where the header has 3" in proc.stderr
    assert "row 3 (line 4), column 'label' is empty" in proc.stderr
    assert "agent1's none.csv is no such file" in proc.stderr
    assert not (tmp_path / "port").exists()


# ----------------------------------------------------------------------------- string labels


def test_class_names_are_labels_agreed_across_the_parties(tables: dict[str, Path]) -> None:
    inspected = inspect_folder(tables["cellar"], label_column="cultivar")
    table = inspected.table
    assert table.label == "names" and table.class_names == ("Barbera", "Barolo", "Grignolino")
    assert inspected.values["classes"] == 3 and "classes" in table.agreed
    config = config_from_values({}, folder=inspected, resolve=False)
    assert config.table == table and RunConfig.from_dict(config.to_dict()).table == table
    from efpsn.privacy.modes import privacy_statement
    from efpsn.topology import build_graph

    line = privacy_statement(config.resolved(), build_graph("ring", 4)).line()
    assert "the class names that occur in any party's table" in line
    assert "never which party holds which" in line


def test_class_names_listed_in_schema_json_are_no_disclosure(tmp_path: Path) -> None:
    root = cellar(tmp_path / "D")
    (root / "schema.json").write_text(json.dumps({
        "label_column": "cultivar", "classes": ["Barbera", "Barolo", "Grignolino", "Nebbiolo"],
        "categories": {"region": ["Lombardy", "Piedmont", "Veneto", "Tuscany"],
                       "cask": ["oak", "steel"]}}))
    table = inspect_folder(root).table
    assert table.class_names[-1] == "Nebbiolo" and table.agreed == ()
    assert table.disclosure() is None  # nothing learnt from any table: the lists are public
    assert table.features == 13 + 4 + 2
    # a name outside the list is refused by row
    path = root / "agent1" / "train.csv"
    path.write_text(path.read_text().replace(",Barolo\n", ",Dolcetto\n", 1))
    with pytest.raises(DataProblems, match=r"agent1's train.csv, row \d+ \(line \d+\), column "
                                           r"'cultivar' holds a class name that is not one of "
                                           r"the run's \(Barbera, Barolo, Grignolino, Nebbiolo\)"):
        inspect_folder(root)


# ----------------------------------------------------------------------------- categories


def test_category_columns_are_one_hot_over_the_agreed_categories(
        tables: dict[str, Path]) -> None:
    table = inspect_folder(tables["cellar"], label_column="cultivar").table
    kinds = {c.name: c.categories for c in table.columns}
    assert kinds["region"] == ("Lombardy", "Piedmont", "Veneto")
    assert kinds["cask"] == ("oak", "steel") and kinds["alcohol"] == ()
    assert table.features == 13 + 3 + 2 and set(table.agreed) == {"classes", "region", "cask"}
    config = config_from_values({}, folder=inspect_folder(tables["cellar"],
                                                          label_column="cultivar"))
    local = load_data_dir(config, tables["cellar"], holdout=0.0)
    x = local[0].train.images.numpy()
    names = table.feature_names()
    region = x[:, [names.index(f"region={c}") for c in kinds["region"]]]
    assert set(np.unique(region.sum(axis=1))) == {1.0}  # exactly one category a row


def test_ids_free_text_and_dates_are_refused_by_name_and_dropped_by_flag(
        tables: dict[str, Path]) -> None:
    with pytest.raises(DataProblems) as refused:
        inspect_folder(tables["extra"], label_column="cultivar")
    assert [p.column for p in refused.value.problems] == ["bottle_id", "tasting_note",
                                                          "bottled"]
    dropped = inspect_folder(tables["extra"], label_column="cultivar",
                             drop=("bottle_id", "tasting_note", "bottled")).table
    assert dropped.drop == ("bottle_id", "tasting_note", "bottled")
    assert dropped.columns == inspect_folder(tables["cellar"], label_column="cultivar").table.columns


def test_a_number_column_named_like_an_id_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "D"
    for k, rows in enumerate((range(30), range(30, 60)), start=1):
        (root / f"agent{k}").mkdir(parents=True)
        (root / f"agent{k}" / "train.csv").write_text(
            "row_id,x,label\n" + "".join(f"{i},{i % 7},{i % 2}\n" for i in rows))
    with pytest.raises(DataProblems, match="column 'row_id' looks like an id"):
        inspect_folder(root)
    assert inspect_folder(root, drop=("row_id",)).table.feature_names() == ("x",)


# ----------------------------------------------------------------------------- empty cells


def test_empty_cells_take_the_network_s_column_mean_at_every_party(
        tables: dict[str, Path]) -> None:
    """Each party's empty number cells become the global mean over every party's values,
    learnt from the secure sums: standardised, they are exactly 0 (and each party's count of
    them stays with it: LocalData.missing)."""
    inspected = inspect_folder(tables["cellar"], label_column="cultivar")
    assert inspected.missing
    config = config_from_values({}, folder=inspected, resolve=False)
    local = load_data_dir(config, inspected.layout, holdout=0.0)
    empty = {i: np.isnan(d.train.images.numpy()) for i, d in local.items()}
    assert all(e.any() for e in empty.values())
    assert [d.missing for d in local.values()] == [int(e.sum()) for e in empty.values()]
    _, standardised, totals = simulate_standardising(config, local)
    pooled = np.concatenate([d.train.images.numpy() for d in local.values()])
    np.testing.assert_allclose(totals.mean(), np.nanmean(pooled, axis=0), rtol=1e-13)
    for i, d in standardised.items():
        z = d.train.images.numpy()
        assert np.all(z[empty[i]] == 0.0) and np.isfinite(z).all()


def test_empty_cells_need_scale_standard(tables: dict[str, Path]) -> None:
    with pytest.raises(DataProblems, match="empty number cells, which every party fills with "
                                           "the network's column mean, given by scale standard "
                                           "only; --scale is none"):
        inspect_folder(tables["cellar"], label_column="cultivar", given={"scale": "none"})


# ----------------------------------------------------------------------------- numeric targets


@pytest.mark.process
def test_a_numeric_target_under_a_classifier_is_refused_naming_ridge(
        tmp_path: Path, tables: dict[str, Path]) -> None:
    proc = efpsn("simulate", "--data-dir", str(tables["diabetes"]), "--label-column",
                 "progression")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "give --task ridge" in proc.stderr
    # numbers that are not integers: one line naming --task ridge
    root = tmp_path / "F"
    for k in (1, 2):
        (root / f"agent{k}").mkdir(parents=True)
        (root / f"agent{k}" / "train.csv").write_text("x,y\n1,0.5\n2,1\n3,0\n")
    proc = efpsn("simulate", "--data-dir", str(root), "--label-column", "y")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "column 'y' holds numbers that are not integers" in proc.stderr
    assert "--task ridge" in proc.stderr


def test_ridge_keeps_the_exactness_promise_and_lands_at_scikit_learn(
        tables: dict[str, Path]) -> None:
    # execute: the defaults with --task ridge, unmasked and masked at two gammas, all stopped
    # by the same rule without the consensus tails (a tail certifies a masked run at a round
    # of its own); the defaults themselves
    folder = tables["diabetes"]
    ridge = {"task": "ridge"}
    _, unmasked = simulated(folder, label="progression", mask="none", tail="off", **ridge)
    masked = [simulated(folder, label="progression", gamma=g, tail="off", **ridge)[1]
              for g in (1e3, 1e6)]
    config, defaults = simulated(folder, label="progression", **ridge)
    # assert: exact like logreg, certified, and R^2 within 0.02 of StandardScaler + Ridge
    base = unmasked.final["relative_deviation"]
    assert base <= 1e-3
    for run in masked:
        assert run.final["relative_deviation"] <= 1.1 * base + 1e-6
    assert defaults.convergence is not None and defaults.convergence.converged
    assert config.l2.weight == 1.0 / sum(len(p.read_text().splitlines()) - 1
                                         for p in folder.glob("agent*/train.csv"))
    assert defaults.final["accuracy"] >= reference_ridge(folder, "progression") - 0.02


@pytest.mark.process
def test_ridge_survives_a_departure_in_the_simulator(tables: dict[str, Path]) -> None:
    proc = efpsn("simulate", "--data-dir", str(tables["diabetes"]), "--task", "ridge",
                 "--label-column", "progression", "--leave", "agent3@150", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "agent3 left at round 150" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("converged:"), proc.stdout


# ----------------------------------------------------------------------------- the goals


def test_the_cellar_lands_at_scikit_learn_with_its_label_column_alone(
        tables: dict[str, Path]) -> None:
    _, run = simulated(tables["cellar"], label="cultivar")
    assert run.convergence is not None and run.convergence.converged
    assert run.final["accuracy"] >= reference_classifier(tables["cellar"], "cultivar") - 0.02


def test_a_spreadsheet_export_written_by_hand(tmp_path: Path) -> None:
    """Quoted cells with commas, CRLF line ends, NA, #N/A and blank cells, spaces around a
    number, class names Yes/No, an id column: read as a person means them."""
    root = tmp_path / "S"
    rows = SPREADSHEET.split("\r\n")
    for k, part in enumerate((rows[1:5], rows[5:9]), start=1):
        (root / f"agent{k}").mkdir(parents=True)
        (root / f"agent{k}" / "train.csv").write_bytes(
            ("\r\n".join([rows[0], *part]) + "\r\n").encode())
    with pytest.raises(DataProblems, match="column 'Patient ID' looks like an id"):
        inspect_folder(root, label_column="Outcome")
    inspected = inspect_folder(root, label_column="Outcome", drop=("Patient ID",))
    table = inspected.table
    assert table.class_names == ("No", "Yes") and inspected.missing
    assert table.feature_names() == ("Age", "Blood pressure, systolic", "Smoker=No",
                                     "Smoker=Yes", "Region=North, rural", "Region=South")
    config = config_from_values({}, folder=inspected, resolve=False)
    local = load_data_dir(config, inspected.layout, holdout=0.0)
    x = local[0].train.images.numpy()
    assert x[2, 0] == 47.0 and np.isnan(x[1, 1])
    assert np.isnan(local[1].train.images.numpy()[0, 0])
    assert local[0].train.labels.tolist() == [1, 0, 0, 1]  # Yes, No, No, Yes


@pytest.mark.process
def test_the_table_schema_travels_as_a_run_parameter(tables: dict[str, Path],
                                                     tmp_path: Path) -> None:
    from efpsn.wire.records import decode_run_parameters, encode_run_parameters

    config = config_from_values({}, folder=inspect_folder(tables["cellar"],
                                                          label_column="cultivar"))
    back = RunConfig.from_dict(decode_run_parameters(encode_run_parameters(config.to_dict())))
    assert back.table == config.table and back == config
    # `efpsn data schema` writes the same schema a coordinator takes with --table-schema
    out = tmp_path / "table.json"
    proc = efpsn("data", "schema", "--data-dir", str(tables["cellar"]), "--label-column",
                 "cultivar", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert TableSchema.read(str(out)) == config.table
    assert re.search(r"it names the class names that occur in any party's table",
                     proc.stdout)


def test_every_privacy_mode_says_what_was_measured_on_ridge() -> None:
    """No mode's ridge line is left to silence: each has its measured rows (diabetes, the
    tabular attackers) or the reason nothing was measured."""
    from efpsn.privacy.modes import MEASURED, privacy_statement
    from efpsn.topology import build_graph

    for mode, measured in MEASURED.items():
        assert measured.ridge or measured.ridge_note, mode
    config = RunConfig(task="ridge", classes=1, data="local", input_shape="10").resolved()
    line = privacy_statement(config, build_graph("ring", 4)).line()
    assert "worst measured attack ridge: one private sample recovered to a relative error " \
           "of 0.16 (gamma 1000), the mean guess's 1" in line
    assert "the exact model alone gives one private sample away" in line
    assert "logreg" not in line.split("; see ")[0].split("worst measured attack")[1][:40]


def test_a_non_finite_number_is_found_by_the_one_pass(tmp_path: Path) -> None:
    root = cellar(tmp_path / "D")
    path = root / "agent3" / "train.csv"
    lines = path.read_text().splitlines()
    lines[2] = "inf" + lines[2][lines[2].index(","):]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataProblems, match=r"agent3's train.csv, row 2 \(line 3\), column "
                                           r"'alcohol' is not finite \(inf\)"):
        inspect_folder(root, label_column="cultivar")


def test_a_label_column_no_file_has_is_said_for_every_file(tables: dict[str, Path]) -> None:
    with pytest.raises(DataProblems) as refused:
        inspect_folder(tables["cellar"])  # the label column is cultivar, not label
    text = str(refused.value)
    assert text.count("has no column 'label' in its header") == 1  # one line, five files
    assert "agent1's train.csv, agent2's train.csv, agent3's train.csv, agent4's train.csv " \
           "and test.csv has no column 'label'" in text
