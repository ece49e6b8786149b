"""The schema a data folder's own files imply when schema.json does not give it: the features per
sample from each file's header (a .csv's header row, an .npz's X array header, never a value)
and the class count from the labels' largest value. The files must agree; a file that does not
is named in one line, with the fix that is right for it."""

from __future__ import annotations

import csv
import math
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from efpsn.params.schema import STANDARD, parse_shape

__all__ = ["FileShape", "file_classes", "file_shape", "folder_run_values"]


@dataclass(frozen=True)
class FileShape:
    """One file's per-sample shape, read from its header; a .csv's feature column names."""

    who: str  # "agent3's train.csv" or "test.csv"
    shape: tuple[int, ...]
    columns: tuple[str, ...] | None = None

    @property
    def features(self) -> int:
        return math.prod(self.shape)


def _csv_header(path: Path, who: str, label_column: str) -> list[str]:
    try:
        with open(path, newline="") as fh:
            header = next(csv.reader(fh), None)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{who} ({path}) cannot be read as a text .csv ({exc}); expected a "
                         ".csv with a header row") from None
    header = [h.strip() for h in header or []]
    if label_column not in header:
        raise ValueError(f"{who} ({path}) has no column {label_column!r} in its header; expected "
                         "the label column named by --label-column (or schema.json's "
                         "label_column) in every file")
    return header


def _npz_x_shape(path: Path, who: str) -> tuple[int, ...]:
    """X's shape from its .npy header inside the archive, without reading its values."""
    try:
        with zipfile.ZipFile(path) as archive, archive.open("X.npy") as member:
            major, _ = np.lib.format.read_magic(member)
            read = (np.lib.format.read_array_header_1_0 if major == 1
                    else np.lib.format.read_array_header_2_0)
            shape, _, _ = read(member)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise ValueError(f"{who} ({path}) is not an .npz with an array X ({type(exc).__name__}); "
                         "expected numeric arrays X and y saved with numpy.savez") from None
    return tuple(int(d) for d in shape)


def file_shape(path: Path, *, who: str, label_column: str) -> FileShape:
    """The per-sample shape of a train or test file (.csv or .npz), from its header only."""
    if path.suffix == ".csv":
        header = _csv_header(path, who, label_column)
        columns = tuple(h for h in header if h != label_column)
        return FileShape(who, (len(columns),), columns)
    shape = _npz_x_shape(path, who)
    return FileShape(who, shape[1:] or (1,))


def file_classes(path: Path, *, label_column: str) -> int | None:
    """1 + the file's largest label; None when its labels are not all integers >= 0 (the
    agent's own load then refuses them, naming the cell)."""
    try:
        if path.suffix == ".csv":
            with open(path, newline="") as fh:
                rows = csv.reader(fh)
                at = [h.strip() for h in next(rows)].index(label_column)
                labels = np.asarray([float(row[at]) for row in rows if row], dtype=np.float64)
        else:
            with np.load(path, allow_pickle=False) as archive:
                labels = np.asarray(archive["y"], dtype=np.float64)
    except (OSError, ValueError, IndexError, KeyError, TypeError, StopIteration,
            zipfile.BadZipFile):
        return None
    if not labels.size or not np.all(np.isfinite(labels)) or np.any(labels < 0) or np.any(
            labels != np.floor(labels)):
        return None
    return int(labels.max()) + 1


def _names(shapes: list[FileShape]) -> str:
    names = [s.who for s in shapes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _check_agreement(root: Path, shapes: list[FileShape]) -> FileShape:
    """The files' common shape (the first file's); ValueError naming the odd ones out."""
    groups: dict[int, list[FileShape]] = {}
    for s in shapes:
        groups.setdefault(s.features, []).append(s)
    if len(groups) > 1:  # the largest group is right (on a tie: the one with agent1)
        common = max(groups, key=lambda k: (len(groups[k]), shapes[0] in groups[k]))
        odd = [s for s in shapes if s.features != common]
        found = "; ".join(f"{s.who} has {s.features}" for s in odd)
        raise ValueError(f"data folder {root}: the files disagree on the features per sample: "
                         f"{found}, where {_names(groups[common])} "
                         f"{'has' if len(groups[common]) == 1 else 'have'} {common}; expected "
                         f"the same in every file (fix {_names(odd)})")
    first = shapes[0]
    for s in shapes[1:]:
        if first.columns is not None and s.columns is not None and s.columns != first.columns:
            at = next(j for j, (a, b) in enumerate(zip(first.columns, s.columns)) if a != b)
            raise ValueError(f"data folder {root}: {s.who} names its feature columns "
                             f"differently from {first.who}: column {at + 1} is "
                             f"{s.columns[at]!r} where {first.who} has {first.columns[at]!r}; "
                             "expected the same columns in the same order in every file")
    same = all(s.shape == first.shape for s in shapes)
    return first if same else FileShape(first.who, (first.features,))


def folder_run_values(root: Path, files: Mapping[str, Path], test: Path | None, *,
                      label_column: str, input_shape: tuple[str, str] | None = None,
                      classes: int | None = None, scale: str | None = None,
                      ) -> dict[str, object]:
    """The input_shape, classes and scale a folder's files imply (agent name -> train file,
    and the public test file), for what the run does not give. `input_shape`: (shape, where it
    came from) when the run gives one; the files must then have as many features per sample.
    Classes: 1 + the largest label of any file (at least 2), read only when not given. Scale,
    when neither schema.json nor a flag gives one (`scale` None): "standard" for tables (one
    feature vector per row: .csv files, .npz with a 2-D X), whose columns come in any units
    (efpsn/stats/standardise.py); images (IDX, .npz with X of shape (n, C, H, W)) keep RunConfig's
    default."""
    shapes = [file_shape(path, who=f"{name}'s {path.name}", label_column=label_column)
              for name, path in files.items()]
    if test is not None:
        shapes.append(file_shape(test, who=test.name, label_column=label_column))
    common = _check_agreement(root, shapes)
    out: dict[str, object] = {}
    if input_shape is None:
        out["input_shape"] = "x".join(map(str, common.shape))
    elif math.prod(parse_shape(input_shape[0])) != common.features:
        shape, source = input_shape
        raise ValueError(f"data folder {root}: every file has {common.features} features per "
                         f"sample, but the run's input shape is {shape} "
                         f"({math.prod(parse_shape(shape))} values), from {source}; expected "
                         f"them to agree: fix {source}, or leave the input shape out and the "
                         "files give it")
    if scale is None and len(common.shape) == 1:
        out["scale"] = STANDARD
    if classes is None:
        found = [c for c in (file_classes(p, label_column=label_column)
                             for p in [*files.values(), *([test] if test else [])])
                 if c is not None]
        out["classes"] = max([2, *found])
    return out
