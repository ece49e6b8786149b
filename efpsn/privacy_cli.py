"""`efpsn privacy`: Theorem 4.1 both ways, (gamma, graph, basis) -> (epsilon, delta) and a target
epsilon -> the gamma that reaches it; with --refresh every:R, the per-sample accountant of
refreshed masks over the run's rounds. Run parameters as declared in efpsn/config.py."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from efpsn.cli_common import json_safe, write_json
from efpsn.config import RunConfig
from efpsn.flags import add_run_arguments, config_from_args

__all__ = ["add_parser", "refreshed_arguments"]

# The run parameters the accountant reads: the graph, the noise, the basis and the model (for
# the number of coordinates of "all").
PRIVACY_PARAMETERS = ("agents", "topology", "seed", "algorithm", "gamma", "p", "task", "input_shape",
                      "classes", "selection", "K", "m", "N", "refresh", "iterations", "clip",
                      "batch_size")


FADING_NOTE = (
    "refresh fading: Theorem 4.1's epsilon above covers the fixed part of the mask; the fresh "
    "part, which differencing two rounds does not cancel, fades, so it carries no "
    "per-sample epsilon of its own: what it protects is measured by attacks "
    "(docs/RESULTS.md). For a per-sample epsilon use --preset dp.")


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


def refreshed_arguments(config: RunConfig, *, delta: float, attacker: str = "neighbour",
                        samples: int | None = None) -> dict[str, Any]:
    """The keyword arguments of efpsn.accounting.account_refreshed (all but gamma) for a run:
    its graph, noise decay, basis, model size, refresh, rounds, clip and batch."""
    from efpsn.problem import build_task
    from efpsn.refresh_value import Refresh
    from efpsn.selection import selection_measure
    from efpsn.topology import build_graph

    m, n_functions = _basis(config)
    if config.batch_size == 0 and samples is None:
        raise ValueError("the run takes the full local batch (the default): the per-sample "
                         "accountant needs --samples N (an agent's own sample count; it stays "
                         "on this machine) or the run's --batch-size B")
    return {
        "graph": build_graph(config.topology, config.agents, seed=config.seed), "p": config.p,
        "K": config.K, "m": m, "N": n_functions,
        "num_params": _num_params(config, build_task),
        "measure": selection_measure(config.selection),
        "refresh": Refresh.parse(config.refresh), "iterations": config.iterations,
        "clip": config.clip or None, "batch_size": config.batch_size or None,
        "delta": delta, "attacker": attacker, "samples": samples}


def _refreshed(args: argparse.Namespace, config: RunConfig) -> int:
    """Refreshed masks: the per-sample accountant (efpsn/accounting.py), composed over the
    run's rounds by dp-accounting."""
    from efpsn.accounting import account_refreshed, gamma_for_refreshed_epsilon

    common = refreshed_arguments(config, delta=args.delta, attacker=args.attacker,
                                 samples=args.samples)
    m, n_functions = common["m"], common["N"]
    gamma = config.gamma
    if args.target_epsilon is not None:
        gamma = gamma_for_refreshed_epsilon(target_epsilon=args.target_epsilon, **common)
        print(f"gamma needed for epsilon <= {args.target_epsilon:g} at delta {args.delta:g}: "
              f"{gamma:.6g}")
    result = account_refreshed(gamma=gamma, **common)
    print(f"epsilon = {result.epsilon:.6g}, delta = {result.delta:.3g} (refresh "
          f"{config.refresh}, gamma {gamma:g}, {config.iterations} rounds, against "
          f"{args.attacker})")
    print(result.statement)
    _write(args, {"topology": config.topology, "agents": config.agents, "gamma": gamma,
                  "selection": config.selection, "m": m, "K": config.K, "N": n_functions,
                  "clip": config.clip, "batch_size": config.batch_size, **result.to_dict()})
    return 0


def _num_params(config: RunConfig, build_task: Any) -> int:
    from efpsn.config import parse_shape
    from efpsn.model_sizes import parameter_count

    counted = parameter_count(config.task, shape=parse_shape(config.input_shape),
                              classes=config.classes)
    return counted if counted is not None else build_task(config).num_params


def _write(args: argparse.Namespace, payload: dict[str, Any]) -> None:
    if args.json == "-":
        print(json.dumps(json_safe(payload), indent=2))
    elif args.json:
        write_json(args.json, payload)


def _privacy(args: argparse.Namespace) -> int:
    from efpsn.privacy import epsilon_delta, gamma_for_epsilon, protection_statement
    from efpsn.refresh_value import Refresh
    from efpsn.selection import parse_selection
    from efpsn.topology import build_graph, laplacian_spectrum

    config = config_from_args(args)
    if Refresh.parse(config.refresh).accumulates:
        return _refreshed(args, config)
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
    fading = Refresh.parse(config.refresh).fading
    if fading:
        print(FADING_NOTE)
    _write(args, {"topology": config.topology, "agents": config.agents, "mu2": mu2,
                  "mu_max": mu_max, **dataclasses.asdict(result),
                  "selection": config.selection,
                  "measure": parse_selection(config.selection).measure, "m": m, "K": config.K,
                  "N": n_functions, "protects": protects,
                  "refresh": config.refresh, **({"refresh_note": FADING_NOTE} if fading else {})})
    return 0


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The `privacy` subcommand of `efpsn`."""
    priv = sub.add_parser(
        "privacy", help="Theorem 4.1: (gamma, graph) -> (epsilon, delta), or back",
        description="EFPSN's differential privacy. Fixed masks (--refresh never): Theorem 4.1 "
                    "of the paper, epsilon for the run's gamma, graph and basis. Refreshed "
                    "masks (--refresh every:R): each training sample's epsilon over the run's "
                    "rounds, composed by dp-accounting, against one curious neighbour, an "
                    "eavesdropper or all neighbours. --target-epsilon gives the gamma that "
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
    g.add_argument("--attacker", choices=("neighbour", "eavesdropper", "neighbours"),
                   default="neighbour",
                   help="refreshed masks: against whom: one curious neighbour (it cancels the "
                        "seeds it shares), an eavesdropper (every message, no seed) or all of "
                        "an agent's neighbours together (default neighbour)")
    g.add_argument("--samples", type=int, default=None,
                   help="refreshed masks: the agent's own number of training samples (only its "
                        "operator knows it); a sample is then in one batch per epoch, so fewer "
                        "rounds are composed")
    priv.add_argument("--json", metavar="OUT.json", help="write the result ('-' for stdout)")
    priv.set_defaults(handler=_privacy)
    return priv
