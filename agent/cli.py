"""`efpsn agent` and `python -m agent`: the agent's command line.

Module-level imports stay light (no torch, no grpc) so that building the parser is quick; the
handlers import the service when they run.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from efpsn.flags.parser import HOLDOUT_HELP, OneLineParser, holdout_fraction
from efpsn.flags.services import (
    add_debug_flags,
    add_departure_flag,
    add_tls_flags,
    setup_logging,
    tls_from_args,
    until_signalled,
)
from efpsn.process.lifeline import hold_to_launcher


def _coordinator_address(args: argparse.Namespace) -> str:
    """--coordinator, or with --coordinator-port-file (`efpsn up`, which starts the coordinator
    and the agents at once) its host and the port the coordinator writes to that file, waited
    for here, after this process's heavy imports."""
    if not args.coordinator_port_file:
        return args.coordinator
    host, _, _ = args.coordinator.rpartition(":")
    path = Path(args.coordinator_port_file)
    deadline = time.monotonic() + args.register_timeout
    while True:
        try:
            return f"{host}:{int(path.read_text())}"
        except (OSError, ValueError):  # not written yet (it is written whole, then renamed)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{args.name}: no coordinator port in {path} after "
                                   f"{args.register_timeout:.0f}s") from None
            time.sleep(0.02)


def _agent(args: argparse.Namespace) -> int:
    hold_to_launcher()  # started by `efpsn up`: stop when it is gone, even killed -9
    from efpsn.process.title import set_title

    set_title(args.name, str(args.results))  # `efpsn agent2 RESULTS` in ps, forked or not
    if args.data:  # its own files, every problem at once, before any port or key
        from efpsn.data.inspection import check_own_files

        check_own_files({f"{args.name}'s {Path(p).name}": Path(p)
                         for p in (args.data, args.test_data) if p},
                        label_column=args.label_column)
    from agent.node import AgentNode
    from agent.options import AgentOptions

    setup_logging(args.verbose)
    options = AgentOptions(
        name=args.name, listen=args.listen, advertise=args.advertise,
        coordinator=_coordinator_address(args), results_dir=Path(args.results),
        register_timeout=args.register_timeout, connect_timeout=args.connect_timeout,
        port_file=args.port_file,
        failure_file=Path(args.failure_file) if args.failure_file else None,
        tls=tls_from_args(args, args.name), coordinator_name=args.coordinator_name,
        operator_name=args.operator_name,
        state_dir=Path(args.state_dir) if args.state_dir else None,
        checkpoint_every=args.checkpoint_every, keep_rounds=args.keep_rounds,
        insecure_noise_seed=args.insecure_noise_seed, debug_expose_mask=args.debug_expose_mask,
        allow_insecure_keys=args.allow_insecure_keys,
        data=Path(args.data) if args.data else None, holdout=args.holdout,
        test_data=Path(args.test_data) if args.test_data else None,
        label_column=args.label_column, quiet=args.quiet, join=args.join,
        departure_deadline=args.departure_deadline,
    )
    result = asyncio.run(until_signalled(AgentNode(options).run(), what=args.name,
                                         final=True))  # the process ends with the run
    final = result["final"]
    print(f"{args.name}: done; local loss {final['loss']:.4f}, accuracy {final['accuracy']:.4f}")
    print(f"{args.name}: {result['privacy']['line']}")
    return 0


def configure(agent: argparse.ArgumentParser) -> None:
    """The agent's flags (its own options; the run's parameters come from the coordinator)."""
    agent.add_argument("--name", required=True, help="agent name, e.g. agent1")
    agent.add_argument("--listen", default="0.0.0.0:50051", help="HOST:PORT to serve on")
    agent.add_argument("--advertise", default=None,
                       help="HOST:PORT neighbours dial (default: listen host and bound port)")
    agent.add_argument("--coordinator", required=True, help="coordinator HOST:PORT")
    agent.add_argument("--results", default="results", help="folder for result.json/model.npy")
    agent.add_argument("--connect-timeout", type=float, default=120.0,
                       help="seconds to keep trying to reach the coordinator (default 120); "
                            "what is awaited is logged after 5 s and every 10 s")
    agent.add_argument("--register-timeout", type=float, default=600.0,
                       help="seconds to wait, once the coordinator answers, for every agent to "
                            "register (default 600)")
    agent.add_argument("--port-file", default=None, help="write the bound port here")
    agent.add_argument("--failure-file", default=None,
                       help="if the agent stops with an error, record why here (JSON: its own "
                            "reason, and the other agent it blames, if any)")
    # `efpsn up`: the coordinator's port, once it is bound (--coordinator gives the host)
    agent.add_argument("--coordinator-port-file", default=None, help=argparse.SUPPRESS)
    agent.add_argument("--join", action="store_true",
                       help="this party's seat starts empty (the run's --late-seats): join the "
                            "running network, from the round the coordinator decides; its "
                            "neighbours exchange seeds with it first (restart it with the same "
                            "command to resume)")
    agent.add_argument("--verbose", action="store_true")
    agent.add_argument("--quiet", action="store_true",
                       help="no progress line at each evaluation (round, local loss, accuracy)")
    data = agent.add_argument_group(
        "this agent's own data (runs with --data local at the coordinator); read on this host "
        "only, never sent or logged")
    data.add_argument("--data", default=None,
                      help=".npz with arrays X (samples first) and y (integer labels), .csv with "
                           "a header row, or a folder of IDX files")
    data.add_argument("--label-column", default=None,
                      help="label column of a .csv (default: the run's table schema's, else "
                           "label)")
    data.add_argument("--holdout", type=holdout_fraction, default=None, metavar="F|auto",
                      help=HOLDOUT_HELP)
    data.add_argument("--test-data", default=None,
                      help="a public test set in the same format, the same at every agent")
    add_tls_flags(agent, own_name="--name")
    agent.add_argument("--coordinator-name", default="coordinator",
                       help="the name in the coordinator's certificate (default coordinator)")
    agent.add_argument("--operator-name", default=None,
                       help="the certificate name that may read this agent's loss and accuracy "
                            "through GetStatus (default: the agent's own --name); every other "
                            "caller sees liveness only")
    crash = agent.add_argument_group("crash safety (restart with the same command to resume)")
    crash.add_argument("--state-dir", default=None,
                       help="assignment, mask and checkpoints (default RESULTS/NAME/state)")
    crash.add_argument("--checkpoint-every", type=int, default=50,
                       help="save the phase II state every this many rounds (default 50)")
    crash.add_argument("--keep-rounds", type=int, default=128,
                       help="recent outboxes kept for restarting neighbours (default 128; must "
                            "exceed every agent's --checkpoint-every + 2)")
    add_departure_flag(crash)
    add_debug_flags(agent)
    agent.set_defaults(handler=_agent)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The `agent` subcommand of `efpsn`."""
    agent = sub.add_parser("agent", help="one agent: phase I with neighbours, then phase II")
    configure(agent)
    return agent


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m agent",
        description="One EFPSN agent: registers with the coordinator, runs phase I (Paillier "
                    "zero-sum masks) and phase II (the optimisation) with its neighbours.",
    )
    configure(parser)
    return parser
