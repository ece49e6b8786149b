"""Tables as users export them, built from data that ships inside scikit-learn, and the reference
each is measured against (scikit-learn's own pipeline on the same pooled rows).

- `cellar`: scikit-learn's wine as a spreadsheet of a wine cellar: the label column `cultivar`
  holds class names (Barbera, Barolo, Grignolino), two text category columns (`region`, three
  values drawn with the class, and `cask`, two values drawn at random), about 4% empty number
  cells; with `extra`, also an id column (`bottle_id`), a free-text column (`tasting_note`) and
  a date column (`bottled`). Four private folders of unequal size and a public test.csv.
- `diabetes`: scikit-learn's diabetes (a numeric target, `progression`) in raw units, four
  unequal folders and a public test.csv.
- `SPREADSHEET`: a small table written by hand the way a spreadsheet exports it (quoted cells
  with commas, CRLF line ends, "NA" and "#N/A" and blank cells, Yes/No class names, spaces
  around values).
"""

from __future__ import annotations

import csv
import warnings
from pathlib import Path

import numpy as np

CULTIVARS = ("Barolo", "Grignolino", "Barbera")  # scikit-learn's wine classes 0, 1, 2
COLUMNS = ("alcohol", "malic_acid", "ash", "alcalinity", "magnesium", "phenols", "flavanoids",
           "nonflavanoid_phenols", "proanthocyanins", "color", "hue", "od280", "proline")
SIZES = (0.1, 0.25, 0.3)  # of the training rows: 4 folders of 10%, 25%, 30% and 35%
NOTES = ("dry", "fruity", "oaky", "long finish", "tannic", "bright", "cherry", "plum")


def _write(path: Path, header: list[str], rows: list[list[str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(header)
        out.writerows(rows)


def _split(n: int, seed: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """(public test rows, four unequal private parts of the rest)."""
    order = np.random.default_rng(seed).permutation(n)
    test, train = order[: n // 5], order[n // 5:]
    cuts = np.cumsum([round(f * len(train)) for f in SIZES])
    return test, np.split(train, cuts)


def cellar(root: Path, *, extra: bool = False, seed: int = 0) -> Path:
    """The wine cellar's tables in root/agent1..4/train.csv and root/test.csv (module doc)."""
    from sklearn.datasets import load_wine

    x, y = load_wine(return_X_y=True)
    rng = np.random.default_rng(seed)
    home = np.array(["Piedmont", "Piedmont", "Veneto"])[y]
    region = np.where(rng.random(len(y)) < 0.75, home,
                      rng.choice(["Piedmont", "Veneto", "Lombardy"], len(y)))
    cask = rng.choice(["oak", "steel"], len(y))
    empty = rng.random(x.shape) < 0.04
    header = [*COLUMNS, "region", "cask", "cultivar"]
    if extra:
        header = ["bottle_id", *header, "tasting_note", "bottled"]

    def row(i: int) -> list[str]:
        cells = ["" if empty[i, j] else f"{v:g}" for j, v in enumerate(x[i])]
        cells += [str(region[i]), str(cask[i]), CULTIVARS[y[i]]]
        if extra:
            note = ", ".join(rng.choice(NOTES, 3, replace=False))
            cells = [f"B-{1000 + i}", *cells, f"{note}; bottle {i}",
                     f"20{10 + i % 12}-{1 + i % 12:02d}-{1 + i % 28:02d}"]
        return cells

    test, parts = _split(len(y), seed)
    for k, part in enumerate(parts, start=1):
        _write(root / f"agent{k}" / "train.csv", header, [row(i) for i in part])
    _write(root / "test.csv", header, [row(i) for i in test])
    return root


def diabetes(root: Path, *, seed: int = 0) -> Path:
    """scikit-learn's diabetes in raw units: a numeric target `progression`; four unequal
    folders and a public test.csv."""
    from sklearn.datasets import load_diabetes

    bunch = load_diabetes(scaled=False)
    x, y = bunch.data, bunch.target
    header = [*bunch.feature_names, "progression"]
    test, parts = _split(len(y), seed)

    def rows(at: np.ndarray) -> list[list[str]]:
        return [[f"{v:g}" for v in x[i]] + [f"{y[i]:g}"] for i in at]

    for k, part in enumerate(parts, start=1):
        _write(root / f"agent{k}" / "train.csv", header, rows(part))
    _write(root / "test.csv", header, rows(test))
    return root


def pooled(root: Path, label: str, *, drop: tuple[str, ...] = ()) -> tuple[list, list, list, list]:
    """(train rows, train labels, test rows, test labels) of a folder's tables, every private
    part pooled, each row a dict of its feature cells (text)."""
    def read(path: Path) -> tuple[list[dict[str, str]], list[str]]:
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(fh))
        labels = [r.pop(label) for r in rows]
        for r in rows:
            for d in drop:
                r.pop(d)
        return rows, labels

    train, labels = [], []
    for part in sorted(root.glob("agent*/train.csv")):
        rows, ys = read(part)
        train += rows
        labels += ys
    test, test_labels = read(root / "test.csv")
    return train, labels, test, test_labels


def _matrix(rows: list[dict[str, str]], numbers: list[str]) -> np.ndarray:
    return np.array([[float(r[c]) if r[c].strip() else np.nan for c in numbers] for r in rows])


def reference_classifier(root: Path, label: str, *, drop: tuple[str, ...] = ()) -> float:
    """scikit-learn's pipeline on the pooled rows, its test accuracy: empty number cells
    imputed with the mean, text columns one-hot, StandardScaler, LogisticRegression()."""
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    train, y, test, y_test = pooled(root, label, drop=drop)
    texts = [c for c in train[0] if any(not _is_number(r[c]) for r in train)]
    numbers = [c for c in train[0] if c not in texts]
    impute = SimpleImputer(strategy="mean").fit(_matrix(train, numbers))
    onehot = OneHotEncoder(handle_unknown="ignore", sparse_output=False).fit(
        [[r[c] for c in texts] for r in train])

    def features(rows: list[dict[str, str]]) -> np.ndarray:
        return np.hstack([impute.transform(_matrix(rows, numbers)),
                          onehot.transform([[r[c] for c in texts] for r in rows])])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = make_pipeline(StandardScaler(), LogisticRegression()).fit(features(train), y)
    return float(model.score(features(test), y_test))


def reference_ridge(root: Path, label: str) -> float:
    """scikit-learn's StandardScaler + Ridge() on the pooled rows: its test R^2."""
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    train, y, test, y_test = pooled(root, label)
    columns = list(train[0])
    model = make_pipeline(StandardScaler(), Ridge()).fit(
        _matrix(train, columns), np.array(y, dtype=float))
    return float(model.score(_matrix(test, columns), np.array(y_test, dtype=float)))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return not text.strip()  # an empty cell is a missing number
    return True


# A spreadsheet's "Save as CSV", by hand: a header with spaces, quoted cells holding commas,
# CRLF line ends, "NA", "#N/A" and blank cells, and class names Yes/No.
SPREADSHEET = (
    'Patient ID,Age,"Blood pressure, systolic",Smoker,Region,Outcome\r\n'
    'P-001,54,138,No,"North, rural",Yes\r\n'
    'P-002,61,NA,Yes,South,No\r\n'
    'P-003, 47 ,121,No,"North, rural",No\r\n'
    'P-004,70,150,Yes,South,Yes\r\n'
    'P-005,#N/A,133,No,"North, rural",No\r\n'
    'P-006,58,,Yes,South,Yes\r\n'
    'P-007,39,118,No,South,No\r\n'
    'P-008,66,142,Yes,"North, rural",Yes\r\n'
)
