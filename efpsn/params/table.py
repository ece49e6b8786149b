"""The `table` run parameter: how every party turns the rows of its .csv table into features and
labels, the same at every party (efpsn/data/table_encoding.py applies it).

A table schema names the label column and what its cells are (class indices 0..C-1, class
names, or a number: task ridge), every feature column in order (a number, or a category one-hot
encoded over its listed categories) and the columns dropped. It is public: the coordinator hands
it to every agent with the other run parameters, so the class names and categories in it are
learnt by every party and by the coordinator (never which party holds which). `agreed` names
the sets that came from the parties' own tables (efpsn/data/inspection.py: the union over every
file), as opposed to sets listed in the folder's schema.json: those are the disclosure the
privacy line names. Empty numeric cells are not in the schema: every party fills them the same
way, with the network's column mean (efpsn/stats/standardise.py).

Wire: canonical JSON text ("" for no table: files of numbers read as they are). Torch- and
numpy-free: the coordinator parses it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = ["LABEL_KINDS", "TableColumn", "TableSchema"]

LabelKind = Literal["index", "names", "number"]
LABEL_KINDS: tuple[str, ...] = ("index", "names", "number")
CLASSES_SET = "classes"  # the name `agreed` gives the set of class names
_MAX_TEXT = 200  # characters of a column name, class name or category


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > _MAX_TEXT:
        raise ValueError(f"table schema: {what} must be a non-empty text of at most "
                         f"{_MAX_TEXT} characters, got {_shown(value)}")
    if any(not ch.isprintable() for ch in value):
        raise ValueError(f"table schema: {what} {_shown(value)} holds a control character")
    return value


def _distinct(values: Any, what: str) -> tuple[str, ...]:
    if not isinstance(values, list | tuple) or not values:
        raise ValueError(f"table schema: {what} must be a non-empty list of texts, got "
                         f"{_shown(values)}")
    out = tuple(_text(v, f"each of {what}") for v in values)
    if len(set(out)) != len(out):
        twice = sorted({v for v in out if out.count(v) > 1})
        raise ValueError(f"table schema: {what} lists {', '.join(map(repr, twice))} twice; "
                         "expected each once")
    return out


def _shown(value: Any, limit: int = 60) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


@dataclass(frozen=True)
class TableColumn:
    """A feature column: a number (`categories` empty) or a category, one 0/1 feature per
    listed category (a cell outside the list is refused; an empty cell is all zeros)."""

    name: str
    categories: tuple[str, ...] = ()

    @property
    def width(self) -> int:
        """The features it becomes."""
        return len(self.categories) or 1

    def feature_names(self) -> tuple[str, ...]:
        return (self.name,) if not self.categories else tuple(
            f"{self.name}={c}" for c in self.categories)


@dataclass(frozen=True)
class TableSchema:
    """A .csv table's public encoding (the module docstring); TableSchema() is none."""

    label_column: str = ""
    label: LabelKind = "index"
    class_names: tuple[str, ...] = ()
    columns: tuple[TableColumn, ...] = ()
    drop: tuple[str, ...] = ()
    agreed: tuple[str, ...] = ()  # sets learnt from the tables: "classes", category columns

    def __post_init__(self) -> None:
        if not self.label_column:
            if self.class_names or self.columns or self.drop or self.agreed:
                raise ValueError("table schema: a schema without a label column is none; "
                                 "expected label_column")
            return
        _text(self.label_column, "label_column")
        if self.label not in LABEL_KINDS:
            raise ValueError(f"table schema: label must be one of {', '.join(LABEL_KINDS)}, got "
                             f"{_shown(self.label)}")
        if (self.label == "names") != bool(self.class_names):
            raise ValueError("table schema: class_names come with label \"names\", and only "
                             "with it")
        if self.label == "names":
            _distinct(list(self.class_names), "class_names")
            if len(self.class_names) < 2:
                raise ValueError("table schema: expected at least 2 class names, got "
                                 f"{list(self.class_names)}")
        if not self.columns:
            raise ValueError("table schema: expected at least one feature column")
        names = [c.name for c in self.columns]
        every = [self.label_column, *names, *self.drop]
        twice = sorted({n for n in every if every.count(n) > 1})
        if twice:
            raise ValueError(f"table schema: column {', '.join(map(repr, twice))} is named "
                             "twice (label, features and dropped columns are distinct)")
        for c in self.columns:
            _text(c.name, "a column name")
            if c.categories:
                _distinct(list(c.categories), f"the categories of {c.name!r}")
        for d in self.drop:
            _text(d, "a dropped column")
        known = {CLASSES_SET, *(c.name for c in self.columns if c.categories)}
        if not set(self.agreed) <= known:
            raise ValueError(f"table schema: agreed names {sorted(set(self.agreed) - known)}, "
                             "which are neither the class names nor a category column")

    # ---------------------------------------------------------------- what it says

    @property
    def given(self) -> bool:
        """Whether the run has a table schema (else: files of numbers as they are)."""
        return bool(self.label_column)

    @property
    def features(self) -> int:
        """Features per sample, after the one-hot encoding."""
        return sum(c.width for c in self.columns)

    def feature_names(self) -> tuple[str, ...]:
        """Every feature's name: a number column's, or column=category."""
        return tuple(n for c in self.columns for n in c.feature_names())

    @property
    def classes(self) -> int | None:
        """The class count it fixes: the class names', 1 for a number (ridge); None for
        class indices (the run's classes say)."""
        if self.label == "names":
            return len(self.class_names)
        return 1 if self.label == "number" else None

    def disclosure(self) -> str | None:
        """The named disclosure of the sets agreed from the parties' tables (None: nothing of
        any table's contents is in the schema but its column names)."""
        if not self.agreed:
            return None
        parts = []
        if CLASSES_SET in self.agreed:
            parts.append("the class names that occur in any party's table")
        cats = [n for n in self.agreed if n != CLASSES_SET]
        if cats:
            parts.append("the categories of " + ", ".join(map(repr, cats))
                         + " that occur in any party's table")
        return ("disclosed by design to every party and the coordinator (the table schema, a "
                "run parameter): " + " and ".join(parts) + ", never which party holds which; "
                "opt out by listing them in schema.json (\"classes\": [...], \"categories\": "
                "{...})")

    # ---------------------------------------------------------------- JSON and the wire

    def to_json(self) -> dict[str, Any]:
        if not self.given:
            return {}
        out: dict[str, Any] = {"label_column": self.label_column, "label": self.label}
        if self.class_names:
            out["class_names"] = list(self.class_names)
        out["columns"] = [{"name": c.name, **({"categories": list(c.categories)}
                                              if c.categories else {})} for c in self.columns]
        if self.drop:
            out["drop"] = list(self.drop)
        if self.agreed:
            out["agreed"] = list(self.agreed)
        return out

    @classmethod
    def from_json(cls, values: Any) -> TableSchema:
        """Parse to_json's form; ValueError names the field that is wrong."""
        if values in ({}, None):
            return cls()
        if not isinstance(values, dict):  # a bad file, not a bad argument: ValueError
            raise ValueError(  # noqa: TRY004
                f"table schema: expected a JSON object, got {_shown(values)}")
        known = {"label_column", "label", "class_names", "columns", "drop", "agreed"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"table schema: unknown field{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(map(repr, unknown))}; expected only "
                             f"{', '.join(sorted(known))}")
        raw = values.get("columns")
        if not isinstance(raw, list):  # a bad file, not a bad argument: ValueError
            raise ValueError(f"table schema: columns must be a list of {{\"name\": ..., "  # noqa: TRY004
                             f"\"categories\": [...]}}, got {_shown(raw)}")
        columns = []
        for c in raw:
            if not isinstance(c, dict) or set(c) - {"name", "categories"} or "name" not in c:
                raise ValueError(f"table schema: a column must be {{\"name\": TEXT}} or "
                                 f"{{\"name\": TEXT, \"categories\": [...]}}, got {_shown(c)}")
            columns.append(TableColumn(name=_text(c["name"], "a column name"),
                                       categories=_distinct(c["categories"], "categories")
                                       if "categories" in c else ()))
        lists = {k: values.get(k, []) for k in ("class_names", "drop", "agreed")}
        for k, v in lists.items():
            if not isinstance(v, list) or not all(isinstance(t, str) for t in v):
                raise ValueError(f"table schema: {k} must be a list of texts, got {_shown(v)}")
        return cls(label_column=_text(values.get("label_column"), "label_column"),
                   label=values.get("label", "index"),
                   class_names=tuple(lists["class_names"]), columns=tuple(columns),
                   drop=tuple(lists["drop"]), agreed=tuple(lists["agreed"]))

    @classmethod
    def parse(cls, text: str) -> TableSchema:
        """The wire's text: canonical JSON, "" or "none" for no table."""
        if not isinstance(text, str):
            raise TypeError(f"table must be a str, got {type(text).__name__}")
        if text.strip() in ("", "none"):
            return cls()
        try:
            values = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"table schema: not valid JSON ({exc})") from None
        return cls.from_json(values)

    @classmethod
    def read(cls, path: str) -> TableSchema:
        """A table schema file (`efpsn data schema` writes one; the coordinator's
        --table-schema FILE)."""
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ValueError(f"table schema {path}: cannot be read ({exc.strerror}); expected "
                             "the JSON file `efpsn data schema` writes") from None
        try:
            return cls.parse(text)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None

    @classmethod
    def of(cls, value: TableSchema | str) -> TableSchema:
        """A TableSchema as it is, or the wire's text parsed."""
        return value if isinstance(value, cls) else cls.parse(value)

    def wire(self) -> str:
        return "" if not self.given else json.dumps(self.to_json(), sort_keys=True,
                                                    separators=(",", ":"))

    def __str__(self) -> str:
        return self.wire() or "none"

    def describe(self) -> str:
        """In words, for a person."""
        if not self.given:
            return "none"
        label = (f"{len(self.class_names)} class names" if self.label == "names" else
                 "a number" if self.label == "number" else "class indices")
        return (f"{self.features} features from {len(self.columns)} columns, label "
                f"{self.label_column!r} ({label})")
