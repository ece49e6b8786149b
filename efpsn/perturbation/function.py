"""The functional perturbation Phi(eta_bar)(x_S) on selected parameters: value and gradient."""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import numpy as np
import torch

from efpsn.perturbation.basis import OrthonormalSystem
from efpsn.perturbation.selection import parse_selection

__all__ = ["FunctionalPerturbation", "select_indices"]


def select_indices(
    spec: str,
    *,
    num_params: int,
    m: int,
    last_bias: Sequence[int] | None = None,
    seed: int = 0,
) -> np.ndarray:
    """The m flat (0-based) parameter indices the perturbation acts on, as int64.

    spec (any of them may end in "@lebesgue" or "@uniform", which only chooses the measure):
      "last-bias"         the last-layer bias (``last_bias``, from the task); needs m of them;
      "random"            ``default_rng(seed).choice(num_params, m, replace=False)``, sorted;
      "random:M"          the same draw with m = M (and the uniform measure by default);
      "indices:3,17,42"   explicit 0-based flat indices, in the given order (x1 is the first);
      "all"               every parameter, in order; m must equal num_params.
    """
    if (
        isinstance(num_params, bool)
        or not isinstance(num_params, (int, np.integer))
        or num_params < 1
    ):
        raise ValueError(f"num_params must be a positive integer, got {num_params!r}")
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise ValueError(
            f"m (number of perturbed parameters) must be a positive integer, got {m!r}"
        )
    if m > num_params:
        raise ValueError(f"cannot perturb m = {m} parameters of a model with {num_params}")
    selection = parse_selection(spec)
    if selection.kind == "last-bias":
        if last_bias is None:
            raise ValueError(
                "selection 'last-bias' needs the task's last-layer bias indices, got None"
            )
        chosen = _validated(last_bias, num_params=num_params, what="last-layer bias indices")
        if len(chosen) != m:
            raise ValueError(
                f"selection 'last-bias': the last layer has {len(chosen)} bias parameters but "
                f"m = {m}; set m = {len(chosen)} or choose another selection"
            )
        return chosen
    if selection.kind in ("random", "random:M"):
        if selection.count is not None and selection.count != m:
            raise ValueError(
                f"selection {spec!r} perturbs {selection.count} parameters, but m = {m}; set "
                f"m = {selection.count} (and N, e.g. N = m + 1 for every affine function)"
            )
        rng = np.random.default_rng(seed)
        return np.sort(rng.choice(num_params, size=m, replace=False)).astype(np.int64)
    if selection.kind == "all":
        if m != num_params:
            raise ValueError(
                f"selection 'all' perturbs all {num_params} parameters, but m = {m}; set "
                f"m = {num_params} (and N, e.g. N = {num_params + 1} for every affine function)"
            )
        return np.arange(num_params, dtype=np.int64)
    assert selection.indices is not None
    chosen = _validated(selection.indices, num_params=num_params, what=f"selection {spec!r}")
    if len(chosen) != m:
        raise ValueError(f"selection {spec!r} names {len(chosen)} parameters, expected m = {m}")
    return chosen


def _validated(indices: Sequence[int], *, num_params: int, what: str) -> np.ndarray:
    arr = np.asarray(list(indices))
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise ValueError(f"{what}: expected a list of integers, got {list(indices)!r}")
    arr = arr.astype(np.int64)
    bad = arr[(arr < 0) | (arr >= num_params)]
    if bad.size:
        raise ValueError(f"{what}: indices must be in [0, {num_params}), got {bad.tolist()}")
    values, counts = np.unique(arr, return_counts=True)
    if (counts > 1).any():
        raise ValueError(
            f"{what}: indices must be distinct, repeated: {values[counts > 1].tolist()}"
        )
    return arr


