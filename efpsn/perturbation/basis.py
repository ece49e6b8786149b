"""The exact Gram matrix of monomials on [-1, 1]^m and the orthonormal system e_1..e_N.

The monomials themselves (families, choice, parsing, printing) live in
efpsn/perturbation/monomials.py."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from fractions import Fraction

import numpy as np
import scipy.sparse

from efpsn.perturbation.monomials import (
    Monomial,
    Monomials,
    SparseMonomial,
    format_monomial,
    format_polynomial,
)
from efpsn.perturbation.selection import Measure

__all__ = ["OrthonormalSystem"]


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
        self._transposed: scipy.sparse.csc_array | None = None
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
        if self._transposed is None:  # built once: the same C^T, product and sums every call
            self._transposed = self._coefficients.T
        return np.asarray(self._transposed @ eta_arr, dtype=np.float64)

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
