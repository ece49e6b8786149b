"""Monomials on [-1, 1]^m: sparse exponents, the candidate families (graded, powers), the seeded
choice of N of them, parsing and printing. The orthonormal system built on them is
efpsn/perturbation/basis.py."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import overload

import numpy as np

Monomial = tuple[int, ...]
"""Exponents (a_1, ..., a_m) of x_1^a_1 * ... * x_m^a_m (variables are 1-based for humans only)."""

SparseMonomial = tuple[tuple[int, int], ...]
"""((variable, exponent), ...) with 0-based variables ascending and exponents >= 1; () is 1."""

MAX_CANDIDATES = 1_000_000
"""candidate_monomials / choose_monomials refuse to enumerate more candidates than this."""

# --------------------------------------------------------------------------------------------
# Monomials
# --------------------------------------------------------------------------------------------


def count_monomials(*, m: int, K: int) -> int:
    """Number of monomials in m variables of total degree <= K: C(m + K, K)."""
    _check_positive_int("m", m)
    _check_nonnegative_int("K", K)
    return math.comb(m + K, K)


def _to_sparse(dense: Sequence[int], *, m: int, position: int) -> SparseMonomial:
    """Validate one dense exponent tuple and return its sparse form."""
    if len(dense) != m:
        raise ValueError(
            f"monomial {position} has {len(dense)} exponents, expected m = {m} (one per variable)"
        )
    if len(dense) > 64:
        # Large m: let numpy find the few non-zero exponents instead of a Python loop over all.
        arr = np.asarray(dense)
        if arr.dtype.kind not in "iu":
            raise TypeError(
                f"monomial {position}: exponents must be integers, got dtype {arr.dtype}"
            )
        if (arr < 0).any():
            raise ValueError(f"monomial {position}: exponents must be >= 0, got {int(arr.min())}")
        support = np.flatnonzero(arr)
        return tuple((int(v), int(arr[v])) for v in support)
    out = []
    for v, e in enumerate(dense):
        if isinstance(e, bool) or not isinstance(e, (int, np.integer)):
            raise TypeError(f"monomial {position}: exponents must be integers, got {e!r}")
        if e < 0:
            raise ValueError(f"monomial {position}: exponents must be >= 0, got {int(e)}")
        if e:
            out.append((v, int(e)))
    return tuple(out)


class Monomials(Sequence[Monomial]):
    """Immutable sequence of monomials in m variables, stored sparsely.

    Indexing and iteration give dense exponent tuples (``Monomial``); the sparse form is what the
    algorithms use, so that m = 7850 variables cost nothing per monomial. Compares equal to any
    sequence of the same dense tuples.
    """

    __slots__ = ("_m", "_sparse")

    def __init__(self, *, m: int, sparse: Iterable[SparseMonomial]) -> None:
        _check_positive_int("m", m)
        terms = tuple(tuple((int(v), int(e)) for v, e in s) for s in sparse)
        for position, s in enumerate(terms):
            variables = [v for v, _ in s]
            if variables != sorted(set(variables)) or any(not 0 <= v < m for v in variables):
                raise ValueError(
                    f"sparse monomial {position} = {s!r}: expected distinct ascending variables in "
                    f"[0, {m})"
                )
            if any(e < 1 for _, e in s):
                raise ValueError(f"sparse monomial {position} = {s!r}: exponents must be >= 1")
        self._m = m
        self._sparse = terms

    @classmethod
    def from_dense(cls, monomials: Iterable[Sequence[int]], *, m: int | None = None) -> Monomials:
        """Build from dense exponent tuples (all of length m; m defaults to the first's length)."""
        if isinstance(monomials, Monomials):
            if m is not None and m != monomials.m:
                raise ValueError(f"monomials have m = {monomials.m} variables, expected {m}")
            return monomials
        items = list(monomials)
        if not items:
            raise ValueError("expected at least one monomial, got none")
        if m is None:
            m = len(items[0])
        _check_positive_int("m", m)
        return cls(m=m, sparse=[_to_sparse(d, m=m, position=i) for i, d in enumerate(items)])

    @property
    def m(self) -> int:
        """Number of variables."""
        return self._m

    @property
    def sparse_terms(self) -> tuple[SparseMonomial, ...]:
        """All monomials in sparse form, in order."""
        return self._sparse

    def sparse(self, i: int) -> SparseMonomial:
        """Monomial i in sparse form."""
        return self._sparse[i]

    def degree(self, i: int) -> int:
        """Total degree of monomial i."""
        return sum(e for _, e in self._sparse[i])

    def dense(self, i: int) -> Monomial:
        """Monomial i as a dense exponent tuple of length m."""
        exps = [0] * self._m
        for v, e in self._sparse[i]:
            exps[v] = e
        return tuple(exps)

    def __len__(self) -> int:
        return len(self._sparse)

    @overload
    def __getitem__(self, i: int) -> Monomial: ...

    @overload
    def __getitem__(self, i: slice) -> Monomials: ...

    def __getitem__(self, i: int | slice) -> Monomial | Monomials:
        if isinstance(i, slice):
            return Monomials(m=self._m, sparse=self._sparse[i])
        return self.dense(range(len(self._sparse))[i])

    def __iter__(self) -> Iterator[Monomial]:
        for i in range(len(self._sparse)):
            yield self.dense(i)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Monomials):
            return self._m == other._m and self._sparse == other._sparse
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(other) == len(self) and all(
                tuple(o) == d for o, d in zip(other, self, strict=True)
            )
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self._m, self._sparse))

    def __repr__(self) -> str:
        shown = ", ".join(format_monomial(s) for s in self._sparse[:8])
        more = f", ... ({len(self)} in all)" if len(self) > 8 else ""
        return f"Monomials(m={self._m}, [{shown}{more}])"


