"""Naming the cells of a user's data (X[3, 2]; a .csv's row, line and column), reading .csv tables
as their text cells, and the problems found in them, said all at once."""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["MISSING", "ArrayCells", "Cells", "CsvCells", "DataProblems", "Problem", "RawTable",
           "Refuse", "first_index", "is_missing", "number_of", "read_raw_table", "rows_text"]

Refuse = Callable[[str], Exception]  # builds the one-line error for a problem with the file

# The texts a cell holds when its value is missing (spreadsheets, R and pandas write these);
# compared after stripping spaces, upper and lower case alike.
MISSING = ("", "na", "n/a", "#n/a", "nan", "null", "<na>")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(inf|infinity)", re.IGNORECASE)
ROWS_SHOWN = 3  # rows a problem names before "and more"


def is_missing(text: str) -> bool:
    """Whether a cell's text means "no value" (MISSING)."""
    return text.strip().lower() in MISSING


def number_of(text: str) -> float | None:
    """The cell's number (a decimal, scientific notation or inf), or None when it is not one
    (a missing cell is not a number either)."""
    body = text.strip()
    if not _NUMBER.fullmatch(body):
        return None
    return float(body)


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
    the file it ends on, and the column's name (a one-hot feature: column=category)."""

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


@dataclass(frozen=True, eq=False)
class RawTable:
    """A .csv as read: the header's column names, every data row's cells (stripped text; blank
    lines skipped) and the line each ends on; `ragged`: the rows (0-based, left out of `rows`)
    whose field count is not the header's, as (row, line, fields)."""

    header: tuple[str, ...]
    rows: list[list[str]]
    lines: tuple[int, ...]
    ragged: tuple[tuple[int, int, int], ...] = ()
    numbers: tuple[int, ...] = ()  # each row's place among all data rows (ragged ones too)

    def column(self, name: str) -> list[str]:
        at = self.header.index(name)
        return [row[at] for row in self.rows]

    def rows_text(self, rows: Sequence[int]) -> str:
        """rows_text for rows of `rows`, numbered as the file's data rows."""
        numbers = self.numbers or tuple(range(len(self.rows)))
        return rows_text([numbers[r] for r in rows], dict(zip(numbers, self.lines, strict=True)))


def read_raw_table(path: Path, *, refuse: Refuse) -> RawTable:
    """The text cells of a .csv with a header row. refuse(message) for a file that cannot be
    read as one (missing, binary, empty, no header, a column named twice); a ragged row is
    kept aside (RawTable.ragged), for the caller to report with the file's other problems."""
    try:
        with open(path, newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if not header or not any(h.strip() for h in header):
                raise refuse("is empty; expected a header row, then one row per sample")
            names = tuple(h.strip() for h in header)
            twice = sorted({h for h in names if names.count(h) > 1})
            if twice:
                raise refuse(f"names the column {', '.join(map(repr, twice))} twice in its "
                             "header; expected every column named once")
            if "" in names:
                raise refuse(f"has a column without a name (column {names.index('') + 1} of "
                             "the header); expected every column named")
            rows: list[list[str]] = []
            lines: list[int] = []
            numbers: list[int] = []
            ragged: list[tuple[int, int, int]] = []
            for row in reader:
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if len(row) != len(names):
                    ragged.append((len(rows) + len(ragged), reader.line_num, len(row)))
                    continue
                numbers.append(len(rows) + len(ragged))
                rows.append([cell.strip() for cell in row])
                lines.append(reader.line_num)
    except UnicodeDecodeError:
        raise refuse("is not a text .csv file; expected a .csv with a header row") from None
    except csv.Error as exc:
        raise refuse(f"is not a readable .csv ({exc}); expected comma-separated values") from None
    except OSError as exc:
        raise refuse(f"cannot be read ({exc.strerror}); expected a readable file") from None
    return RawTable(header=names, rows=rows, lines=tuple(lines), ragged=tuple(ragged),
                    numbers=tuple(numbers))


def rows_text(rows: Sequence[int], lines: Sequence[int] | Mapping[int, int]) -> str:
    """"row 4 (line 5)" or "rows 4, 9, 12 (lines 5, 10, 13)" for 0-based data rows (`lines`:
    each row's line in the file), at most ROWS_SHOWN of them and then "and more"."""
    shown = [r + 1 for r in rows[:ROWS_SHOWN]]
    at = [lines[r] for r in rows[:ROWS_SHOWN]]
    more = " and more" if len(rows) > ROWS_SHOWN else ""
    if len(shown) == 1 and not more:
        return f"row {shown[0]} (line {at[0]})"
    return (f"rows {', '.join(map(str, shown))}{more} (line{'s' if len(at) > 1 else ''} "
            f"{', '.join(map(str, at))})")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the data: where (a file as its user knows it, or "every file"), the
    rows and column when they can be named, what is wrong and what to do."""

    where: str
    text: str
    column: str | None = None
    rows: str = ""  # rows_text's words, or ""

    def __str__(self) -> str:
        """"agent2's train.csv, row 4 (line 5), column 'x' is not a number; ..." (the text
        starts with its verb)."""
        at = ", ".join(p for p in (self.where, self.rows,
                                   None if self.column is None else f"column {self.column!r}")
                       if p)
        return f"{at} {self.text}" if at else self.text


class DataProblems(ValueError):
    """Every problem found in one pass over the data, in one message: one line for one
    problem, else a line saying how many, then one line each."""

    def __init__(self, subject: str, problems: Sequence[Problem]) -> None:
        self.problems = _merged(problems)
        if len(self.problems) == 1:
            message = f"{subject}: {self.problems[0]}"
        else:
            message = (f"{subject}: {len(self.problems)} problems; fix them all and run again:\n"
                       + "\n".join(f"  {p}" for p in self.problems))
        super().__init__(message)


def _merged(problems: Sequence[Problem]) -> tuple[Problem, ...]:
    """The same problem of a whole file in several files said once, naming them all."""
    groups: dict[tuple[str, str | None], list[Problem]] = {}
    out: list[Problem | tuple[str, str | None]] = []
    for p in problems:
        if p.rows or not p.where:
            out.append(p)
            continue
        key = (p.text, p.column)
        if key not in groups:
            groups[key] = []
            out.append(key)
        groups[key].append(p)
    merged = []
    for item in out:
        if isinstance(item, Problem):
            merged.append(item)
            continue
        wheres = [p.where for p in groups[item]]
        where = wheres[0] if len(wheres) == 1 else ", ".join(wheres[:-1]) + " and " + wheres[-1]
        merged.append(Problem(where, item[0], column=item[1]))
    return tuple(merged)


def first_index(mask: np.ndarray) -> tuple[int, int]:
    """(row, flat column) of the first True of a (rows x ...) mask, in row-major order."""
    flat = int(np.argmax(mask.reshape(-1)))
    columns = math.prod(mask.shape[1:])
    return divmod(flat, columns) if columns else (flat, 0)
