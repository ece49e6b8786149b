"""Reproductions of the paper's evaluation (Sec. 5): one module per experiment, one command each.

Each experiment module exposes `PROFILES` (at least "full", the paper's settings, and "quick", a
few minutes on 2 cores) and `run(settings, *, out) -> dict`, which writes CSV/JSON and PNG plots
into `out` and returns what it wrote and measured. `efpsn.cli.experiment.register` adds them to
the `efpsn` console script as `efpsn experiment NAME`.
"""

EXPERIMENTS = (
    "accuracy-convex",
    "accuracy-nonconvex",
    "attack",
    "perturbation",
    "privacy",
    "network-check",
)
