"""One agent's own data files (.npz, .csv, IDX folder), checked against the run's public schema.

Every error is one line naming the agent, the file and what was expected, and where a single
cell is at fault, its place (X[3, 2], or a .csv's row, line and column). These errors go to
the agent's own operator only (its terminal and log); the coordinator and the other agents
learn the category "its local data cannot be used". Messages never state the data's sample
count, a cell's value or any statistic of the data.
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from efpsn.data.images import Dataset, _find_idx_file, read_idx
from efpsn.data.table_encoding import encode_table, plain_schema
from efpsn.data.tables import (
    ArrayCells,
    Cells,
    DataProblems,
    Refuse,
    first_index,
    read_raw_table,
)
from efpsn.params.table import TableSchema

__all__ = [
    "AUTO_HOLDOUT",
    "HEADROOM",
    "DataError",
    "LocalData",
    "RawData",
    "check_arrays",
    "check_second_moment",
    "data_file_in",
    "feature_limit",
    "load_local_data",
    "read_data",
    "read_data_file",
    "resolve_holdout",
    "second_moment",
    "split_holdout",
    "text_label_hint",
]

# The factor of float64's range kept free above features x value^2 (see feature_limit).
HEADROOM = 2.0**32
AUTO_HOLDOUT = 0.2  # --holdout auto without a public test set: the agent scores itself

EXPECTED_FORMATS = ("an .npz with arrays X and y, a .csv with a header row, or a folder of "
                    "IDX files")


class DataError(ValueError):
    """An agent's data file cannot be used; the message is one line for its user."""


@dataclass(frozen=True, eq=False)
class LocalData:
    """An agent's training part, its local held-out part and the optional public test set;
    `missing`: how many number cells of its own file were empty (NaN until they are filled
    with the network's column means; told to nobody but the agent's own log)."""

    train: Dataset
    holdout: Dataset | None
    test: Dataset | None
    missing: int = 0


@dataclass(frozen=True, eq=False)
class RawData:
    """A file's arrays as read (only the format checked) and how to name their cells; a .csv
    table's empty number cells are NaN (`missing` of them)."""

    features: np.ndarray
    labels: np.ndarray
    cells: Cells
    missing: int = 0


def text_label_hint(classes: int | None) -> str:
    """How to give text labels: the sentence an .npz's text-label error ends with."""
    span = "0, 1, ..., classes - 1" if classes is None else (
        f"0..{classes - 1}" if classes > 2 else "0 and 1")
    return (f"expected integer labels {span} in an .npz (a .csv table's label column may hold "
            "class names)")


def _fail(who: str, path: Path, problem: str) -> DataError:
    return DataError(f"{who}: {path}: {problem}")


def feature_limit(features: int) -> float:
    """The largest |feature| (after the public scale divisor) a model's float64 arithmetic is
    trusted with, for samples of `features` values.

    A logit sums `features` products of a feature and a parameter, and one gradient step moves
    a parameter by about (learning rate) x (residual, in [-1, 1]) x (a feature): from the
    second step on, the logits and the l2 term ||x||^2 are of the order of features x value^2.
    A value is refused when features x value^2 x HEADROOM would exceed the largest float64
    (HEADROOM = 2^32, room for learning rates above 1 and sums over a batch): about 7e147 for
    784 features. Values far below this can still overflow a deep model (every layer
    multiplies again); no sensible data comes near it."""
    if features < 1:
        raise ValueError(f"features must be >= 1, got {features}")
    return math.sqrt(float(np.finfo(np.float64).max) / (features * HEADROOM))


