"""Sec. 5.1: the 2-D perturbing function for (K, m, N) = (3, 2, 5) at gamma = 1."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from efpsn.experiments.common import (
    Column,
    finish,
    format_table,
    output_dir,
    pyplot,
    save_figure,
    stopwatch,
)
from efpsn.masks.zero_sum import NoiseSpec
from efpsn.perturbation.basis import OrthonormalSystem
from efpsn.perturbation.monomials import parse_monomials

NAME = "perturbation"
PAPER_MONOMIALS = "1, x2, x2^3, x1, x1^2*x2"
PAPER_ETA: tuple[float, ...] = (0.180, 0.628, -0.374, 0.817, 2.015)
PAPER_PRINTED = "5.853*x1^2*x2 - 2.137*x2^3 + 0.708*x1 - 1.310*x2 + 0.090"
"""The function as printed in the paper; its x2^3 and x2 coefficients are typos."""
CORRECT = "5.853*x1^2*x2 - 1.237*x2^3 + 0.708*x1 - 0.665*x2 + 0.090"
"""sum_k eta_k e_k for the paper's system and noise sequence (tests/test_basis.py derives it by
hand from Legendre polynomials)."""


@dataclass(frozen=True, kw_only=True)
class PerturbationSettings:
    """The paper's example plus, optionally, a fresh draw eta_k ~ N(0, gamma / k^p)."""

    profile: str = "full"
    gamma: float = 1.0
    p: float = 1.0
    fresh_seed: int | None = 0
    grid: int = 121


PROFILES: dict[str, PerturbationSettings] = {
    "full": PerturbationSettings(),
    "quick": PerturbationSettings(profile="quick", grid=61),
}


def paper_system() -> OrthonormalSystem:
    """Gram-Schmidt of [1, x2, x2^3, x1, x1^2 x2] on [-1, 1]^2 (Lebesgue), the paper's order."""
    return OrthonormalSystem.from_monomials(parse_monomials(PAPER_MONOMIALS, m=2))


def fresh_eta(settings: PerturbationSettings) -> np.ndarray:
    """eta_k ~ N(0, sigma_k^2), sigma_k^2 = gamma / k^p, from default_rng(fresh_seed)."""
    spec = NoiseSpec(gamma=settings.gamma, p=settings.p, precision=6, num_coefficients=5)
    rng = np.random.default_rng(settings.fresh_seed)
    return rng.standard_normal(5) * np.sqrt(spec.sigma2())


def _coefficients(system: OrthonormalSystem, eta: np.ndarray) -> dict[str, float]:
    """{monomial: coefficient} of Phi(eta), in the paper's monomial order."""
    values = system.monomial_coefficients(eta).tolist()
    return dict(zip(PAPER_MONOMIALS.split(", "), values, strict=True))


def _plot(system: OrthonormalSystem, cases: list[tuple[str, np.ndarray]], grid: int,
          path: Path) -> Path:
    axis = np.linspace(-1.0, 1.0, grid)
    x1, x2 = np.meshgrid(axis, axis)
    points = np.stack([x1, x2], axis=-1)
    fig = pyplot().figure(figsize=(8.4, 3.4 * len(cases)))
    for row, (title, eta) in enumerate(cases):
        values = system.evaluate(points) @ eta
        ax = fig.add_subplot(len(cases), 2, 2 * row + 1)
        filled = ax.contourf(x1, x2, values, levels=20, cmap="coolwarm")
        ax.contour(x1, x2, values, levels=10, colors="k", linewidths=0.4)
        fig.colorbar(filled, ax=ax)
        ax.set_xlabel("$x_1$")
        ax.set_ylabel("$x_2$")
        ax.set_title(title, fontsize=8)
        ax3 = fig.add_subplot(len(cases), 2, 2 * row + 2, projection="3d")
        ax3.plot_surface(x1, x2, values, cmap="coolwarm", linewidth=0, antialiased=True)
        ax3.set_xlabel("$x_1$")
        ax3.set_ylabel("$x_2$")
        ax3.set_title(system.format_polynomial(eta), fontsize=7)
    fig.subplots_adjust(hspace=0.35)
    return save_figure(fig, path)


def run(settings: PerturbationSettings, *, out: str | Path | None = None,
        figures_to: str | Path | None = None) -> dict[str, Any]:
    """Print the basis and the function, plot it on [-1, 1]^2."""
    folder = output_dir(out, NAME)
    with stopwatch() as elapsed:
        system = paper_system()
        eta = np.array(PAPER_ETA)
        cases = [("paper's noise sequence {0.180, 0.628, -0.374, 0.817, 2.015}", eta)]
        rows: list[dict[str, Any]] = [{
            "case": "paper", "eta": list(PAPER_ETA),
            "function": system.format_polynomial(eta),
            "paper_printed": PAPER_PRINTED,
            "coefficients": _coefficients(system, eta),
        }]
        if settings.fresh_seed is not None:
            drawn = fresh_eta(settings)
            title = (f"fresh draw: eta_k ~ N(0, {settings.gamma:g}/k^{settings.p:g}), "
                     f"seed {settings.fresh_seed}")
            cases.append((title, drawn))
            rows.append({"case": f"fresh (seed {settings.fresh_seed})",
                         "eta": [round(float(v), 6) for v in drawn],
                         "function": system.format_polynomial(drawn), "paper_printed": "",
                         "coefficients": _coefficients(system, drawn)})
        figures = [_plot(system, cases, settings.grid, folder / "perturbation.png")]
        basis = system.format_basis()
        table = "\n".join([
            f"orthonormal system (Lebesgue, [-1,1]^2), monomials [{PAPER_MONOMIALS}]:",
            f"  {basis}",
            format_table(rows, [Column("case", "case"),
                                Column("eta", "eta", lambda e: ", ".join(f"{v:.3f}" for v in e)),
                                Column("function", "Phi(eta)(x1, x2)")]),
            f"the paper prints  {PAPER_PRINTED}",
            f"we compute        {rows[0]['function']}",
            ("(the paper's x2^3 and x2 coefficients are typos: -2.137 is -1.237 with two digits "
             "swapped; the x2 coefficient 0.628*0.866 + 0.374*1.984 - 2.015*0.968 = -0.665)"),
        ])
        payload = {"settings": settings.__dict__, "basis": basis, "matches_pinned":
                   rows[0]["function"] == CORRECT}
        wall = elapsed()
    csv_rows = [{**r, "eta": " ".join(f"{v:.6g}" for v in r["eta"]),
                 "coefficients": "; ".join(f"{k}: {v:.6f}" for k, v in r["coefficients"].items())}
                for r in rows]
    summary = finish(folder, NAME, payload=payload, rows=csv_rows, table=table, figures=figures,
                     wall_seconds=wall, figures_to=figures_to)
    summary["function"] = rows[0]["function"]
    return summary
