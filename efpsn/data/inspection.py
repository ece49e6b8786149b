"""A --data-dir folder inspected once, before anything starts: every file's header, types,
labels and empty cells, and what the folder implies for the run (the agent count, the input shape,
the classes, the scale and, for .csv tables, the table schema every party encodes its rows by:
efpsn/params/table.py). Every problem of every file is said in one message (DataProblems); the
result, a DataFolder, travels as it is to the run's config (efpsn/flags/names.py), the launcher,
the summary and the simulator.

How a .csv column is read, decided over every file of the folder together:
- numbers (empty cells allowed: every party fills them with the network's column mean, which
  the secure column statistics of scale standard give, efpsn/stats/standardise.py);
- a text column with few distinct values (at most CATEGORY_MAX, and not most of its cells'
  values distinct): a category, one-hot over the categories that occur in any file (the named
  disclosure; schema.json's "categories" lists them instead);
- refused by name, with the flag and the schema.json entry that drop it: a text column whose
  values are mostly distinct (an id, free text), a date column, a column empty in every file, a
  number column named like an id whose values are distinct integers.
The label column: class indices (integers from 0), class names (any text; the set of names in
any file, or schema.json's "classes" list), or with --task ridge a number. Numbers that are
not integers, or integers that are mostly distinct, under a classification are refused in one
line naming --task ridge; an empty label is refused by row.

This process is every party's operator on one machine (efpsn up, efpsn simulate): what it reads
goes nowhere but into the public table schema (the sets named above) and the messages here.
"""

from __future__ import annotations

import json
import math
import re
import zipfile
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from efpsn.data.folder_schema import folder_run_values
from efpsn.data.folders import DataDirLayout, inspect_data_dir
from efpsn.data.table_encoding import encode_table
from efpsn.data.tables import (
    DataProblems,
    Problem,
    RawTable,
    is_missing,
    number_of,
    read_raw_table,
)
from efpsn.params.schema import STANDARD, Scale, TaskSpec, parse_shape
from efpsn.params.table import CLASSES_SET, TableColumn, TableSchema

__all__ = ["CATEGORY_MAX", "DataFolder", "check_own_files", "decide_table", "inspect_folder",
           "inspect_tables"]

CATEGORY_MAX = 50  # distinct values a text column may have to be a category
DISTINCT_SHARE = 0.5  # more distinct values than this share of its cells: an id or free text
DISTINCT_FLOOR = 10  # ... when it has more than this many distinct values
DATE_SHARE = 0.8  # of a text column's cells that look like dates: a date column
TARGET_FLOOR = 20  # integer labels with more distinct values than this, and ...
TARGET_SHARE = 0.25  # ... than this share of the rows (under 4 a class): a numeric target
_DATE = re.compile(
    r"\d{4}-\d{1,2}-\d{1,2}([ T]\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?)?"
    r"|\d{1,2}[/.-]\d{1,2}[/.-]\d{2,4}( \d{1,2}:\d{2}(:\d{2})?)?"
    r"|\d{1,2} [A-Za-z]{3,9}\.? \d{4}|[A-Za-z]{3,9}\.? \d{1,2},? \d{4}")
_ID_NAME = re.compile(r"(?i)(id|.*[ _.-]id|.*[a-z]ID|index|row|rowid|key|no\.?|#|unnamed: ?\d+)")


@dataclass(frozen=True, eq=False)
class DataFolder:
    """A folder after its one inspection: its layout, the .csv label column, the table schema
    (TableSchema() for .npz files), whether a number cell is empty anywhere, and the RunConfig
    values it implies (data local, agents, input_shape, classes, scale, table)."""

    layout: DataDirLayout
    label_column: str
    table: TableSchema = field(default_factory=TableSchema)
    missing: bool = False
    values: Mapping[str, Any] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return self.layout.root

    @property
    def agents(self) -> int:
        return self.layout.agents

    @property
    def test(self) -> Path | None:
        return self.layout.test

    def file_of(self, name: str) -> Path:
        """agentK's own train file."""
        return self.layout.files[name]


