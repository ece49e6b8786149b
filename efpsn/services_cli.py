"""`efpsn coordinator`, `efpsn agent` and `efpsn up`: the networked system's commands."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
from pathlib import Path

from efpsn.cli_common import add_run_arguments, config_from_args
from efpsn.config import RunConfig


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )


def config_to_args(config: RunConfig) -> list[str]:
    """The flags that reproduce `config` on another command line (inverse of config_from_args)."""
    out: list[str] = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        flag = "--" + ("round-timeout" if f.name == "round_timeout_seconds"
                       else f.name.replace("_", "-"))
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        elif f.name == "batch_size" and value == 0:
            out += [flag, "full"]
        else:
            out += [flag, repr(value) if isinstance(value, float) else str(value)]
    return out


def check_key_policy(config: RunConfig, *, allow_insecure_keys: bool) -> None:
    """Networked runs refuse Paillier keys below 2048 bits unless a test explicitly allows it."""
    from efpsn.paillier import MIN_KEY_BITS

    if config.key_bits < MIN_KEY_BITS and not allow_insecure_keys:
        raise ValueError(
            f"key_bits must be >= {MIN_KEY_BITS} for a networked run, got {config.key_bits}"
        )


def _coordinator(args: argparse.Namespace) -> int:
    from efpsn.coordinator.service import serve
    from efpsn.problem import build_problem

    setup_logging(args.verbose)
    config = config_from_args(args)
    check_key_policy(config, allow_insecure_keys=args.allow_insecure_keys)
    if not args.skip_data_check:
        build_problem(config)  # every parameter error surfaces here, before agents start
    asyncio.run(serve(
        config, listen=args.listen, run_id=args.run_id, port_file=args.port_file,
        register_timeout=args.register_timeout,
    ))
    return 0


def _agent(args: argparse.Namespace) -> int:
    from efpsn.agent.node import AgentNode, AgentOptions

    setup_logging(args.verbose)
    options = AgentOptions(
        name=args.name, listen=args.listen, advertise=args.advertise,
        coordinator=args.coordinator, results_dir=Path(args.results),
        register_timeout=args.register_timeout, port_file=args.port_file,
        insecure_noise_seed=args.insecure_noise_seed, debug_expose_mask=args.debug_expose_mask,
        allow_insecure_keys=args.allow_insecure_keys,
    )
    result = asyncio.run(AgentNode(options).run())
    final = result["final"]
    print(f"{args.name}: done; local loss {final['loss']:.4f}, accuracy {final['accuracy']:.4f}")
    return 0


def _up(args: argparse.Namespace) -> int:
    from efpsn.launcher import launch_local_network

    config = config_from_args(args)
    summary = launch_local_network(
        config, results=Path(args.results) if args.results else None, host=args.host,
        quiet=args.quiet, insecure_noise_seed=args.insecure_noise_seed,
        debug_expose_mask=args.debug_expose_mask, allow_insecure_keys=args.allow_insecure_keys,
    )
    return 0 if summary["ok"] else 1


def _add_debug_flags(p: argparse.ArgumentParser) -> None:
    # Hidden test hooks: they break privacy and exist so tests can compare with the simulator.
    p.add_argument("--insecure-noise-seed", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--debug-expose-mask", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--allow-insecure-keys", action="store_true", help=argparse.SUPPRESS)


def register(sub: argparse._SubParsersAction) -> None:
    coord = sub.add_parser("coordinator", help="bootstrap service: registry, topology, parameters")
    coord.add_argument("--listen", default="0.0.0.0:50050", help="HOST:PORT (port 0: any free)")
    coord.add_argument("--run-id", default=None, help="run identifier (default: random)")
    coord.add_argument("--port-file", default=None, help="write the bound port here")
    coord.add_argument("--register-timeout", type=float, default=600.0,
                       help="seconds to wait for all agents to register")
    coord.add_argument("--skip-data-check", action="store_true",
                       help="do not load the data set to validate the run (it may live only "
                            "at the agents)")
    coord.add_argument("--verbose", action="store_true")
    coord.add_argument("--allow-insecure-keys", action="store_true", help=argparse.SUPPRESS)
    add_run_arguments(coord)
    coord.set_defaults(handler=_coordinator)

    agent = sub.add_parser("agent", help="one agent: phase I with neighbours, then phase II")
    agent.add_argument("--name", required=True, help="agent name, e.g. agent1")
    agent.add_argument("--listen", default="0.0.0.0:50051", help="HOST:PORT to serve on")
    agent.add_argument("--advertise", default=None,
                       help="HOST:PORT neighbours dial (default: listen host and bound port)")
    agent.add_argument("--coordinator", required=True, help="coordinator HOST:PORT")
    agent.add_argument("--results", default="results", help="folder for result.json/model.npy")
    agent.add_argument("--register-timeout", type=float, default=600.0)
    agent.add_argument("--port-file", default=None, help="write the bound port here")
    agent.add_argument("--verbose", action="store_true")
    _add_debug_flags(agent)
    agent.set_defaults(handler=_agent)

    up = sub.add_parser("up", help="the main job: coordinator + n agents as local processes")
    add_run_arguments(up)
    up.add_argument("--results", default=None, help="results folder (default: results/run-TIME)")
    up.add_argument("--host", default="127.0.0.1", help="loopback address to serve on")
    up.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_debug_flags(up)
    up.set_defaults(handler=_up)
