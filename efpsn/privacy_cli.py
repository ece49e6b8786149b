"""`efpsn privacy`: Theorem 4.1 both ways, (gamma, graph, basis) -> (epsilon, delta) and a target
epsilon -> the gamma that reaches it, with the run parameters declared in efpsn/config.py."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from efpsn.cli_common import write_json
from efpsn.config import RunConfig
from efpsn.flags import add_run_arguments, config_from_args

__all__ = ["add_parser"]

# The run parameters the accountant reads: the graph, the noise, the basis and the model (for
# the number of coordinates of "all").
PRIVACY_PARAMETERS = ("agents", "topology", "seed", "gamma", "p", "task", "input_shape",
                      "classes", "selection", "K", "m", "N")


def _basis(config: RunConfig) -> tuple[int, int]:
    """(m, N) as the run would derive them; a user's model is built to count its parameters."""
    m, n_functions = config.basis_counts()
    if m is not None and n_functions is not None:
        return m, n_functions
    from efpsn.problem import build_task

    task = build_task(config)
    m, n_functions = config.basis_counts(num_params=task.num_params,
                                         last_bias=len(task.last_bias_indices()))
    if m is None or n_functions is None:
        raise ValueError(f"selection {config.selection!r} needs m (the number of parameters to "
                         "perturb)")
    return m, n_functions


def _privacy(args: argparse.Namespace) -> int:
    from efpsn.privacy import epsilon_delta, gamma_for_epsilon, protection_statement
    from efpsn.selection import parse_selection
    from efpsn.topology import build_graph, laplacian_spectrum

    config = config_from_args(args)
    m, n_functions = _basis(config)
    protects = protection_statement(selection=config.selection, m=m, K=config.K, N=n_functions,
                                    sensitivity=args.sensitivity, q=args.q)
    graph = build_graph(config.topology, config.agents, seed=config.seed)
    mu2, mu_max = laplacian_spectrum(graph)
    common = {"p": config.p, "q": args.q, "sensitivity": args.sensitivity,
              "mu2": mu2, "mu_max": mu_max}
    if args.target_epsilon is not None:
        gamma = gamma_for_epsilon(target_epsilon=args.target_epsilon, delta=args.delta, **common)
        result = epsilon_delta(gamma=gamma, delta=args.delta, **common)
        print(f"gamma needed for epsilon <= {args.target_epsilon:g} at delta {args.delta:g}: "
              f"{gamma:.6g}")
    else:
        result = epsilon_delta(gamma=config.gamma, delta=args.delta, **common)
        print(f"epsilon = {result.epsilon:.6g}, delta = {result.delta:.3g} "
              f"(gamma {config.gamma:g}, mu_2 {mu2:.4g}, mu_max {mu_max:.4g})")
    print(protects)
    if args.json:
        payload: dict[str, Any] = {
            "topology": config.topology, "agents": config.agents, "mu2": mu2, "mu_max": mu_max,
            **dataclasses.asdict(result), "selection": config.selection,
            "measure": parse_selection(config.selection).measure, "m": m, "K": config.K,
            "N": n_functions, "protects": protects}
        if args.json == "-":
            print(json.dumps(payload, indent=2))
        else:
            write_json(args.json, payload)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The `privacy` subcommand of `efpsn`."""
    priv = sub.add_parser(
        "privacy", help="Theorem 4.1: (gamma, graph) -> (epsilon, delta), or back",
        description="EFPSN's differential privacy by Theorem 4.1 of the paper: epsilon for the "
                    "run's gamma, graph and basis, or with --target-epsilon the gamma that "
                    "reaches it. The run parameters mean what they mean for a run.")
    add_run_arguments(priv, only=PRIVACY_PARAMETERS, title="run parameters (as for the run)")
    g = priv.add_argument_group("the privacy guarantee")
    g.add_argument("--q", type=float, default=2.0,
                   help="smoothness order q of the V_q norm; Theorem 4.1 needs p in "
                        "(1/2, q - 1/2) (default 2)")
    g.add_argument("--delta", type=float, default=1e-5,
                   help="delta of the (epsilon, delta) guarantee (default 1e-5)")
    g.add_argument("--sensitivity", type=float, default=1.0,
                   help="||f_I - f_I'||_{V_q}, the adjacency bound, in the basis of the "
                        "selection's measure (uniform = 2^(-m/2) x Lebesgue) (default 1)")
    g.add_argument("--target-epsilon", type=float, default=None,
                   help="print the smallest gamma that reaches this epsilon instead")
    priv.add_argument("--json", metavar="OUT.json", help="write the result ('-' for stdout)")
    priv.set_defaults(handler=_privacy)
    return priv