# ----------------------------------------------------------------------------- one column


@dataclass
class _Column:
    """What every file's cells of one column hold, counted."""

    name: str
    numbers: int = 0
    missing: int = 0
    dates: int = 0
    texts: Counter[str] = field(default_factory=Counter)  # cells that are not numbers
    number_texts: Counter[str] = field(default_factory=Counter)  # capped: CATEGORY_MAX + 1
    integers: bool = True
    seen: set[float] | None = None  # distinct numbers, tracked for a name that looks like an id
    repeated: bool = False
    largest: float = -np.inf
    cap: int | None = CATEGORY_MAX + 1  # distinct number texts kept (None: all, the label's)

    def add(self, text: str) -> None:
        value = number_of(text)
        if value is not None:
            self.numbers += 1
            self.integers &= float(value).is_integer()
            self.largest = max(self.largest, value)
            if self.cap is None or len(self.number_texts) < self.cap \
                    or text in self.number_texts:
                self.number_texts[text] += 1
            if self.seen is not None:
                self.repeated |= value in self.seen
                self.seen.add(value)
        elif is_missing(text):
            self.missing += 1
        else:
            self.texts[text] += 1
            self.dates += bool(_DATE.fullmatch(text))

    @property
    def cells(self) -> int:
        return self.numbers + sum(self.texts.values())


def _drop_hint(name: str) -> str:
    shown = name if re.fullmatch(r"[\w.-]+", name) else repr(name)
    return f"drop it: --drop {shown}, or \"drop\": [{json.dumps(name)}] in schema.json"


def _decide_column(c: _Column, listed: tuple[str, ...] | None, where: str
                   ) -> tuple[TableColumn | None, Problem | None, set[str] | None]:
    """(the column, or a problem; the categories learnt from the tables, None if listed or
    numbers)."""
    text_cells = sum(c.texts.values())
    if listed is not None:
        return TableColumn(c.name, listed), None, None
    if c.cells == 0:
        return None, Problem(where, f"has no value in any file; {_drop_hint(c.name)}",
                             column=c.name), None
    if text_cells == 0 or c.numbers >= 0.9 * c.cells:  # numbers (stray texts: by row, later)
        if (c.seen is not None and c.integers and not c.repeated
                and c.numbers > DISTINCT_FLOOR):
            return None, Problem(where, "looks like an id (its name, and a distinct integer in "
                                        f"every row), not a feature; {_drop_hint(c.name)}",
                                 column=c.name), None
        return TableColumn(c.name), None, None
    if c.dates >= DATE_SHARE * text_cells:
        return None, Problem(where, "holds dates, which are not features; "
                                    f"{_drop_hint(c.name)} (or encode what matters of them, "
                                    "e.g. a year column, as numbers)", column=c.name), None
    values = c.texts + c.number_texts
    distinct = len(values)
    named_id = _ID_NAME.fullmatch(c.name) is not None
    if distinct > CATEGORY_MAX or (distinct > DISTINCT_SHARE * c.cells
                                   and distinct > DISTINCT_FLOOR) or (
            named_id and distinct == c.cells > 2):
        spaced = sum(n for t, n in c.texts.items() if " " in t) > 0.5 * text_cells
        kind = "free text" if spaced else "an id"
        why = ("every value distinct" if distinct == c.cells else "most values distinct"
               if distinct > DISTINCT_SHARE * c.cells else
               f"more than {CATEGORY_MAX} distinct values")
        listing = (", or list its categories in schema.json's \"categories\""
                   if why.startswith("more") else "")
        return None, Problem(where, f"looks like {kind} ({why}), not a feature; "
                                    f"{_drop_hint(c.name)}{listing}", column=c.name), None
    categories = set(values)
    return TableColumn(c.name, tuple(sorted(categories))), None, categories


