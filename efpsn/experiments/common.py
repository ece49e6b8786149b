"""Shared plumbing of the experiments: output folders, CSV/JSON, text tables, figures, timing."""

from __future__ import annotations

import csv
import math
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from efpsn.jsonfile import write_json

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "DEFAULT_ROOT",
    "FIGURE_DPI",
    "PAPER_GAMMAS",
    "Column",
    "compress_png",
    "copy_figures",
    "finish",
    "format_table",
    "log",
    "new_figure",
    "output_dir",
    "parse_floats",
    "pyplot",
    "save_figure",
    "stopwatch",
    "write_csv",
    "write_json",
]

DEFAULT_ROOT = Path("results") / "experiments"
FIGURE_DPI = 90  # small PNGs: they are committed under docs/figures
PAPER_GAMMAS: tuple[float, ...] = (1e-2, 1e-1, 1e0, 1e1, 1e2, 1e3, 1e4)
"""The noise levels of the paper's accuracy figures (Sec. 5.2)."""


def output_dir(out: str | Path | None, name: str) -> Path:
    """`out`, or results/experiments/NAME; created if missing."""
    folder = Path(out) if out is not None else DEFAULT_ROOT / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def log(message: str) -> None:
    """Progress line on stderr (stdout carries the tables)."""
    print(message, file=sys.stderr, flush=True)


@contextmanager
def stopwatch() -> Iterator[Callable[[], float]]:
    """`with stopwatch() as elapsed: ...; elapsed()` gives wall seconds since entry."""
    start = time.perf_counter()
    yield lambda: time.perf_counter() - start


def parse_floats(text: str) -> tuple[float, ...]:
    """'1e-2,1,1e3' -> (0.01, 1.0, 1000.0); raises ValueError naming the bad item."""
    values = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            values.append(float(item))
        except ValueError:
            raise ValueError(f"expected a comma-separated list of numbers, got {item!r}") from None
    if not values:
        raise ValueError(f"expected at least one number, got {text!r}")
    return tuple(values)


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Rows as CSV; columns are the union of the rows' keys in first-seen order."""
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, restval="")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv_value(v) for k, v in row.items()})
    return path


def _csv_value(value: Any) -> Any:
    if isinstance(value, float):
        return repr(value)  # full precision, round-trips through float()
    return value


@dataclass(frozen=True)
class Column:
    """One column of a text table: the row key, its header and a format spec (or callable)."""

    key: str
    header: str
    fmt: str | Callable[[Any], str] = ""

    def render(self, row: Mapping[str, Any]) -> str:
        value = row.get(self.key, "")
        if value is None or value == "":
            return "-"
        if callable(self.fmt):
            return self.fmt(value)
        if isinstance(value, float) and math.isnan(value):
            return "nan"
        return format(value, self.fmt) if self.fmt else str(value)


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column]) -> str:
    """A Markdown pipe table (readable as plain text, pasteable into docs/RESULTS.md)."""
    cells = [[c.header for c in columns]] + [[c.render(r) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    # text columns left-aligned, numbers right-aligned
    left = [all(isinstance(r.get(c.key), str | bool) for r in rows) for c in columns]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(cells[0], widths, strict=True)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells[1:]:
        lines.append("| " + " | ".join(
            v.ljust(w) if lft else v.rjust(w)
            for v, w, lft in zip(row, widths, left, strict=True)) + " |")
    return "\n".join(lines)


def pyplot() -> Any:
    """matplotlib.pyplot on the non-interactive Agg backend (experiments run headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def new_figure(ncols: int = 1, nrows: int = 1, *, size: tuple[float, float] = (4.8, 3.6),
               **kwargs: Any) -> tuple[Figure, Any]:
    """A figure with an (nrows, ncols) array of axes, each of `size` inches."""
    fig, axes = pyplot().subplots(
        nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False, **kwargs
    )
    return fig, axes


def save_figure(fig: Figure, path: Path, *, dpi: int = FIGURE_DPI) -> Path:
    """Save as PNG and release the figure's memory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    pyplot().close(fig)
    return compress_png(path)


def compress_png(path: Path, *, colors: int = 128) -> Path:
    """Rewrite a PNG with a `colors`-entry palette: 3-4x smaller, visually the same for plots.

    (Pillow comes with matplotlib.)
    """
    from PIL import Image

    with Image.open(path) as image:
        quantized = image.convert("RGB").quantize(colors=colors)
    quantized.save(path, optimize=True)
    return path


def copy_figures(paths: Sequence[Path], folder: str | Path | None) -> list[Path]:
    """Copy the PNGs into `folder` (e.g. docs/figures); nothing when folder is None."""
    if folder is None:
        return []
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    copied = []
    for path in paths:
        if path.suffix == ".png":
            copied.append(Path(shutil.copy2(path, target / path.name)))
    return copied


def finish(
    folder: Path,
    name: str,
    *,
    payload: dict[str, Any],
    rows: Sequence[Mapping[str, Any]],
    table: str,
    figures: Sequence[Path],
    wall_seconds: float,
    figures_to: str | Path | None = None,
) -> dict[str, Any]:
    """Write rows.csv, results.json and table.md, print the table, copy figures if asked.

    Returns the summary every experiment's `run` returns: where things went and how long it took.
    """
    csv_path = write_csv(folder / "rows.csv", rows)
    (folder / "table.md").write_text(table + "\n")
    summary = {
        "experiment": name,
        "out": str(folder),
        "wall_seconds": wall_seconds,
        "files": [str(csv_path), str(folder / "results.json"), str(folder / "table.md"),
                  *(str(f) for f in figures)],
        **payload,
        "rows": list(rows),
    }
    write_json(folder / "results.json", summary)
    copied = copy_figures(figures, figures_to)
    print(f"\n== {name} ({wall_seconds:.0f} s) ==")
    print(table)
    print(f"wrote {folder}/ (" + ", ".join(["rows.csv", "results.json", "table.md",
                                            *(f.name for f in figures)]) + ")")
    if copied:
        print("copied figures to " + ", ".join(str(c) for c in copied))
    return summary
