"""Naming the cells of a user's data (X[3, 2]; a .csv's row, line and column) and reading .csv tables."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["ArrayCells", "Cells", "CsvCells", "Refuse", "first_index", "label_encoding_hint",
           "read_csv_table"]

Refuse = Callable[[str], Exception]  # builds the one-line error for a problem with the file


def label_encoding_hint(classes: int | None) -> str:
    """How to encode class names as labels: the sentence every text-label error ends with."""
    span = "0, 1, ..., classes - 1" if classes is None else (
        f"0..{classes - 1}" if classes > 2 else "0 and 1")
    return (f"expected integer labels {span}: encode each class as one integer, the same "
            "mapping at every agent (e.g. 'no' -> 0, 'yes' -> 1)")


@dataclass(frozen=True)
class ArrayCells:
    """Cells of arrays X (samples x any shape) and y, named by their numpy indices."""

    sample_shape: tuple[int, ...]

    def feature(self, row: int, column: int) -> str:
        """X's cell of sample `row` at the flat feature index `column`."""
        index = np.unravel_index(column, self.sample_shape) if self.sample_shape else ()
        return "X[" + ", ".join(str(int(i)) for i in (row, *index)) + "]"

    def label(self, row: int) -> str:
        return f"y[{row}]"

    def column(self, column: int) -> str:
        """X's feature at the flat index `column`, in every sample."""
        index = np.unravel_index(column, self.sample_shape) if self.sample_shape else ()
        return "X[:, " + ", ".join(str(int(i)) for i in index) + "]"


@dataclass(frozen=True)
class CsvCells:
    """Cells of a .csv table, named by data row (1 = the first after the header), the line of
    the file it ends on, and the column's name in the header."""

    lines: tuple[int, ...]
    features: tuple[str, ...]
    label_column: str

    def feature(self, row: int, column: int) -> str:
        return self._cell(row, self.features[column])

    def label(self, row: int) -> str:
        return self._cell(row, self.label_column)

    def column(self, column: int) -> str:
        return f"column {self.features[column]!r}"

    def _cell(self, row: int, column: str) -> str:
        return f"row {row + 1} (line {self.lines[row]}), column {column!r}"


Cells = ArrayCells | CsvCells


def _not_a_number(cell: str, where: str, *, is_label: bool, classes: int | None) -> str:
    what = "is empty" if not cell.strip() else "is not a number"
    if is_label:
        return f"{where} {what}: labels must be numbers; " + label_encoding_hint(classes)
    return (f"{where} {what}; expected numeric features (encode a category as numbers, e.g. "
            "one 0/1 column per category)")


def read_csv_table(path: Path, *, label_column: str, refuse: Refuse,
                   classes: int | None = None) -> tuple[np.ndarray, np.ndarray, CsvCells]:
    """(X, y, cells) of a .csv with a header row: X float64 (rows x feature columns), y
    float64 (the label column), blank lines skipped. A cell that is not a number, a ragged
    row or a missing label column raises refuse(message), naming the row and column."""
    try:
        with open(path, newline="") as fh:
            rows = csv.reader(fh)
            header = next(rows, None)
            if not header:
                raise refuse("is empty; expected a header row, then one row per sample with "
                              f"numeric features and a {label_column!r} column")
            header = [h.strip() for h in header]
            if label_column not in header:
                raise refuse(f"has no column {label_column!r} in its header; expected the "
                              "label column named by --label-column (or schema.json)")
            label_at = header.index(label_column)
            features = tuple(h for j, h in enumerate(header) if j != label_at)
            values: list[list[float]] = []
            lines: list[int] = []
            for row in rows:
                if not row:
                    continue
                lines.append(rows.line_num)
                if len(row) != len(header):
                    raise refuse(f"is ragged: row {len(lines)} (line {rows.line_num}) has "
                                  f"{len(row)} fields where the header has {len(header)}; "
                                  "expected every row to have one value per column")
                values.append(_parse_row(row, label_at=label_at, lines=lines,
                                         features=features, label_column=label_column,
                                         refuse=refuse, classes=classes))
    except UnicodeDecodeError:
        raise refuse("is not a text .csv file; expected a .csv with a header row") from None
    except OSError as exc:
        raise refuse(f"cannot be read ({exc.strerror}); expected a readable file") from None
    table = np.asarray(values, dtype=np.float64).reshape(len(values), len(header))
    cells = CsvCells(tuple(lines), features, label_column)
    return np.delete(table, label_at, axis=1), table[:, label_at], cells


def _parse_row(row: list[str], *, label_at: int, lines: list[int], features: tuple[str, ...],
               label_column: str, refuse: Refuse, classes: int | None) -> list[float]:
    parsed = []
    for j, text in enumerate(row):
        try:
            parsed.append(float(text))
        except ValueError:
            cells = CsvCells(tuple(lines), features, label_column)
            is_label = j == label_at
            at = len(lines) - 1
            where = cells.label(at) if is_label else cells.feature(at, j - (j > label_at))
            raise refuse(_not_a_number(text, where, is_label=is_label,
                                       classes=classes)) from None
    return parsed


def first_index(mask: np.ndarray) -> tuple[int, int]:
    """(row, flat column) of the first True of a (rows x ...) mask, in row-major order."""
    flat = int(np.argmax(mask.reshape(-1)))
    columns = math.prod(mask.shape[1:])
    return divmod(flat, columns) if columns else (flat, 0)