def _decide_label(c: _Column, *, name: str, regression: bool, listed: tuple[str, ...],
                  classes_given: bool, where: str) -> tuple[TableSchema | None, list[Problem]]:
    """The label part of the schema: (label kind, class names) as a partial TableSchema's
    fields, and the problems of the column as a whole."""
    if regression:
        return TableSchema(label_column=name, label="number", columns=(TableColumn("_"),)), []
    if listed:
        return TableSchema(label_column=name, label="names", class_names=listed,
                           columns=(TableColumn("_"),)), []
    if c.texts:
        names = sorted(set(c.texts) | set(c.number_texts))
        if len(names) < 2:
            return None, [Problem(where, "holds only one class name; expected at least two "
                                         "classes", column=name)]
        return TableSchema(label_column=name, label="names", class_names=tuple(names),
                           columns=(TableColumn("_"),), agreed=(CLASSES_SET,)), []
    if c.numbers and not c.integers:
        return None, [Problem(where, "holds numbers that are not integers: a numeric target, "
                                     "which a classification cannot learn; give --task ridge "
                                     "(squared loss, scored by R^2)", column=name)]
    distinct = len(c.number_texts)
    if (not classes_given and distinct > TARGET_FLOOR
            and distinct > TARGET_SHARE * c.numbers):
        return None, [Problem(where, f"holds integers with too many distinct values for "
                                     f"classes (more than {TARGET_FLOOR}, under "
                                     f"{round(1 / TARGET_SHARE)} rows each): a numeric target; "
                                     "give --task ridge (squared loss, scored by R^2), or "
                                     "--classes C to train C classes on it", column=name)]
    if any(float(t) < 0 for t in c.number_texts):
        return None, [Problem(where, "holds negative numbers; expected class indices 0, 1, ... "
                                     "(or class names, or --task ridge for a numeric target)",
                              column=name)]
    return TableSchema(label_column=name, label="index", columns=(TableColumn("_"),)), []


# ----------------------------------------------------------------------------- tables


def _reference(raws: Mapping[str, RawTable]) -> RawTable:
    """The table whose header the schema follows: the first whose columns are the most common
    ones (a file with a column more or fewer than the others is then the odd one out)."""
    counts = Counter(h for raw in raws.values() for h in set(raw.header))
    common = {h for h, n in counts.items() if 2 * n > len(raws)}
    for raw in raws.values():
        if set(raw.header) == common:
            return raw
    return next(iter(raws.values()))


