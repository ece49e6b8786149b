"""A .csv table's rows as features and labels, by the run's public table schema (efpsn/params/
table.py): number columns as they are (an empty cell NaN, filled later with the network's column
mean: efpsn/stats/standardise.py), category columns one-hot over the agreed categories (an empty
cell all zeros), the label column as class indices, class names or numbers. Every problem of the
file is found in one pass and returned, each naming its rows and column, never a cell's value."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from efpsn.data.tables import CsvCells, Problem, RawTable, is_missing, number_of, rows_text
from efpsn.params.table import TableColumn, TableSchema

__all__ = ["NO_TABLE_HINT", "EncodedTable", "encode_table", "plain_schema", "raw_table_of"]

NO_TABLE_HINT = ("the run has no table schema, which text columns and class names need (a "
                 "--data-dir folder makes one; on separate hosts `efpsn data schema` writes one "
                 "for the coordinator's --table-schema)")


@dataclass(frozen=True, eq=False)
class EncodedTable:
    """The encoded rows: features (n, d) float64 with NaN in the empty number cells, labels
    (int64 class indices, or float64: class indices still to check, or a numeric target),
    how to name the cells, and how many number cells were empty (the agent's own log only)."""

    features: np.ndarray
    labels: np.ndarray
    cells: CsvCells
    missing: int


def plain_schema(raw: RawTable, *, label_column: str, regression: bool = False) -> TableSchema:
    """The schema of a table of numbers read as it is (a run without a table schema): every
    column but the label a number, labels class indices (a number for ridge)."""
    columns = tuple(TableColumn(h) for h in raw.header if h != label_column)
    if not columns:
        raise ValueError("has no feature column, only the label column; expected the features "
                         "and the label in every row")
    return TableSchema(label_column=label_column, label="number" if regression else "index",
                       columns=columns)


def _header_problems(schema: TableSchema, raw: RawTable, where: str, *,
                     plain: bool, labels: bool = True) -> list[Problem]:
    header = set(raw.header)
    problems = []
    labelled = schema.label_column in header or not labels
    if not labelled:
        problems.append(Problem(where, f"has no column {schema.label_column!r} in its header; "
                                       "expected the label column named by --label-column (or "
                                       "schema.json's label_column) in every file"))
    fix = f" (fix {where})" if where else ""
    missing = [c.name for c in schema.columns if c.name not in header]
    if missing and not plain:
        problems.append(Problem(where, f"has no column{'s' if len(missing) > 1 else ''} "
                                       f"{', '.join(map(repr, missing))}, which the run's table "
                                       "schema (the other files) has; expected the same columns "
                                       f"in every file{fix}"))
    known = {schema.label_column, *(c.name for c in schema.columns), *schema.drop}
    extra = [h for h in raw.header if h not in known]
    if extra and not plain and labelled:  # without the label column: likely it, renamed
        problems.append(Problem(where, f"has column{'s' if len(extra) > 1 else ''} "
                                       f"{', '.join(map(repr, extra))}, which the run's table "
                                       "schema (the other files) neither uses nor drops; "
                                       f"expected the same columns in every file{fix}, or drop "
                                       "them (--drop, or schema.json's \"drop\")"))
    return problems


def _number_column(cells: list[str], column: TableColumn, raw: RawTable, where: str, *,
                   plain: bool, out: np.ndarray, problems: list[Problem]) -> int:
    """Fill `out` (n,) with the column's numbers (NaN where empty); returns the empty count."""
    bad, infinite = [], []
    for r, text in enumerate(cells):
        value = number_of(text)
        if value is not None:
            out[r] = value
            if not math.isfinite(value):
                infinite.append(r)
        elif is_missing(text):
            out[r] = np.nan
        else:
            bad.append(r)
    if infinite:
        problems.append(Problem(where, "is not finite (inf); expected finite numbers (or an "
                                       "empty cell, for a missing value)", column=column.name,
                                rows=raw.rows_text(infinite)))
    if bad:
        hint = (f"expected numeric features: {NO_TABLE_HINT}" if plain else
                "expected a number or an empty cell (the run's table schema says the column "
                "holds numbers)")
        problems.append(Problem(where, f"is not a number; {hint}", column=column.name,
                                rows=raw.rows_text(bad)))
    return int(np.isnan(out).sum())


def _category_column(cells: list[str], column: TableColumn, raw: RawTable, where: str, *,
                     out: np.ndarray, problems: list[Problem]) -> None:
    """Fill `out` (n, k) with the one-hot encoding (all zeros where empty)."""
    at = {c: k for k, c in enumerate(column.categories)}
    bad = []
    for r, text in enumerate(cells):
        k = at.get(text)
        if k is not None:
            out[r, k] = 1.0
        elif not is_missing(text):
            bad.append(r)
    if bad:
        problems.append(Problem(where, "holds a category that is not one of the run's ("
                                + ", ".join(column.categories) + "); expected one of them or "
                                "an empty cell (list every category in schema.json's "
                                "\"categories\")", column=column.name,
                                rows=raw.rows_text(bad)))


def _labels(cells: list[str], schema: TableSchema, raw: RawTable, where: str, *,
            plain: bool, problems: list[Problem]) -> np.ndarray:
    empty = [r for r, t in enumerate(cells) if is_missing(t)]
    if empty:
        problems.append(Problem(where, "is empty; expected a label in every row: a row "
                                       "without one can be neither learnt from nor scored (fill "
                                       "it, or remove the row)", column=schema.label_column,
                                rows=raw.rows_text(empty)))
    if schema.label == "names":
        at = {c: k for k, c in enumerate(schema.class_names)}
        names = np.array([at.get(t, -1) for t in cells], dtype=np.int64)
        unknown = [r for r, t in enumerate(cells) if t not in at and not is_missing(t)]
        if unknown:
            problems.append(Problem(where, "holds a class name that is not one of the run's ("
                                    + ", ".join(schema.class_names) + "); expected one of "
                                    "them (list every class in schema.json's \"classes\")",
                                    column=schema.label_column,
                                    rows=raw.rows_text(unknown)))
        return names
    values = np.array([number_of(t) if number_of(t) is not None else np.nan for t in cells],
                      dtype=np.float64)
    text = [r for r, t in enumerate(cells) if number_of(t) is None and not is_missing(t)]
    if text:
        what = ("expected a number (the numeric target of task ridge)"
                if schema.label == "number" else
                f"expected class indices 0, 1, ...: {NO_TABLE_HINT}" if plain
                else "expected class indices 0, 1, ... (the run's table schema says so)")
        problems.append(Problem(where, f"is not a number; {what}", column=schema.label_column,
                                rows=raw.rows_text(text)))
    return values


def raw_table_of(columns: Mapping[str, Sequence[Any]]) -> RawTable:
    """Rows given by column (a dict of lists, or a pandas DataFrame) as a RawTable: each cell's
    text, None and NaN empty."""
    names = [str(c) for c in columns]
    values = [list(columns[c]) for c in columns]
    if len({len(v) for v in values}) > 1:
        raise ValueError("every column must hold as many rows as the others")

    def text(cell: Any) -> str:
        if cell is None or (isinstance(cell, float) and math.isnan(cell)):
            return ""
        return str(cell).strip()

    rows = [[text(v[r]) for v in values] for r in range(len(values[0]) if values else 0)]
    return RawTable(header=tuple(names), rows=rows, lines=tuple(range(2, len(rows) + 2)))


def encode_table(schema: TableSchema, raw: RawTable, *, where: str, plain: bool = False,
                 labels: bool = True) -> tuple[EncodedTable | None, list[Problem]]:
    """The table's rows encoded by `schema`, and every problem found (None when there are
    any). `plain`: the schema is plain_schema's (no run table schema: hints say so).
    `labels` False: rows to predict, the label column not needed (ignored if there; the
    labels come back empty)."""
    problems = _header_problems(schema, raw, where, plain=plain, labels=labels)
    if raw.ragged:
        first, line, fields = raw.ragged[0]
        others = rows_text([r for r, _, _ in raw.ragged[1:]], {r: n for r, n, _ in raw.ragged})
        more = f" (and {others} too)" if len(raw.ragged) > 1 else ""
        problems.append(Problem(where, f"is ragged: row {first + 1} (line {line}) has {fields} "
                                       f"fields where the header has {len(raw.header)}{more}; "
                                       "expected every row to have one value per column"))
    if problems:  # the columns themselves do not fit: no cell to look at yet
        return None, problems
    n = len(raw.rows)
    if n == 0:
        return None, [Problem(where, "holds no samples (a header and no rows); expected at "
                                     "least one row")]
    blocks: list[np.ndarray] = []
    missing = 0
    for column in schema.columns:
        cells = raw.column(column.name)
        if column.categories:
            block = np.zeros((n, len(column.categories)), dtype=np.float64)
            _category_column(cells, column, raw, where, out=block, problems=problems)
        else:
            block = np.empty((n, 1), dtype=np.float64)
            missing += _number_column(cells, column, raw, where, plain=plain, out=block[:, 0],
                                      problems=problems)
        blocks.append(block)
    labels_of = (_labels(raw.column(schema.label_column), schema, raw, where, plain=plain,
                         problems=problems) if labels else np.zeros(0))
    if problems:
        return None, problems
    features = np.concatenate(blocks, axis=1)
    cells_named = CsvCells(raw.lines, schema.feature_names(), schema.label_column)
    return EncodedTable(features=features, labels=labels_of, cells=cells_named,
                        missing=missing), []
