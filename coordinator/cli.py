"""`efpsn coordinator` and `python -m coordinator`: the bootstrap service's command line.

Imports nothing heavy (no torch, no data): the coordinator only checks the public run
parameters (topology, schedule, key policy), registers agents and hands out assignments.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

from efpsn.flags.arguments import add_run_arguments, apply_environment, network_config
from efpsn.flags.names import check_key_policy, flag_of, network_resolved
from efpsn.flags.parser import OneLineParser
from efpsn.flags.services import add_tls_flags, parse_names, setup_logging, tls_from_args
from efpsn.params.config import RunConfig, declarations
from efpsn.process.lifeline import hold_to_launcher


def _coordinator(args: argparse.Namespace) -> int:
    hold_to_launcher()  # started by `efpsn up`: stop when it is gone, even killed -9
    from efpsn.process.title import set_title

    set_title("coordinator", _run_of(args))
    from coordinator.registry import default_names
    from coordinator.service import serve

    setup_logging(args.verbose)
    if args.from_environment:  # containers: docker-compose.yml, the Swarm stack
        used = apply_environment(args, os.environ)
        logging.getLogger("efpsn.coordinator").info(
            "run parameters from the environment: %s", ", ".join(used) or "none (defaults)")
    config = coordinator_config(args)  # validated here, once, torch-free (efpsn/params/config.py)
    check_key_policy(config, allow_insecure_keys=args.allow_insecure_keys)
    tls = tls_from_args(args, args.tls_name)
    expected = (parse_names(args.expected_names) if args.expected_names
                else default_names(config.agents))
    if len(expected) != config.agents:
        raise ValueError(f"--expected-names lists {len(expected)} names for {config.agents} agents")
    asyncio.run(serve(
        config, listen=args.listen, run_id=args.run_id, port_file=args.port_file,
        register_timeout=args.register_timeout, expected_names=expected, tls=tls,
        linger=None if args.keep_serving else args.linger, final=True,
    ))
    return 0


def _run_of(args: argparse.Namespace) -> str:
    """The run this coordinator serves, for its process title: `efpsn up`'s results folder
    (where its run parameters are), else the run id, else the address it listens on."""
    if args.run_parameters:
        return os.path.dirname(args.run_parameters) or "."
    return args.run_id or args.listen


def coordinator_config(args: argparse.Namespace) -> RunConfig:
    """The run: --run-parameters FILE (one RunParameters message, as `efpsn up` writes it), or
    the run flags, never both (a flag beside the file would be silently one or the other)."""
    if args.run_parameters is None:
        return network_config(args)
    flags = sorted(flag_of(f.name, d) for f, d in declarations() if f.name in vars(args))
    if flags or "preset" in vars(args):
        raise ValueError(f"--run-parameters {args.run_parameters} holds the whole run: drop "
                         f"{', '.join(flags) or '--preset'}")
    from efpsn.wire.records import decode_run_parameters

    with open(args.run_parameters, "rb") as fh:
        return network_resolved(RunConfig.from_dict(decode_run_parameters(fh.read())))


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The `coordinator` subcommand (also the whole of `python -m coordinator`)."""
    coord = sub.add_parser("coordinator", help="bootstrap service: registry, topology, parameters")
    configure(coord)
    return coord


def configure(coord: argparse.ArgumentParser) -> None:
    coord.add_argument("--listen", default="0.0.0.0:50050", help="HOST:PORT (port 0: any free)")
    coord.add_argument("--run-id", default=None, help="run identifier (default: random)")
    coord.add_argument("--port-file", default=None, help="write the bound port here")
    coord.add_argument("--register-timeout", type=float, default=600.0,
                       help="seconds to wait for all agents to register")
    coord.add_argument("--expected-names", default=None,
                       help="comma-separated agent names allowed to register "
                            "(default agent1..agentN)")
    coord.add_argument("--linger", type=float, default=10.0,
                       help="exit this many seconds after every agent has its assignment (or "
                            "the run is cancelled): the agents never need the coordinator "
                            "again (default 10)")
    coord.add_argument("--keep-serving", action="store_true",
                       help="serve until stopped instead (e.g. to keep GetRunStatus answering)")
    coord.add_argument("--verbose", action="store_true")
    coord.add_argument("--run-parameters", default=None, metavar="FILE",
                       help="the run's parameters as one serialised efpsn.v1.RunParameters "
                            "message (what `efpsn up` writes), instead of the run flags")
    coord.add_argument("--from-environment", action="store_true",
                       help="take every run parameter no flag gives from its environment "
                            "variable: EFPSN_ and the flag's name, e.g. EFPSN_GAMMA for "
                            "--gamma, EFPSN_KEY_BITS for --key-bits, EFPSN_PRESET; unset or "
                            "empty: the default (how docker-compose.yml and the Swarm stack "
                            "pass them)")
    coord.add_argument("--allow-insecure-keys", action="store_true", help=argparse.SUPPRESS)
    add_tls_flags(coord, own_name="--tls-name")
    coord.add_argument("--tls-name", default="coordinator",
                       help="the coordinator's certificate name (default coordinator)")
    add_run_arguments(coord)
    coord.set_defaults(handler=_coordinator, numeric=False)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m coordinator",
        description="EFPSN's bootstrap coordinator: registers the agents, assigns ids, "
                    "neighbours and mixing weights, hands out the public run parameters. It "
                    "never sees data, noise, keys' secrets, gradients or parameters.",
    )
    configure(parser)
    return parser