def decide_table(raws: Mapping[str, RawTable], *, label_column: str, drop: Sequence[str],
                 regression: bool, class_names: tuple[str, ...] = (),
                 categories: Mapping[str, tuple[str, ...]] | None = None,
                 classes_given: bool = False
                 ) -> tuple[TableSchema | None, list[Problem], float]:
    """The table schema of these tables (who -> raw table; the first one's header order), from
    what every file's cells hold, the problems of its columns as a whole, and the largest
    number in the label column (-inf: none). With problems the schema is partial (the refused
    columns dropped; an undecided label read as numbers), to look for the cells' problems
    with; None when not even that can be made."""
    where = "every file" if len(raws) > 1 else next(iter(raws))
    first = _reference(raws)
    dropped = set(drop)
    listed = dict(categories or {})
    unknown = sorted(set(listed) - set(first.header))
    problems = [Problem(where, f"schema.json lists categories of {n!r}, a column no file has",
                        column=n) for n in unknown]
    if label_column not in first.header:
        lacking = [who for who, raw in raws.items() if label_column not in raw.header]
        return None, [*problems, *(Problem(
            who, f"has no column {label_column!r} in its header; expected the label column "
                 "named by --label-column (or schema.json's label_column) in every file")
            for who in lacking)], -np.inf
    names = [h for h in first.header if h != label_column and h not in dropped]
    columns = {n: _Column(n, seen=set() if _ID_NAME.fullmatch(n) else None) for n in names}
    label = _Column(label_column, cap=None)
    for raw in raws.values():
        where_at = {h: i for i, h in enumerate(raw.header)}
        picks = [(columns[n], where_at[n]) for n in names if n in where_at]
        at_label = where_at.get(label_column)
        for row in raw.rows:
            for column, at in picks:
                column.add(row[at])
            if at_label is not None:
                label.add(row[at_label])
    decided: list[TableColumn] = []
    agreed: list[str] = []
    for n in names:
        column, problem, learnt = _decide_column(columns[n], listed.get(n), where)
        if problem is not None:
            problems.append(problem)
        if column is not None:
            decided.append(column)
        if learnt is not None:
            agreed.append(n)
    head, label_problems = _decide_label(label, name=label_column, regression=regression,
                                         listed=class_names, classes_given=classes_given,
                                         where=where)
    problems += label_problems
    if not decided:
        return None, [*problems, Problem(where, "has no feature column left (after the "
                                                "dropped ones); expected at least one")], \
            label.largest
    refused = [n for n in names if n not in {c.name for c in decided}]
    if head is None:  # the label's cells are still looked at for what does not need its kind
        head = TableSchema(label_column=label_column, label="number", columns=(TableColumn("_"),))
    return TableSchema(label_column=label_column, label=head.label,
                       class_names=head.class_names, columns=tuple(decided),
                       drop=(*(d for d in drop if d in set(first.header)), *refused),
                       agreed=(*head.agreed, *agreed)), problems, label.largest


@dataclass(frozen=True)
class TableFindings:
    """What one pass over .csv tables found: their table schema (None when there are
    problems), whether a number cell is empty in any, the classes class indices imply (1 +
    the largest, at least 2; None for names or numbers) and every problem."""

    schema: TableSchema | None
    missing: bool
    classes: int | None
    problems: list[Problem]


def inspect_tables(files: Mapping[str, Path], *, label_column: str, drop: Sequence[str] = (),
                   regression: bool = False, class_names: tuple[str, ...] = (),
                   categories: Mapping[str, tuple[str, ...]] | None = None,
                   classes_given: bool = False) -> TableFindings:
    """One pass over .csv tables (who -> path): TableFindings, with every problem of every
    file (header, columns, cells)."""
    problems: list[Problem] = []
    raws: dict[str, RawTable] = {}
    for who, path in files.items():
        try:
            raws[who] = read_raw_table(path, refuse=lambda text, who=who: ValueError(text))
        except ValueError as exc:
            problems.append(Problem(who, str(exc)))
    if not raws:
        return TableFindings(None, False, None, problems)
    schema, found, largest = decide_table(raws, label_column=label_column, drop=drop,
                                 regression=regression, class_names=class_names,
                                 categories=categories, classes_given=classes_given)
    problems += found
    label_decided = not any(p.column == label_column for p in found)
    missing = False
    for who, raw in raws.items():
        if schema is None:
            break
        encoded, cell_problems = encode_table(schema, raw, where=who)
        problems += [p for p in cell_problems if label_decided or p.column != label_column
                     or p.text.startswith("is empty")]
        missing |= encoded is not None and encoded.missing > 0
    classes = (max(2, int(largest) + 1) if schema is not None and schema.label == "index"
               else None)
    return TableFindings(schema if not problems else None, missing, classes, problems)


def _who(name: str, path: Path) -> str:
    return f"{name}'s {path.name}"