def _read_npz(path: Path, who: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise _fail(who, path, f"cannot be read ({exc.strerror}); expected a readable "
                               "file") from None
    if magic != b"PK\x03\x04":
        raise _fail(who, path, "is not an .npz (zip) archive; expected numeric arrays X and y "
                               "saved with numpy.savez")
    try:
        with np.load(path, allow_pickle=False) as archive:
            names = set(archive.files)
            missing = [k for k in ("X", "y") if k not in names]
            if missing:
                raise _fail(who, path, f"has no array {' or '.join(missing)}; expected arrays X "
                                       "(samples x features) and y (integer labels)")
            return archive["X"], archive["y"]
    except DataError:
        raise
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise _fail(who, path, "holds pickled object arrays; expected numeric arrays X "
                                   "and y (numpy.savez)") from None
        raise _fail(who, path, f"is not a readable .npz archive ({exc}); expected numeric "
                               "arrays X and y (numpy.savez)") from None
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        raise _fail(who, path, f"is not a readable .npz archive ({type(exc).__name__}); "
                               "expected numeric arrays X and y (numpy.savez)") from None


def _read_idx_folder(path: Path, who: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        images = read_idx(_find_idx_file(path, "train", "images"))
        labels = read_idx(_find_idx_file(path, "train", "labels"))
    except (OSError, ValueError) as exc:
        raise _fail(who, path, f"is not a usable data folder ({str(exc).split(':')[0]}); "
                               "expected a train.csv, train.npz, test.csv or test.npz in it, "
                               "or the IDX files train-images-idx3-ubyte and "
                               "train-labels-idx1-ubyte (optionally .gz)") from None
    return images, labels


def data_file_in(folder: Path, who: str) -> Path | None:
    """The one data file of a data folder's agent folder (train.npz or train.csv) or of the
    folder itself (its public test.npz or test.csv); None when it holds none of them."""
    found = [folder / f"{stem}.{ext}" for stem in ("train", "test") for ext in ("npz", "csv")
             if (folder / f"{stem}.{ext}").is_file()]
    if len(found) > 1:
        raise _fail(who, folder, f"holds {' and '.join(p.name for p in found)}; expected one "
                                 "data file in the folder (or give the file itself)")
    return found[0] if found else None


def read_table(path: Path, *, who: str, table: TableSchema | None, label_column: str,
               regression: bool = False) -> RawData:
    """A .csv table encoded by the run's table schema (efpsn/data/table_encoding.py), or, when
    the run has none, as numbers only (plain_schema); every problem of the file in one
    DataError."""
    def refuse(problem: str) -> DataError:
        return _fail(who, path, problem)

    raw = read_raw_table(path, refuse=refuse)
    plain = table is None or not table.given
    try:
        schema = plain_schema(raw, label_column=label_column, regression=regression) if plain \
            else table
    except ValueError as exc:
        raise refuse(str(exc)) from None
    assert schema is not None
    encoded, problems = encode_table(schema, raw, where="", plain=plain)
    if encoded is None:
        raise DataError(str(DataProblems(f"{who}: {path}", problems)))
    return RawData(encoded.features, encoded.labels, encoded.cells, missing=encoded.missing)


def read_data(path: str | Path, *, who: str, label_column: str = "label",
              classes: int | None = None, table: TableSchema | None = None,
              regression: bool = False) -> RawData:
    """Raw X and y from an .npz, a .csv or an IDX folder, with their cells' names; only the
    format is checked here (and that a .csv's cells fit `table`, the run's table schema, or
    are numbers without one). A folder holding one train.npz, train.csv, test.npz or test.csv
    (a data folder's agentK, or the folder with its public test file) is read as that file.
    `classes`, when known, makes the sentence about text labels name the run's label range."""
    path = Path(path)
    if path.is_dir() and (inside := data_file_in(path, who)) is not None:
        path = inside
    if path.is_dir():
        features, labels = _read_idx_folder(path, who)
        return RawData(features, labels, ArrayCells(tuple(features.shape[1:])))
    if not path.exists():
        raise _fail(who, path, "no such file; expected " + EXPECTED_FORMATS)
    suffix = path.suffix.lower()
    if suffix == ".npz":
        features, labels = _read_npz(path, who)
        return RawData(features, labels, ArrayCells(tuple(features.shape[1:])))
    if suffix == ".csv":
        column = table.label_column if table is not None and table.given else label_column
        return read_table(path, who=who, table=table, label_column=column,
                          regression=regression)
    raise _fail(who, path, f"unknown format {suffix or '(no suffix)'!r}; expected "
                + EXPECTED_FORMATS)


def read_data_file(path: str | Path, *, who: str,
                   label_column: str = "label") -> tuple[np.ndarray, np.ndarray]:
    """Raw (X, y) from an .npz, a .csv or an IDX folder; only the format is checked here."""
    raw = read_data(path, who=who, label_column=label_column)
    return raw.features, raw.labels


def _check_kinds(features: np.ndarray, labels: np.ndarray, *, fail: Refuse,
                 classes: int) -> None:
    if labels.dtype.kind in "US":
        raise fail(f"y holds text labels ({labels.dtype}); " + text_label_hint(classes))
    if features.dtype.kind in "US":
        raise fail(f"X holds text ({features.dtype}); expected numbers (encode a category as "
                   "numbers, e.g. one 0/1 column per category)")
    if features.dtype.kind not in "biuf" or labels.dtype.kind not in "biuf":
        raise fail(f"X and y must be numeric arrays, got {features.dtype} and "
                   f"{labels.dtype}; expected numbers")


def _check_range(x: np.ndarray, raw: np.ndarray, *, fail: Refuse, cells: Cells,
                 after: str, missing: int = 0) -> None:
    """Every scaled feature finite and within feature_limit; else name the first bad cell.
    The happy path allocates nothing (min and max are reductions; NaN propagates). With
    `missing` empty cells (a table's NaN, filled later), NaN is not a bad cell."""
    per_sample = math.prod(x.shape[1:])
    limit = feature_limit(per_sample)
    lo, hi = ((float(np.nanmin(x)), float(np.nanmax(x))) if missing else
              (float(x.min()), float(x.max()))) if x.size else (0.0, 0.0)
    if math.isfinite(lo) and math.isfinite(hi) and max(-lo, hi) <= limit:
        return
    flat, flat_raw = x.reshape(len(x), -1), raw.reshape(len(raw), -1)
    bad = ~np.isfinite(flat) & ~(np.isnan(flat) if missing else False)
    if bad.any():
        row, col = first_index(bad)
        if not np.isfinite(flat_raw[row, col]):
            raise fail(f"X has non-finite values (NaN or inf), the first at "
                       f"{cells.feature(row, col)}; expected finite numbers")
    row, col = first_index(bad | (np.nan_to_num(np.abs(flat)) > limit))
    raise fail(f"X has a value too large for float64 arithmetic at {cells.feature(row, col)}: "
               f"its magnitude{after} exceeds {limit:.3g}, where the model's products of "
               f"features and parameters (about {per_sample} x value^2) would overflow; "
               "expected values of a sensible scale (rescale the data, or divide it by a "
               "public constant with --scale div:C)")


def second_moment(x: np.ndarray) -> float:
    """lambda_max of E[x~ x~^T], x~ = (x, 1) the flattened features with the bias's constant:
    (the trace, when that already meets a bound, is cheaper) computed on the smaller Gram side."""
    flat = x.reshape(len(x), -1)
    tilde = np.concatenate([flat, np.ones((len(flat), 1))], axis=1)
    gram = tilde.T @ tilde if tilde.shape[1] <= len(tilde) else tilde @ tilde.T
    return float(np.linalg.eigvalsh(gram / len(tilde))[-1])


def check_second_moment(data: Dataset, *, bound: float, fail: Refuse,
                        names: Callable[[int], str]) -> None:
    """Refuse features whose second-moment matrix E[x~ x~^T] (bias column included) has its
    largest eigenvalue above `bound`: the step rule's public curvature bound rests on it
    (efpsn/params/step_rule.py). Data in [-1, 1] or standardised passes; the error names the column
    of largest mean square, never a value. The trace is tried first (cheap, and sufficient:
    lambda_max <= trace)."""
    x = data.images.numpy().reshape(len(data), -1)
    squares = np.mean(x * x, axis=0)
    if float(squares.sum()) + 1.0 <= bound or second_moment(x) <= bound:
        return
    column = names(int(np.argmax(squares)))
    raise fail(f"its features are too large for the default step size: the largest eigenvalue "
               f"of their second-moment matrix exceeds {bound:g} (the features plus one), the "
               f"public bound the step size rests on, which any data in [-1, 1] or standardised "
               f"to unit variance meets (largest column: {column}); expected features divided "
               f"by public constants (--scale div:C, or div:C1,...,Cd with one per feature) or "
               f"your own step size (--schedule constant:LR)")


def _check_labels(y: np.ndarray, *, fail: Refuse, cells: Cells, classes: int,
                  regression: bool = False) -> None:
    if regression:
        bad = ~np.isfinite(y)
        if bad.any():
            raise fail(f"y has a target that is not a finite number at "
                       f"{cells.label(int(np.argmax(bad)))}; expected finite numbers")
        return
    if y.dtype.kind == "f":
        fractional = ~(np.isfinite(y) & (y == np.floor(y)))
        if fractional.any():
            at = cells.label(int(np.argmax(fractional)))
            raise fail(f"y has labels that are not integers, the first at {at}; expected "
                       f"integer labels in [0, {classes}) (a numeric target is a "
                       "regression: --task ridge)")
    outside = (y < 0) | (y >= classes)
    if outside.any():
        at = cells.label(int(np.argmax(outside)))
        raise fail(f"y has labels outside [0, {classes}), the first at {at}; expected "
                   f"integers in [0, {classes}) (the run's {classes} classes)")


def check_arrays(
    features: np.ndarray, labels: np.ndarray, *, path: Path, who: str,
    shape: tuple[int, ...], classes: int, divisor: float | np.ndarray,
    cells: Cells | None = None, regression: bool = False, missing: int = 0,
    fills: bool = False,
) -> Dataset:
    """Schema, range and label checks; features / divisor reshaped to (n, *shape).

    `divisor` is one public constant or one per feature (efpsn.params.schema.Scale.divisor). `cells`
    names a bad cell in the error (default: numpy indices X[i, j], y[i]). `regression`: labels
    are numeric targets (float64). `missing`: the table's empty number cells (NaN), kept when
    the run `fills` them with the network's column means (scale standard), else refused."""
    def fail(problem: str) -> DataError:
        return _fail(who, path, problem)

    want = "x".join(map(str, shape))
    _check_kinds(features, labels, fail=fail, classes=classes)
    if features.ndim < 1 or labels.ndim != 1 or features.shape[0] != labels.shape[0]:
        raise fail("X and y disagree: expected X with one row per sample and y a 1-D array "
                   "with one label per sample")
    if features.shape[0] == 0:
        raise fail("holds no samples; expected at least one")
    sample = features.shape[1:]
    if math.prod(sample) != math.prod(shape) or (features.ndim == 1 and shape != (1,)):
        got = "x".join(map(str, sample)) or "scalar"
        raise fail(f"samples have shape {got}; expected the run's input shape {want} "
                   f"({math.prod(shape)} values per sample), the same at every agent: fix "
                   f"this file, or, only if every agent's samples have shape {got}, give the "
                   f"run --input-shape {got} (or the data folder's schema.json)")
    x = np.array(features, dtype=np.float64).reshape(-1, *shape)  # one copy, scaled in place
    div = np.asarray(divisor, dtype=np.float64)
    x /= div.reshape(shape) if div.ndim else div
    after = ("" if not np.any(div != 1.0) else " divided by its public scale" if div.ndim
             else f" divided by the public scale {float(div):g}")
    cells = cells or ArrayCells(tuple(sample))
    if missing and not fills:
        row, col = first_index(np.isnan(x.reshape(len(x), -1)))
        raise fail(f"has empty cells, the first at {cells.feature(row, col)}; expected a number "
                   "in every cell: empty cells are filled with the network's column means, "
                   "which only scale standard computes (--scale standard, a --data-dir "
                   "table's default)")
    _check_range(x, features, fail=fail, cells=cells, after=after, missing=missing)
    y = np.asarray(labels)
    _check_labels(y, fail=fail, cells=cells, classes=classes, regression=regression)
    return Dataset(images=torch.from_numpy(np.ascontiguousarray(x)),
                   labels=torch.from_numpy(y.astype(np.float64 if regression else np.int64)),
                   name=f"{who}:{path.name}", shape=tuple(shape), classes=classes)


def resolve_holdout(fraction: float | None, *, public_test: bool) -> float:
    """The fraction of an agent's rows it holds out: `fraction` as given, or for None (`--holdout
    auto`, the default) none when a public test set scores the model (holding private rows
    out would only shrink the training data), else AUTO_HOLDOUT (the agent's own score)."""
    if fraction is None:
        return 0.0 if public_test else AUTO_HOLDOUT
    return fraction


def split_holdout(data: Dataset, *, fraction: float, seed: int, who: str,
                  path: Path) -> tuple[Dataset, Dataset | None]:
    """(train, holdout): round(fraction * n) samples held out, chosen by a permutation of the
    public seed (local data, so nothing about it is shared); fraction 0 keeps everything."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"{who}: --holdout must lie in [0, 1), got {fraction}")
    if fraction == 0.0:
        return data, None
    n = len(data)
    n_out = round(fraction * n)
    if n_out == 0 or n_out == n:
        raise _fail(who, path, f"too few samples for a holdout of {fraction:g}; expected enough "
                               "for a non-empty training and held-out part (or --holdout 0)")
    perm = np.random.default_rng([seed, 0x401D]).permutation(n)
    return (data.subset(perm[n_out:], name=f"{data.name}:train"),
            data.subset(perm[:n_out], name=f"{data.name}:holdout"))


def load_local_data(
    path: str | Path, *, who: str, shape: tuple[int, ...], classes: int,
    divisor: float | np.ndarray, seed: int, holdout: float | None = None, batch_size: int = 0,
    test_path: str | Path | None = None, label_column: str = "label",
    moment_bound: float | None = None, table: TableSchema | None = None,
    regression: bool = False, fills: bool = False,
) -> LocalData:
    """Read and check an agent's own data (and the public test set) against the run's schema
    (`table`: a .csv's table schema; `regression`: numeric targets; `fills`: empty number
    cells are kept, NaN, for the network's column means); with `moment_bound`, its training
    part must pass check_second_moment. `holdout`: resolve_holdout's (None: auto)."""
    path = Path(path)
    holdout = resolve_holdout(holdout, public_test=test_path is not None)
    kinds = {"table": table, "regression": regression}
    raw = read_data(path, who=who, label_column=label_column, classes=classes, **kinds)
    data = check_arrays(raw.features, raw.labels, path=path, who=who, shape=shape,
                        classes=classes, divisor=divisor, cells=raw.cells,
                        regression=regression, missing=raw.missing, fills=fills)
    train, held = split_holdout(data, fraction=holdout, seed=seed, who=who, path=path)
    if batch_size and len(train) < batch_size:
        raise _fail(who, path, f"has fewer training samples than the batch size {batch_size} "
                               f"(after the {holdout:g} holdout); expected at least "
                               f"{batch_size} (lower --batch-size or --holdout)")
    if moment_bound is not None:
        check_second_moment(train, bound=moment_bound, fail=lambda text: _fail(who, path, text),
                            names=raw.cells.column)
    test = None
    if test_path is not None:
        tpath = Path(test_path)
        public = read_data(tpath, who=who, label_column=label_column, classes=classes,
                           **kinds)
        test = check_arrays(public.features, public.labels, path=tpath, who=who, shape=shape,
                            classes=classes, divisor=divisor, cells=public.cells,
                            regression=regression, missing=public.missing, fills=fills)
    return LocalData(train=train, holdout=held, test=test, missing=raw.missing)
