"""Monomials, their exact Gram matrix on [-1, 1]^m and the orthonormal system e_1..e_N."""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from fractions import Fraction
from typing import Literal, overload

import numpy as np
import scipy.sparse

__all__ = [
    "MAX_CANDIDATES",
    "Measure",
    "Monomial",
    "Monomials",
    "OrthonormalSystem",
    "SparseMonomial",
    "candidate_monomials",
    "choose_monomials",
    "count_monomials",
    "format_monomial",
    "format_polynomial",
    "parse_monomials",
    "power_monomials",
]

Monomial = tuple[int, ...]
"""Exponents (a_1, ..., a_m) of x_1^a_1 * ... * x_m^a_m (variables are 1-based for humans only)."""

SparseMonomial = tuple[tuple[int, int], ...]
"""((variable, exponent), ...) with 0-based variables ascending and exponents >= 1; () is 1."""

Measure = Literal["lebesgue", "uniform"]

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


# --------------------------------------------------------------------------------------------
# The orthonormal system
# --------------------------------------------------------------------------------------------


def _gram_entry(a: Mapping[int, int], b: Mapping[int, int]) -> Fraction:
    """<x^a, x^b> under the uniform probability measure on [-1, 1]^m, exactly.

    Per variable, (1/2) * integral_{-1}^{1} x^s dx = 1/(s + 1) if s is even, else 0; variables
    outside both supports have s = 0 and contribute 1. (Lebesgue = 2^m times this.)
    """
    den = 1
    for v in a.keys() | b.keys():
        s = a.get(v, 0) + b.get(v, 0)
        if s % 2:
            return Fraction(0)
        den *= s + 1
    return Fraction(1, den)


def _orthogonalise_block(gram: list[list[Fraction]]) -> tuple[list[list[Fraction]], list[Fraction]]:
    """Exact Gram-Schmidt on a Gram matrix: u_k = sum_t U[k][t] b_t with <u_k, u_l> = d_k [k == l].

    U is unit lower triangular (U = L^-1 for the LDL^T factorisation G = L D L^T), so the
    orthonormal functions are e_k = u_k / sqrt(d_k): the inverse of the Cholesky factor, computed
    in rational arithmetic (the monomial Gram matrix is Hilbert-like and floats would lose digits).
    """
    size = len(gram)
    U: list[list[Fraction]] = []
    d: list[Fraction] = []
    for k in range(size):
        row = [Fraction(0)] * size
        row[k] = Fraction(1)
        for i in range(k):
            # <u_i, b_k> = sum_t U[i][t] <b_t, b_k>; subtract the projection of b_k on u_i.
            proj = sum((U[i][t] * gram[t][k] for t in range(i + 1) if U[i][t]), Fraction(0))
            if proj:
                c = proj / d[i]
                for t in range(i + 1):
                    if U[i][t]:
                        row[t] -= c * U[i][t]
        # u_k - b_k lies in span(u_1..u_{k-1}), which is orthogonal to u_k: <u_k,u_k> = <u_k,b_k>.
        norm2 = sum((row[t] * gram[t][k] for t in range(k + 1) if row[t]), Fraction(0))
        if norm2 <= 0:
            raise ValueError(f"block position {k}: monomial is linearly dependent on earlier ones")
        U.append(row)
        d.append(norm2)
    return U, d