def _graded_sparse(m: int, K: int) -> Iterator[SparseMonomial]:
    """All monomials of degree <= K in graded lexicographic order, sparse.

    Degree 0, then 1, ..., then K; within a degree, lexicographically descending exponent vectors
    (x1 > x2 > ...): x1^2, x1*x2, x1*x3, ..., x2^2, x2*x3, ...
    """

    def exact(start: int, degree: int) -> Iterator[SparseMonomial]:
        if degree == 0:
            yield ()
            return
        # The first variable carrying an exponent: the earlier it is, the larger the vector.
        for v in range(start, m):
            for e in range(degree, 0, -1):
                if e < degree and v == m - 1:
                    continue  # the remaining degree has no variable left to go to
                for rest in exact(v + 1, degree - e):
                    yield ((v, e), *rest)

    for d in range(K + 1):
        yield from exact(0, d)


def candidate_monomials(*, m: int, K: int, max_candidates: int = MAX_CANDIDATES) -> Monomials:
    """All C(m + K, K) monomials of total degree <= K in graded lexicographic order.

    Raises ValueError instead of enumerating more than ``max_candidates`` (10^6 by default):
    m = 7850, K = 1 gives 7851 candidates and is fine; m = 7850, K = 2 (30.8 million) is refused.
    """
    count = count_monomials(m=m, K=K)
    if count > max_candidates:
        raise ValueError(
            f"m = {m}, K = {K} gives {count} candidate monomials, more than the cap of "
            f"{max_candidates}; lower K or m, or give the monomials explicitly"
        )
    return Monomials(m=m, sparse=_graded_sparse(m, K))


def choose_monomials(
    *, m: int, K: int, N: int, seed: int, max_candidates: int = MAX_CANDIDATES
) -> Monomials:
    """The constant monomial, then N - 1 distinct non-constant candidates drawn at random.

    The draw is ``numpy.random.default_rng(seed).choice(C - 1, N - 1, replace=False)`` over the
    non-constant candidates in graded order (C = C(m + K, K)); the drawn order is kept, and it is
    the Gram-Schmidt order (so it decides which function gets the largest noise variance).
    """
    _check_positive_int("N", N)
    candidates = candidate_monomials(m=m, K=K, max_candidates=max_candidates)
    if N > len(candidates):
        raise ValueError(
            f"N = {N} basis functions requested but only {len(candidates)} monomials in m = {m} "
            f"variables have degree <= K = {K}"
        )
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(candidates) - 1, size=N - 1, replace=False) if N > 1 else []
    terms = candidates.sparse_terms
    return Monomials(m=m, sparse=[terms[0], *(terms[1 + int(i)] for i in picks)])