def inspect_folder(data_dir: str | Path, *, label_column: str | None = None,
                   drop: Sequence[str] = (), given: Mapping[str, Any] | None = None,
                   before: Callable[[DataDirLayout], None] | None = None) -> DataFolder:
    """The one inspection of a --data-dir folder (the module docstring). `given`: the run
    values the flags give (task, classes, input_shape, scale: they win over the folder's).
    DataProblems holds every problem found; the folder's layout errors (no such folder, a
    skipped agent folder) are one line, first, and then whatever `before(layout)` raises (the
    command's flags the folder contradicts: efpsn.flags.names.check_flags_against_folder)."""
    given = dict(given or {})
    layout = inspect_data_dir(data_dir)
    if before is not None:
        before(layout)
    schema = layout.schema
    column = layout.label_column(label_column)
    task = TaskSpec.of(given.get("task", "logreg"))
    files = {_who(name, path): path for name, path in layout.files.items()}
    if layout.test is not None:
        files[layout.test.name] = layout.test
    values: dict[str, Any] = layout.run_values()
    if layout.format != "csv":
        return _npz_folder(layout, column, given, files, values, task=task)
    found = inspect_tables(
        files, label_column=column, drop=(*schema.drop, *drop), regression=task.regression,
        class_names=schema.class_names, categories=schema.listed_categories(),
        classes_given="classes" in given or schema.classes is not None)
    table, missing, problems = found.schema, found.missing, found.problems
    scale = given.get("scale", schema.scale)
    if missing and scale is not None and not Scale.of(scale).standard:
        where = "--scale" if "scale" in given else f"{layout.root}/schema.json's scale"
        problems.append(Problem("the folder's tables", f"have empty number cells, which every "
                                f"party fills with the network's column mean, given by scale "
                                f"standard only; {where} is {scale}: leave the scale out "
                                "(tables are standardised by default) or fill the cells"))
    shape = (("--input-shape", given["input_shape"]) if "input_shape" in given else
             ("schema.json's input_shape", schema.input_shape) if schema.input_shape else None)
    if table is not None and shape is not None and math.prod(parse_shape(shape[1])) != \
            table.features:
        problems.append(Problem("every file", f"has {table.features} features per sample, "
                                f"but the run's input shape is {shape[1]} "
                                f"({math.prod(parse_shape(shape[1]))} values), from {shape[0]}; "
                                f"expected them to agree: fix {shape[0]}, or leave the input "
                                "shape out and the files give it"))
    if problems:
        raise DataProblems(f"data folder {layout.root}", problems)
    assert table is not None
    values.update({"input_shape": str(table.features), "table": table,
                   "scale": STANDARD if scale is None else scale})
    values["classes"] = (table.classes or given.get("classes") or schema.classes
                         or found.classes)
    return DataFolder(layout=layout, label_column=column, table=table, missing=missing,
                      values=values)


def _npz_folder(layout: DataDirLayout, column: str, given: Mapping[str, Any],
                files: Mapping[str, Path], values: dict[str, Any], *,
                task: TaskSpec) -> DataFolder:
    """A folder of .npz files: the schema from their headers and labels (folder_schema), and
    every file's arrays checked for their kinds (numbers, labels) in one message."""
    classes_given = "classes" in given or layout.schema.classes is not None
    problems = [Problem(who, text) for who, path in files.items()
                for text in _npz_problems(path, regression=task.regression,
                                          classes_given=classes_given)]
    if problems:
        raise DataProblems(f"data folder {layout.root}", problems)
    shape = (("--input-shape", given["input_shape"]) if "input_shape" in given else
             ("schema.json's input_shape", layout.schema.input_shape)
             if layout.schema.input_shape else None)
    values.update(folder_run_values(
        layout.root, layout.files, layout.test, label_column=column,
        input_shape=None if shape is None else (shape[1], shape[0]),
        classes=1 if task.regression else given.get("classes", layout.schema.classes),
        scale=given.get("scale", layout.schema.scale)))
    if task.regression:
        values["classes"] = 1  # one number per sample
    return DataFolder(layout=layout, label_column=column, values=values)


def _npz_x_dtype(path: Path) -> np.dtype[Any]:
    """X's dtype from its .npy header inside the archive, without reading its values."""
    with zipfile.ZipFile(path) as archive, archive.open("X.npy") as member:
        major, _ = np.lib.format.read_magic(member)
        read = (np.lib.format.read_array_header_1_0 if major == 1
                else np.lib.format.read_array_header_2_0)
        _, _, dtype = read(member)
    return np.dtype(dtype)


