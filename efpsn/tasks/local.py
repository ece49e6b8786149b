"""One agent's own data files (.npz, .csv, IDX folder), checked against the run's public schema.

Every error is one line naming the agent, the file and what was expected. Messages never state
the data's sample count or any statistic of it (they may end up in a log).
"""

from __future__ import annotations

import csv
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from efpsn.tasks.data import Dataset, _find_idx_file, read_idx

__all__ = ["DataError", "LocalData", "load_local_data", "read_data_file", "split_holdout"]

EXPECTED_FORMATS = ("an .npz with arrays X and y, a .csv with a header row, or a folder of "
                    "IDX files")


class DataError(ValueError):
    """An agent's data file cannot be used; the message is one line for its user."""


@dataclass(frozen=True, eq=False)
class LocalData:
    """An agent's training part, its local held-out part and the optional public test set."""

    train: Dataset
    holdout: Dataset | None
    test: Dataset | None


def _fail(who: str, path: Path, problem: str) -> DataError:
    return DataError(f"{who}: {path}: {problem}")


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


def _read_csv(path: Path, who: str, label_column: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        with open(path, newline="") as fh:
            rows = csv.reader(fh)
            header = next(rows, None)
            if not header:
                raise _fail(who, path, "is empty; expected a header row, then one row per "
                                       f"sample with numeric features and a {label_column!r} "
                                       "column")
            header = [h.strip() for h in header]
            if label_column not in header:
                raise _fail(who, path, f"has no column {label_column!r} in its header; expected "
                                       "the label column named by --label-column")
            label_at = header.index(label_column)
            values: list[list[float]] = []
            for row in rows:
                if not row:
                    continue
                if len(row) != len(header):
                    raise _fail(who, path, f"is ragged: a row has {len(row)} fields where the "
                                           f"header has {len(header)}; expected every row "
                                           "to have one value per column")
                try:
                    values.append([float(v) for v in row])
                except ValueError:
                    raise _fail(who, path, "has a value that is not a number; expected numeric "
                                           "features and labels") from None
    except UnicodeDecodeError:
        raise _fail(who, path, "is not a text .csv file; expected " + EXPECTED_FORMATS) from None
    except OSError as exc:
        raise _fail(who, path, f"cannot be read ({exc.strerror}); expected a readable "
                               "file") from None
    table = np.asarray(values, dtype=np.float64).reshape(len(values), len(header))
    return np.delete(table, label_at, axis=1), table[:, label_at]


def _read_idx_folder(path: Path, who: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        images = read_idx(_find_idx_file(path, "train", "images"))
        labels = read_idx(_find_idx_file(path, "train", "labels"))
    except (OSError, ValueError) as exc:
        raise _fail(who, path, f"is not a usable IDX folder ({str(exc).split(':')[0]}); "
                               "expected train-images-idx3-ubyte and "
                               "train-labels-idx1-ubyte (optionally .gz)") from None
    return images, labels


def read_data_file(path: str | Path, *, who: str,
                   label_column: str = "label") -> tuple[np.ndarray, np.ndarray]:
    """Raw (X, y) from an .npz, a .csv or an IDX folder; only the format is checked here."""
    path = Path(path)
    if path.is_dir():
        return _read_idx_folder(path, who)
    if not path.exists():
        raise _fail(who, path, "no such file; expected " + EXPECTED_FORMATS)
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return _read_npz(path, who)
    if suffix == ".csv":
        return _read_csv(path, who, label_column)
    raise _fail(who, path, f"unknown format {suffix or '(no suffix)'!r}; expected "
                + EXPECTED_FORMATS)


def check_arrays(
    features: np.ndarray, labels: np.ndarray, *, path: Path, who: str,
    shape: tuple[int, ...], classes: int, divisor: float,
) -> Dataset:
    """Schema, finiteness and label checks; features / divisor reshaped to (n, *shape)."""
    want = "x".join(map(str, shape))
    if features.dtype.kind not in "biuf" or labels.dtype.kind not in "biuf":
        raise _fail(who, path, f"X and y must be numeric arrays, got {features.dtype} and "
                               f"{labels.dtype}; expected numbers")
    if features.ndim < 1 or labels.ndim != 1 or features.shape[0] != labels.shape[0]:
        raise _fail(who, path, "X and y disagree: expected X with one row per sample and y a "
                               "1-D array with one label per sample")
    if features.shape[0] == 0:
        raise _fail(who, path, "holds no samples; expected at least one")
    sample = features.shape[1:]
    if math.prod(sample) != math.prod(shape) or (features.ndim == 1 and shape != (1,)):
        got = "x".join(map(str, sample)) or "scalar"
        raise _fail(who, path, f"samples have shape {got}; expected the run's input shape "
                               f"{want} ({math.prod(shape)} values per sample)")
    x = np.array(features, dtype=np.float64).reshape(-1, *shape)  # one copy, scaled in place
    x /= divisor
    if not np.isfinite(x).all():
        raise _fail(who, path, "X has non-finite values (NaN or inf); expected finite numbers")
    y = np.asarray(labels)
    if y.dtype.kind == "f" and not (np.isfinite(y).all() and (y == np.floor(y)).all()):
        raise _fail(who, path, "y has labels that are not integers; expected integer labels "
                               f"in [0, {classes})")
    if (y < 0).any() or (y >= classes).any():
        raise _fail(who, path, f"y has labels outside [0, {classes}); expected integers in "
                               f"[0, {classes}) (the run's {classes} classes)")
    return Dataset(images=torch.from_numpy(np.ascontiguousarray(x)),
                   labels=torch.from_numpy(y.astype(np.int64)), name=f"{who}:{path.name}",
                   shape=tuple(shape), classes=classes)


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
    path: str | Path, *, who: str, shape: tuple[int, ...], classes: int, divisor: float,
    seed: int, holdout: float = 0.2, batch_size: int = 0, test_path: str | Path | None = None,
    label_column: str = "label",
) -> LocalData:
    """Read and check an agent's own data (and the public test set) against the run's schema."""
    path = Path(path)
    features, labels = read_data_file(path, who=who, label_column=label_column)
    data = check_arrays(features, labels, path=path, who=who, shape=shape, classes=classes,
                        divisor=divisor)
    train, held = split_holdout(data, fraction=holdout, seed=seed, who=who, path=path)
    if batch_size and len(train) < batch_size:
        raise _fail(who, path, f"has fewer training samples than the batch size {batch_size} "
                               f"(after the {holdout:g} holdout); expected at least "
                               f"{batch_size} (lower --batch-size or --holdout)")
    test = None
    if test_path is not None:
        tpath = Path(test_path)
        tx, ty = read_data_file(tpath, who=who, label_column=label_column)
        test = check_arrays(tx, ty, path=tpath, who=who, shape=shape, classes=classes,
                            divisor=divisor)
    return LocalData(train=train, holdout=held, test=test)