def power_monomials(*, m: int, K: int) -> Monomials:
    """The constant, then every variable's powers x_v, x_v^2, ..., x_v^K (v = 1..m): N = 1 + K m.

    The separable family for perturbing many parameters beyond affine (K = 2: "the squares of
    all coordinates added", N = 2m + 1), where the C(m + K, K) candidates of choose_monomials are
    far too many (30.8 million for m = 7850, K = 2). Its orthonormal system is, per variable, the
    Legendre polynomials P_1..P_K (OrthonormalSystem builds it per variable, in milliseconds).
    """
    _check_positive_int("m", m)
    _check_nonnegative_int("K", K)
    return Monomials(
        m=m, sparse=[(), *(((v, e),) for v in range(m) for e in range(1, K + 1))]
    )


_TERM = re.compile(r"^x(\d+)(?:\^(\d+))?$")


def parse_monomials(text: str | Sequence[str], *, m: int) -> Monomials:
    """Parse monomials such as "1, x2, x2^3, x1, x1^2*x2" (1-based variables) into Monomials."""
    parts = [p.strip() for p in text.split(",")] if isinstance(text, str) else list(text)
    sparse = []
    for part in parts:
        exps: dict[int, int] = {}
        if part.replace(" ", "") != "1":
            for factor in part.replace(" ", "").split("*"):
                match = _TERM.match(factor)
                if match is None:
                    raise ValueError(
                        f"cannot parse monomial {part!r}: expected '1' or factors like x3 or x3^2 "
                        f"joined by '*', got factor {factor!r}"
                    )
                v, e = int(match.group(1)), int(match.group(2) or 1)
                if not 1 <= v <= m:
                    raise ValueError(f"monomial {part!r}: variable x{v} is not in x1..x{m}")
                if e < 1:
                    raise ValueError(f"monomial {part!r}: exponent of x{v} must be >= 1, got {e}")
                exps[v - 1] = exps.get(v - 1, 0) + e
        sparse.append(tuple(sorted(exps.items())))
    return Monomials(m=m, sparse=sparse)


def format_monomial(monomial: SparseMonomial | Monomial) -> str:
    """ "x1^2*x2" for a sparse or dense monomial (1-based variable names); "1" for the constant."""
    sparse = _as_sparse(monomial)
    if not sparse:
        return "1"
    return "*".join(f"x{v + 1}" if e == 1 else f"x{v + 1}^{e}" for v, e in sparse)


def _as_sparse(monomial: SparseMonomial | Monomial) -> SparseMonomial:
    if all(isinstance(t, tuple) for t in monomial):
        return tuple(monomial)  # type: ignore[arg-type]
    return tuple((v, int(e)) for v, e in enumerate(monomial) if e)  # type: ignore[arg-type]


def _term_order(sparse: SparseMonomial) -> tuple[int, tuple[int, ...]]:
    # Descending degree, then lexicographically descending exponents (x1^2*x2 before x2^3).
    degree = sum(e for _, e in sparse)
    key: list[int] = []
    for v, e in sparse:
        key += [v, -e]
    return (-degree, tuple(key))


def format_polynomial(
    poly: Mapping[Monomial, float] | Mapping[SparseMonomial, float],
    *,
    digits: int = 3,
    max_terms: int | None = None,
) -> str:
    """Human form, e.g. "5.853*x1^2*x2 - 1.237*x2^3 + 0.708*x1 - 0.665*x2 + 0.090".

    Terms are ordered by descending degree, then x1 before x2; terms that print as zero are dropped.
    """
    terms = [(_as_sparse(k), float(c)) for k, c in poly.items()]
    terms.sort(key=lambda t: _term_order(t[0]))
    out: list[str] = []
    for sparse, coef in terms:
        magnitude = f"{abs(coef):.{digits}f}"
        if float(magnitude) == 0.0:
            continue
        body = magnitude if not sparse else f"{magnitude}*{format_monomial(sparse)}"
        if not out:
            out.append(f"-{body}" if coef < 0 else body)
        else:
            out.append(f"- {body}" if coef < 0 else f"+ {body}")
    if max_terms is not None and len(out) > max_terms:
        out = [*out[:max_terms], f"... ({len(out) - max_terms} more terms)"]
    return " ".join(out) if out else f"{0:.{digits}f}"


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_nonnegative_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
