"""`efpsn privacy`: Theorem 4.1 both ways, (gamma, graph, basis) -> (epsilon, delta) and a target
epsilon -> the gamma that reaches it; with --refresh every:R, the per-sample accountant of
refreshed masks over the run's rounds. Run parameters as declared in efpsn/params/config.py."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from efpsn.flags.arguments import add_run_arguments, config_from_args
from efpsn.flags.parser import add_data_dir_arguments
from efpsn.jsonfile import json_safe, write_json
from efpsn.params.config import RunConfig
from efpsn.privacy.modes import basis_counts, refreshed_arguments

__all__ = ["add_parser"]


FADING_NOTE = (
    "refresh fading: Theorem 4.1's epsilon above covers the fixed part of the mask; the fresh "
    "part, which differencing two rounds does not cancel, fades, so it carries no "
    "per-sample epsilon of its own: what it protects is measured by attacks "
    "(docs/RESULTS.md). For a per-sample epsilon use --preset dp.")


def _refreshed(args: argparse.Namespace, config: RunConfig) -> int:
    """Refreshed masks: the per-sample accountant (efpsn/privacy/accounting.py), composed over the
    run's rounds by dp-accounting."""
    from efpsn.privacy.accounting import account_refreshed, gamma_for_refreshed_epsilon

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
                  "selection": str(config.selection), "m": m, "K": config.K, "N": n_functions,
                  "clip": config.clip, "batch_size": config.batch.wire(), **result.to_dict()})
    return 0


def _write(args: argparse.Namespace, payload: dict[str, Any]) -> None:
    if args.json == "-":
        print(json.dumps(json_safe(payload), indent=2))
    elif args.json:
        write_json(args.json, payload)


def _privacy(args: argparse.Namespace) -> int:
    from efpsn.params.schema import STANDARD_DISCLOSURE
    from efpsn.privacy.theorem import epsilon_delta, gamma_for_epsilon, protection_statement
    from efpsn.topology import build_graph, laplacian_spectrum

    config = config_from_args(args)
    standard = config.scale.standard
    if args.data_dir:
        rounds = ("the step rule's rounds once the secure sum gives l2 = 1/N_total" if standard
                  else f"{config.iterations} rounds")
        print(f"the run on {args.data_dir}: {config.agents} agents ({config.topology}), task "
              f"{config.task} on inputs of shape {config.input_shape} and {config.classes} "
              f"classes, {config.algorithm}, {rounds}")
    if standard:
        print(STANDARD_DISCLOSURE[:1].upper() + STANDARD_DISCLOSURE[1:])
    if args.insecure:
        print("--insecure: messages travel in plaintext, so an eavesdropper on the network "
              "sees what a curious neighbour sees, and the guarantee below holds against it "
              "only as against a neighbour")
    if config.refresh.accumulates:
        return _refreshed(args, config)
    m, n_functions = basis_counts(config)
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
    fading = config.refresh.fading
    if fading:
        print(FADING_NOTE)
    _write(args, {"topology": config.topology, "agents": config.agents, "mu2": mu2,
                  "mu_max": mu_max, **dataclasses.asdict(result),
                  "selection": str(config.selection),
                  "measure": config.selection.measure, "m": m, "K": config.K,
                  "N": n_functions, "protects": protects,
                  "refresh": str(config.refresh), **({"refresh_note": FADING_NOTE} if fading else {})})
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
    add_run_arguments(priv, title="run parameters (as for the run: the same flags, the same "
                                  "defaults, so that a run's own command line can be given)")
    add_data_dir_arguments(priv)
    from efpsn.cli.up import add_launch_flags

    add_launch_flags(priv, ignored=True)
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