class FunctionalPerturbation:
    """Phi(eta)(x[indices]) = sum_k eta_k e_k(x_S), written once in the monomial basis.

    With p = C^T eta (the polynomial's monomial coefficients) and exponent slots (V, E),
    Phi(x_S) = sum_l p_l prod_j x_S[V_lj]^E_lj: a gather and a product, float64. The domain is
    [-1, 1]^m; outside it this is simply the same polynomial. When every monomial has degree <= 1
    the perturbation is affine and its gradient a constant vector, computed once and cached.
    """

    def __init__(
        self,
        *,
        system: OrthonormalSystem,
        indices: np.ndarray | Sequence[int],
        eta: np.ndarray | Sequence[float],
    ) -> None:
        idx = np.asarray(indices)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise ValueError(
                f"indices must be a 1-D integer array, got shape {idx.shape}, dtype {idx.dtype}"
            )
        if idx.size != system.m:
            raise ValueError(f"the system has m = {system.m} variables but {idx.size} indices came")
        if (idx < 0).any():
            raise ValueError(f"indices must be >= 0, got {idx[idx < 0].tolist()}")
        if np.unique(idx).size != idx.size:
            raise ValueError("indices must be distinct")
        self._system = system
        self._indices_np = idx.astype(np.int64)
        self._indices = torch.from_numpy(self._indices_np.copy())
        self._max_index = int(self._indices_np.max())
        # A contiguous ascending run (the last-layer bias, or "all") is read as a slice: a view,
        # no gather kernel.
        start = int(self._indices_np[0])
        contiguous = np.array_equal(self._indices_np, np.arange(start, start + idx.size))
        self._slice: tuple[int, int] | None = (start, idx.size) if contiguous else None
        variables, exponents = system.exponent_slots
        self._variables = torch.from_numpy(variables.copy())
        self._exponents = torch.from_numpy(exponents.copy()).to(torch.float64)
        self._affine = system.max_degree <= 1
        self._direct: tuple[np.ndarray, np.ndarray, tuple[int, float] | None] | None = None
        if self._affine:  # where Phi's constant and linear parts sit among the monomials
            degree = exponents.sum(axis=1)
            self._constant_rows = np.flatnonzero(degree == 0)
            self._linear_rows = np.flatnonzero(degree == 1)
            self._linear_vars = variables[self._linear_rows, 0]
            self._distinct = np.unique(self._linear_vars).size == self._linear_vars.size
            # every variable in exactly one linear monomial (the defaults: K = 1, all
            # parameters): g[v] = coeffs[row of v], one gather instead of zeros and a scatter
            self._linear_order: np.ndarray | None = None
            if self._distinct and self._linear_vars.size == system.m:
                self._linear_order = np.empty(system.m, dtype=np.int64)
                self._linear_order[self._linear_vars] = self._linear_rows
            self._direct = _direct_map(system, self._constant_rows, self._linear_order)
        self._set_eta(eta)

    def _set_eta(self, eta: np.ndarray | Sequence[float], *, owned: bool = False) -> None:
        """Check eta and derive what depends on it (the rest depends on system and indices).
        `owned`: eta is a float64 array nobody else holds, kept without a copy."""
        system = self._system
        eta_arr = np.asarray(eta, dtype=np.float64)
        if eta_arr.shape != (system.size,):
            raise ValueError(
                f"expected eta of shape ({system.size},) (one per basis function), "
                f"got {eta_arr.shape}"
            )
        # max and min propagate NaN and show +-inf: two reductions, no array of flags
        if eta_arr.size and not (math.isfinite(eta_arr.max()) and math.isfinite(eta_arr.min())):
            raise ValueError("eta must be finite")
        self._eta = eta_arr if owned and eta_arr is eta else eta_arr.copy()
        self._eta.setflags(write=False)
        self._grad_cache: dict[tuple[int, torch.device], torch.Tensor] = {}
        if self._affine and self._direct is not None:
            # C^T a scaled permutation on the constant and linear monomials (the defaults):
            # p_r = 0 + C_kr eta_k, as the sparse product adds it; then + 0.0, as below
            sources, scales, constant = self._direct
            g = np.take(self._eta, sources)
            np.multiply(g, scales, out=g)
            np.add(g, 0.0, out=g)
            self._constant = 0.0 if constant is None else float(
                0.0 + constant[1] * self._eta[constant[0]])
            self._linear = torch.from_numpy(g)
            self._p_tensor: torch.Tensor | None = None  # the monomial coefficients, if asked
            return
        coeffs = system.monomial_coefficients(eta_arr)  # a new array: no copy needed
        self._p_tensor = torch.from_numpy(coeffs)
        if self._affine:
            # Phi(x_S) = p_const + sum_v g_v x_S[v]: split constant and linear parts once.
            self._constant = float(coeffs[self._constant_rows].sum())
            if self._linear_order is not None:  # the same values as the scatter below
                g = coeffs[self._linear_order]
                np.add(g, 0.0, out=g)  # c + 0, as np.add.at gives it (-0.0 becomes 0.0)
            elif self._distinct:  # 0 + c, as np.add.at gives it (-0.0 becomes 0.0)
                g = np.zeros(system.m, dtype=np.float64)
                g[self._linear_vars] = coeffs[self._linear_rows] + 0.0
            else:
                g = np.zeros(system.m, dtype=np.float64)
                np.add.at(g, self._linear_vars, coeffs[self._linear_rows])
            self._linear = torch.from_numpy(g)

    @property
    def _p(self) -> torch.Tensor:
        """The monomial coefficients p = C^T eta (computed when first asked on the direct
        path, which never needs them)."""
        if self._p_tensor is None:
            self._p_tensor = torch.from_numpy(self._system.monomial_coefficients(self._eta))
        return self._p_tensor

    def with_eta(self, eta: np.ndarray | Sequence[float], *,
                 owned: bool = False) -> FunctionalPerturbation:
        """The same system and indices with other coefficients (a refreshed mask's next period),
        without checking and converting the indices again. `owned`: eta is a new float64
        array the caller gives away (kept without a copy)."""
        other = copy.copy(self)
        other._set_eta(eta, owned=owned)
        return other

    @property
    def system(self) -> OrthonormalSystem:
        """The orthonormal system e_1..e_N."""
        return self._system

    @property
    def indices(self) -> np.ndarray:
        """The perturbed flat parameter indices (x1 is x[indices[0]])."""
        return self._indices_np.copy()

    @property
    def eta(self) -> np.ndarray:
        """The coefficients eta_1..eta_N (read-only)."""
        return self._eta

    @property
    def is_affine(self) -> bool:
        """True when every monomial has degree <= 1 (constant gradient)."""
        return self._affine

    def _select(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1)
        if self._max_index >= flat.numel():
            raise ValueError(
                f"x has {flat.numel()} entries but the perturbation uses index {self._max_index}"
            )
        flat = flat.to(torch.float64)
        if self._slice is not None:
            return flat.narrow(0, *self._slice)
        return flat[self._indices.to(flat.device)]

    def _scatter(self, full: torch.Tensor, values: torch.Tensor) -> None:
        if self._slice is not None:
            full.narrow(0, *self._slice).copy_(values)
        else:
            full[self._indices.to(full.device)] = values

    def value(self, x: torch.Tensor) -> torch.Tensor:
        """Phi(eta)(x[indices]) as a differentiable float64 scalar."""
        xs = self._select(x)
        # Multiply-and-sum rather than torch.dot: BLAS dot spins its threads, which costs
        # milliseconds when the CPUs are busy with other agents.
        if self._affine:
            return self._constant + (self._linear.to(xs.device) * xs).sum()
        base = xs[self._variables.to(xs.device)]  # (N, s)
        powers = base ** self._exponents.to(xs.device)  # padded slots give x^0 = 1
        return (self._p.to(xs.device) * powers.prod(dim=1)).sum()

    def add_gradient(self, grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """grad + gradient(x), the same float64 values. An affine perturbation of every
        parameter (the defaults: selection all, K = 1) adds its linear part directly: the
        gradient is that vector, so the zeros, the scatter and the copy are skipped."""
        if (self._affine and self._slice == (0, x.numel()) and grad.dtype == torch.float64
                and x.dtype == torch.float64 and grad.shape == x.shape):
            return grad + self._linear.to(grad.device).view(grad.shape)
        return grad + self.gradient(x)

    def add_gradient_(self, grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """add_gradient into `grad` itself (a gradient its caller owns), returned: the same
        bits without a new vector."""
        if (self._affine and self._slice == (0, x.numel()) and grad.dtype == torch.float64
                and x.dtype == torch.float64 and grad.shape == x.shape
                and grad.device.type == "cpu" and not grad.requires_grad):
            values = grad.numpy()
            np.add(values, self._linear.numpy().reshape(values.shape), out=values)
            return grad
        return self.add_gradient(grad, x)

    def gradient(self, x: torch.Tensor) -> torch.Tensor:
        """d Phi / dx: float64, same shape as x, zero off the selected indices (no autograd)."""
        numel = x.numel()
        if self._affine:
            key = (numel, x.device)
            cached = self._grad_cache.get(key)
            if cached is None:
                self._select(x)  # validates the size
                cached = torch.zeros(numel, dtype=torch.float64, device=x.device)
                self._scatter(cached, self._linear.to(x.device))
                self._grad_cache[key] = cached
            return cached.clone().reshape(x.shape)
        with torch.no_grad():
            xs = self._select(x.detach())
            device = xs.device
            variables = self._variables.to(device)
            exps = self._exponents.to(device)
            base = xs[variables]
            powers = base**exps
            p = self._p.to(device)
            grad_s = torch.zeros_like(xs)
            # d/dx_v prod_j x_{V_j}^{E_j} = sum over slots j with V_j = v of
            #   E_j x_v^(E_j - 1) prod_{i != j} x_{V_i}^{E_i}; padded slots have E_j = 0.
            for j in range(variables.shape[1]):
                others = torch.ones_like(p)
                for i in range(variables.shape[1]):
                    if i != j:
                        others = others * powers[:, i]
                deriv = exps[:, j] * base[:, j] ** torch.clamp(exps[:, j] - 1, min=0)
                grad_s.index_add_(0, variables[:, j], p * deriv * others)
            full = torch.zeros(numel, dtype=torch.float64, device=device)
            self._scatter(full, grad_s)
        return full.reshape(x.shape)

    def __repr__(self) -> str:
        return (
            f"FunctionalPerturbation(m={self._system.m}, N={self._system.size}, "
            f"affine={self._affine})"
        )


def _direct_map(system: OrthonormalSystem, constant_rows: np.ndarray,
                linear_order: np.ndarray | None
                ) -> tuple[np.ndarray, np.ndarray, tuple[int, float] | None] | None:
    """When every variable has one linear monomial (linear_order) and every column of C that
    the constant and linear parts read holds one non-zero (so p_r = 0 + C_kr eta_k exactly,
    one product: a scaled permutation, as Legendre's K = 1 system is), the linear part's
    sources k and scales C_kr in variable order, and the constant's (k, C_kr) (None: it has
    no monomial, or its column is empty); else None (the sparse product C^T eta is used)."""
    if linear_order is None or constant_rows.size > 1:
        return None
    columns = system.coefficient_matrix().tocsc()
    counts = np.diff(columns.indptr)
    if np.any(counts[linear_order] != 1) or np.any(counts[constant_rows] > 1):
        return None
    starts = columns.indptr[linear_order]
    sources = columns.indices[starts].astype(np.int64)
    scales = np.ascontiguousarray(columns.data[starts], dtype=np.float64)
    constant = None
    if constant_rows.size and counts[constant_rows[0]] == 1:
        at = columns.indptr[constant_rows[0]]
        constant = (int(columns.indices[at]), float(columns.data[at]))
    return sources, scales, constant