class OrthonormalSystem:
    """Gram-Schmidt of the given monomials in L2([-1, 1]^m): e_k = sum_l C[k, l] * monomial_l.

    Monomials with different parity vectors (a mod 2) are orthogonal, so the Gram matrix is block
    diagonal over parity classes and Gram-Schmidt runs independently (and exactly) per block; C is
    stored sparse. ``measure="lebesgue"`` (the paper; <1, 1> = 2^m) or ``"uniform"`` (the
    probability measure 2^-m dx, whose functions are 2^(m/2) times larger; needed for large m,
    where 2^(-m/2) underflows float64).
    """

    def __init__(
        self,
        *,
        monomials: Monomials,
        coefficients: scipy.sparse.csr_array,
        blocks: tuple[tuple[int, ...], ...],
        measure: Measure,
    ) -> None:
        self._monomials = monomials
        self._coefficients = coefficients
        self._blocks = blocks
        self._measure: Measure = measure
        size = len(monomials)
        width = max(1, max(len(s) for s in monomials.sparse_terms))
        # Exponent slots: monomial l = prod_s x[variables[l, s]] ** exponents[l, s], padded with
        # (variable 0, exponent 0), i.e. a factor of 1.
        variables = np.zeros((size, width), dtype=np.int64)
        exponents = np.zeros((size, width), dtype=np.int64)
        for row, s in enumerate(monomials.sparse_terms):
            for j, (v, e) in enumerate(s):
                variables[row, j] = v
                exponents[row, j] = e
        variables.setflags(write=False)
        exponents.setflags(write=False)
        self._variables = variables
        self._exponents = exponents

    @classmethod
    def from_monomials(
        cls, monomials: Sequence[Monomial] | Monomials, *, measure: Measure = "lebesgue"
    ) -> OrthonormalSystem:
        """Orthonormalise the monomials in the given order (the first becomes e_1)."""
        if measure not in ("lebesgue", "uniform"):
            raise ValueError(f"measure must be 'lebesgue' or 'uniform', got {measure!r}")
        monos = Monomials.from_dense(monomials)
        m = monos.m
        first_seen: dict[SparseMonomial, int] = {}
        for i, s in enumerate(monos.sparse_terms):
            if s in first_seen:
                raise ValueError(
                    f"monomial {format_monomial(s)} appears twice (positions {first_seen[s]} and "
                    f"{i}): the system would be linearly dependent"
                )
            first_seen[s] = i

        # Parity classes, each in the given order.
        classes: dict[tuple[int, ...], list[int]] = {}
        for i, s in enumerate(monos.sparse_terms):
            classes.setdefault(tuple(v for v, e in s if e % 2), []).append(i)
        blocks = tuple(tuple(b) for b in classes.values())

        # Lebesgue inner products are 2^m times the uniform ones, so its d_k is 2^m times larger.
        scale = Fraction(1 << m) if measure == "lebesgue" else Fraction(1)
        rows: list[int] = []
        cols: list[int] = []
        vals: list[float] = []

        def emit(block: Sequence[int], *, skip: int | None = None) -> None:
            # Exact Gram-Schmidt of the monomials at `block` (positions, in order); append the
            # rows of C for every position except `skip`.
            exps = [dict(monos.sparse(i)) for i in block]
            gram = [[_gram_entry(a, b) for b in exps] for a in exps]
            try:
                U, d = _orthogonalise_block(gram)
            except ValueError as err:  # pragma: no cover - distinct monomials are independent
                raise ValueError(
                    f"monomials {[format_monomial(monos.sparse(i)) for i in block]}: {err}"
                ) from err
            for k, (row, dk) in enumerate(zip(U, d, strict=True)):
                if block[k] == skip:
                    continue
                for t in range(k + 1):
                    if not row[t]:
                        continue
                    # C = U[k][t] / sqrt(d_k): square exactly, round once, take the float sqrt.
                    square = float(row[t] * row[t] / (dk * scale))
                    if square < sys.float_info.min:
                        raise ValueError(
                            f"with m = {m} variables under the Lebesgue measure the orthonormal "
                            f"functions carry the factor 2^(-m/2) = 2^-{m / 2:g}, which "
                            f"underflows float64 (the perturbation would silently be zero); use "
                            f"measure='uniform' (selection suffix '@uniform') or fewer variables"
                        )
                    rows.append(block[k])
                    cols.append(block[t])
                    vals.append(math.copysign(math.sqrt(square), row[t]))

        univariate = not monos.sparse(0) and all(len(s) <= 1 for s in monos.sparse_terms)
        if univariate:
            # The constant first, then powers of single variables (e.g. power_monomials): the
            # result of Gram-Schmidt on x_v^e is its Gram-Schmidt against 1 and the earlier powers
            # of x_v only. (Earlier functions of another variable w are, after orthogonalising
            # against the constant, mean-zero functions of x_w; under the product measure they
            # are orthogonal to every function of x_v.) So each variable is its own small problem,
            # and the dense parity class {1, x_1^2, x_2^2, ...} never needs its Gram matrix.
            emit([0])
            per_variable: dict[int, list[int]] = {}
            for i, s in enumerate(monos.sparse_terms[1:], start=1):
                per_variable.setdefault(s[0][0], []).append(i)
            for positions in per_variable.values():
                even = [i for i in positions if monos.sparse(i)[0][1] % 2 == 0]
                odd = [i for i in positions if monos.sparse(i)[0][1] % 2]
                if even:
                    emit([0, *even], skip=0)
                if odd:
                    emit(odd)
        else:
            for block in blocks:
                emit(block)
        size = len(monos)
        coefficients = scipy.sparse.csr_array(
            (np.asarray(vals, dtype=np.float64), (np.asarray(rows), np.asarray(cols))),
            shape=(size, size),
        )
        return cls(monomials=monos, coefficients=coefficients, blocks=blocks, measure=measure)

    @property
    def monomials(self) -> Monomials:
        """The monomials, in Gram-Schmidt order."""
        return self._monomials

    @property
    def m(self) -> int:
        """Number of variables."""
        return self._monomials.m

    @property
    def size(self) -> int:
        """Number N of orthonormal functions."""
        return len(self._monomials)

    def __len__(self) -> int:
        return self.size

    @property
    def measure(self) -> Measure:
        """The measure on [-1, 1]^m the functions are orthonormal for."""
        return self._measure

    @property
    def blocks(self) -> tuple[tuple[int, ...], ...]:
        """Positions of the monomials in each parity class (the independent Gram-Schmidt blocks)."""
        return self._blocks

    @property
    def max_degree(self) -> int:
        """Largest total degree among the monomials."""
        return int(self._exponents.sum(axis=1).max())

    @property
    def exponent_slots(self) -> tuple[np.ndarray, np.ndarray]:
        """(V, E), both (N, s): monomial l = prod_j x[V[l, j]] ** E[l, j] (padding: exponent 0)."""
        return self._variables, self._exponents

    def coefficient_matrix(self) -> scipy.sparse.csr_array:
        """C as a sparse (N, N) matrix (a copy): row k holds e_k in the monomial basis."""
        return self._coefficients.copy()

    def monomial_values(self, xs: np.ndarray) -> np.ndarray:
        """Values of the monomials at points xs of shape (..., m): shape (..., N)."""
        xs = np.asarray(xs, dtype=np.float64)
        if xs.ndim == 0 or xs.shape[-1] != self.m:
            raise ValueError(f"expected points of shape (..., {self.m}), got shape {xs.shape}")
        return np.prod(xs[..., self._variables] ** self._exponents, axis=-1)

    def evaluate(self, xs: np.ndarray) -> np.ndarray:
        """Values of e_1..e_N at points xs of shape (..., m): shape (..., N)."""
        mono = self.monomial_values(xs)
        flat = mono.reshape(-1, self.size)
        values = (self._coefficients @ flat.T).T
        return np.asarray(values).reshape(mono.shape)

    def monomial_coefficients(self, eta: np.ndarray | Sequence[float]) -> np.ndarray:
        """Phi(eta) = sum_k eta_k e_k written in the monomial basis: p = C^T eta, shape (N,)."""
        eta_arr = np.asarray(eta, dtype=np.float64)
        if eta_arr.shape != (self.size,):
            raise ValueError(f"expected {self.size} coefficients eta, got shape {eta_arr.shape}")
        return np.asarray(self._coefficients.T @ eta_arr, dtype=np.float64)

    def polynomial(self, eta: np.ndarray | Sequence[float]) -> dict[Monomial, float]:
        """Phi(eta) as {dense monomial: coefficient}, in the system's monomial order."""
        p = self.monomial_coefficients(eta)
        return {self._monomials.dense(i): float(p[i]) for i in range(self.size)}

    def basis_polynomial(self, k: int) -> dict[Monomial, float]:
        """e_k (1-based k) as {dense monomial: coefficient} (non-zero terms only)."""
        if not 1 <= k <= self.size:
            raise ValueError(f"basis function index k must be in 1..{self.size}, got {k}")
        row = self._coefficients[[k - 1], :].tocoo()
        return {
            self._monomials.dense(int(c)): float(v) for c, v in zip(row.col, row.data, strict=True)
        }

    def format_polynomial(
        self, eta: np.ndarray | Sequence[float], *, digits: int = 3, max_terms: int | None = None
    ) -> str:
        """Phi(eta) in human form, e.g. "5.853*x1^2*x2 - 1.237*x2^3 + ..."."""
        p = self.monomial_coefficients(eta)
        terms = {self._monomials.sparse(i): float(p[i]) for i in range(self.size)}
        return format_polynomial(terms, digits=digits, max_terms=max_terms)

    def format_basis(self, *, digits: int = 3, max_terms: int | None = None) -> str:
        """ "{0.500, 0.866*x2, 3.307*x2^3 - 1.984*x2, ...}" (e_1..e_N)."""
        coo = self._coefficients.tocoo()
        per_row: list[dict[SparseMonomial, float]] = [{} for _ in range(self.size)]
        for r, c, v in zip(coo.row, coo.col, coo.data, strict=True):
            per_row[int(r)][self._monomials.sparse(int(c))] = float(v)
        shown = [format_polynomial(t, digits=digits) for t in per_row]
        if max_terms is not None and len(shown) > max_terms:
            shown = [*shown[:max_terms], f"... ({len(shown) - max_terms} more)"]
        return "{" + ", ".join(shown) + "}"

    def __repr__(self) -> str:
        return (
            f"OrthonormalSystem(m={self.m}, N={self.size}, max_degree={self.max_degree}, "
            f"measure={self._measure!r}, blocks={len(self._blocks)})"
        )


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_nonnegative_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