def _npz_problems(path: Path, *, regression: bool, classes_given: bool = True) -> list[str]:
    """What is wrong with an .npz's arrays as a whole (kinds, label values); its shape is
    folder_schema's, a bad cell the agent's own check's."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            if "X" not in archive.files or "y" not in archive.files:
                return ["has no array X or y; expected arrays X (samples x features) and y"]
            y = np.asarray(archive["y"])
        x_dtype = _npz_x_dtype(path)
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        return [(f"is not a readable .npz with arrays X and y ({type(exc).__name__}); "
                 "expected numeric arrays saved with numpy.savez")]
    out = []
    if x_dtype.kind not in "biuf":
        out.append(f"has X of {x_dtype}; expected numbers")
    if y.dtype.kind in "US":
        out.append("has y of text labels; expected integers 0, 1, ... (class names are "
                   "labels of a .csv table's label column)")
    elif y.dtype.kind not in "biuf":
        out.append(f"has y of {y.dtype}; expected numbers")
    elif y.size and not regression:
        finite = np.isfinite(y)
        distinct = len(np.unique(y[finite]))
        if finite.all() and np.any(y != np.floor(y)):
            out.append("has y of numbers that are not integers: a numeric target, which a "
                       "classification cannot learn; give --task ridge (squared loss, scored "
                       "by R^2)")
        elif (not classes_given and distinct > TARGET_FLOOR
              and distinct > TARGET_SHARE * y.size):
            out.append(f"has y with too many distinct integers for classes (more than "
                       f"{TARGET_FLOOR}, under {round(1 / TARGET_SHARE)} rows each): a numeric "
                       "target; give --task ridge (squared loss, scored by R^2), or --classes "
                       "C to train C classes on it")
    return out


def check_own_files(files: Mapping[str, Path], *, label_column: str | None) -> None:
    """An agent's own files (its data, the public test file) checked for what does not depend
    on the run's parameters, before it makes a port or a key: each readable, a .csv's header
    (and the label column, when named), ragged rows, empty labels; an .npz's arrays and kinds.
    DataProblems with every problem of every file; the cells are checked against the run's
    schema once its parameters come (agent/prepare.py)."""
    problems: list[Problem] = []
    for who, path in files.items():
        if path.is_dir() or path.suffix.lower() not in (".csv", ".npz"):
            continue  # an IDX folder, or a format the agent's load names
        if not path.is_file():
            problems.append(Problem(who, "is no such file; expected an .npz, a .csv or a "
                                         "folder of IDX files"))
            continue
        if path.suffix.lower() == ".npz":
            problems += [Problem(who, text) for text in _npz_problems(path, regression=True)]
            continue
        try:
            raw = read_raw_table(path, refuse=ValueError)
        except ValueError as exc:
            problems.append(Problem(who, str(exc)))
            continue
        column = label_column or ("label" if "label" in raw.header else None)
        if label_column is not None and label_column not in raw.header:
            problems.append(Problem(who, f"has no column {label_column!r} in its header; "
                                         "expected the label column named by --label-column"))
            column = None
        if raw.ragged:
            first, line, fields = raw.ragged[0]
            problems.append(Problem(who, f"is ragged: row {first + 1} (line {line}) has "
                                         f"{fields} fields where the header has "
                                         f"{len(raw.header)}; expected every row to have one "
                                         "value per column"))
        if column is not None:
            empty = [r for r, t in enumerate(raw.column(column)) if is_missing(t)]
            if empty:
                problems.append(Problem(who, "is empty; expected a label in every row: a row "
                                             "without one can be neither learnt from nor scored "
                                             "(fill it, or remove the row)", column=column,
                                        rows=raw.rows_text(empty)))
    if problems:
        raise DataProblems("the agent's own data", problems)
