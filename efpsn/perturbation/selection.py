"""Which parameters the perturbation acts on: the selection spec, parsed without torch.

The coordinator (torch-free) validates a run's selection with this module;
efpsn/perturbation/function.py turns a parsed selection into the flat indices of a real model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DEFAULT_MEASURES",
    "SELECTION_SPECS",
    "Measure",
    "Selection",
    "check_indices_fit",
    "default_basis_size",
    "implied_count",
    "parse_selection",
    "selection_measure",
]

Measure = Literal["lebesgue", "uniform"]
"""The measure on [-1, 1]^m a basis is orthonormal for: Lebesgue (the paper's) or uniform."""

SELECTION_SPECS = ("last-bias", "random", "random:M", "indices:I,J,...", "all")
"""Selection kinds; each may end in "@lebesgue" or "@uniform" to choose the measure explicitly."""

DEFAULT_MEASURES: dict[str, Measure] = {
    # The paper's selections (a few chosen coordinates): its Lebesgue measure, so the paper's
    # (K, m, N) = (1, 10, 10) runs and the Sec. 5.1 example stay exactly as published.
    "last-bias": "lebesgue",
    "random": "lebesgue",
    "indices": "lebesgue",
    # Selections for perturbing many coordinates: the uniform probability measure, whose basis
    # does not shrink as 2^(-m/2) (that factor underflows float64 from m of about 2,040).
    "all": "uniform",
    "random:M": "uniform",
}
"""The measure on [-1, 1]^m each selection kind uses unless its spec says "@MEASURE"."""


@dataclass(frozen=True)
class Selection:
    """A parsed selection spec: its kind, the measure of the basis, and the kind's argument."""

    kind: str  # "last-bias" | "random" | "random:M" | "indices" | "all"
    measure: Measure
    count: int | None = None  # M of "random:M"
    indices: tuple[int, ...] | None = None  # of "indices:..."

    @classmethod
    def parse(cls, spec: str) -> Selection:
        """The one grammar of the selection flag (parse_selection)."""
        return parse_selection(spec)

    @classmethod
    def of(cls, value: Selection | str) -> Selection:
        """A Selection as it is, or its text parsed."""
        return value if isinstance(value, Selection) else parse_selection(value)

    def wire(self) -> str:
        return str(self)

    def __str__(self) -> str:
        """The spec parse reads back: KIND[:ARG], with @MEASURE when not the kind's default."""
        if self.kind == "random:M":
            body = f"random:{self.count}"
        elif self.kind == "indices":
            body = "indices:" + ",".join(str(i) for i in self.indices or ())
        else:
            body = self.kind
        return body if self.measure == DEFAULT_MEASURES[self.kind] else f"{body}@{self.measure}"


def parse_selection(spec: str | Selection) -> Selection:
    """Parse "KIND[@MEASURE]", e.g. "last-bias", "all", "random:200", "last-bias@uniform".

    The measure (lebesgue or uniform on [-1, 1]^m) is part of the spec so that every agent
    derives the same basis from the public selection string; without a suffix it is the kind's
    default (DEFAULT_MEASURES).
    """
    if isinstance(spec, Selection):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"selection must be a str, got {type(spec).__name__}")
    body, sep, measure_text = spec.strip().partition("@")
    body = body.strip()
    measure_text = measure_text.strip()
    if sep and measure_text not in ("lebesgue", "uniform"):
        raise ValueError(
            f"selection {spec!r}: the measure after '@' must be 'lebesgue' or 'uniform', "
            f"got {measure_text!r}"
        )
    if body in ("last-bias", "random", "all"):
        kind, count, indices = body, None, None
    elif body.startswith("random:"):
        text = body[len("random:") :].strip()
        if not text.isdigit() or int(text) < 1:
            raise ValueError(
                f"selection {spec!r}: expected 'random:M' with M a positive integer, got {text!r}"
            )
        kind, count, indices = "random:M", int(text), None
    elif body.startswith("indices:"):
        try:
            raw = tuple(int(t) for t in body[len("indices:") :].split(",") if t.strip())
        except ValueError as err:
            raise ValueError(
                f"selection {spec!r}: expected comma-separated integers like 'indices:3,17,42'"
            ) from err
        if not raw:
            raise ValueError(f"selection {spec!r}: 'indices:' names no parameter")
        kind, count, indices = "indices", None, raw
    else:
        raise ValueError(
            f"unknown parameter selection {spec!r}: expected one of {', '.join(SELECTION_SPECS)}, "
            f"optionally followed by @lebesgue or @uniform"
        )
    measure: Measure = measure_text if sep else DEFAULT_MEASURES[kind]  # type: ignore[assignment]
    return Selection(kind=kind, measure=measure, count=count, indices=indices)


def selection_measure(spec: str | Selection) -> Measure:
    """The measure on [-1, 1]^m the basis of this selection is orthonormal for."""
    return parse_selection(spec).measure


def implied_count(selection: Selection, *, num_params: int | None,
                  last_bias: int | None) -> int | None:
    """How many parameters the selection perturbs (its m), from the model's sizes alone:
    last-bias -> the last layer's bias count, all -> every parameter, random:M -> M,
    indices:... -> how many are named. None when the selection does not fix it ("random" takes
    any m) or the needed size is unknown (a user's model, before it is built)."""
    if selection.kind == "last-bias":
        return last_bias
    if selection.kind == "all":
        return num_params
    if selection.kind == "random:M":
        return selection.count
    if selection.kind == "indices":
        assert selection.indices is not None
        return len(selection.indices)
    return None


def check_indices_fit(selection: Selection, *, num_params: int) -> None:
    """ValueError unless the selection's explicit indices (or M) fit a model of num_params."""
    if selection.kind == "indices":
        assert selection.indices is not None
        bad = [i for i in selection.indices if not 0 <= i < num_params]
        if bad:
            raise ValueError(f"selection indices must be in [0, {num_params}), got {bad[:8]}")
        if len(set(selection.indices)) != len(selection.indices):
            raise ValueError("selection indices must be distinct")
    if selection.kind == "random:M" and selection.count is not None \
            and selection.count > num_params:
        raise ValueError(f"selection random:{selection.count} perturbs more parameters than "
                         f"the model's {num_params}")


def default_basis_size(*, m: int, K: int) -> int:
    """N when the run leaves it to the model: 1 + K m, the constant and, for every perturbed
    coordinate, its powers up to K (for K = 1 every affine function, so every coordinate is
    perturbed); never more than the C(m + K, K) monomials that exist."""
    return min(1 + K * m, math.comb(m + K, K))
