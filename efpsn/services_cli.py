"""`efpsn coordinator`, `efpsn agent` and `efpsn up`: the networked system's commands."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from efpsn.cli_common import add_run_arguments, config_from_args
from efpsn.config import RunConfig

if TYPE_CHECKING:
    from efpsn.tls import TlsConfig

T = TypeVar("T")


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


def tls_from_args(args: argparse.Namespace, name: str) -> TlsConfig | None:
    """The node's mutual-TLS material from --tls-dir or --tls-cert/--tls-key/--tls-ca; None with
    --insecure. Neither is a (one-line) error: plaintext must be asked for explicitly."""
    from efpsn.tls import TlsConfig

    explicit = {"--tls-cert": args.tls_cert, "--tls-key": args.tls_key, "--tls-ca": args.tls_ca}
    given = [flag for flag, value in explicit.items() if value]
    if args.insecure:
        if args.tls_dir or given:
            raise ValueError("--insecure (plaintext) contradicts --tls-dir/--tls-cert/--tls-key/"
                             "--tls-ca: give one or the other")
        return None
    if args.tls_dir:
        if given:
            raise ValueError(f"give --tls-dir or {'/'.join(explicit)}, not both")
        config = TlsConfig.from_dir(args.tls_dir, name)
    elif len(given) == len(explicit):
        config = TlsConfig.from_files(cert=args.tls_cert, key=args.tls_key, ca=args.tls_ca)
    elif given:
        missing = [flag for flag in explicit if flag not in given]
        raise ValueError(f"{', '.join(given)} also need {', '.join(missing)}")
    else:
        raise ValueError(
            "no TLS material: give --tls-dir DIR (with ca.pem, NAME.pem, NAME.key, e.g. from "
            "`efpsn certs`) or --tls-cert/--tls-key/--tls-ca, or --insecure for plaintext"
        )
    config.require_name(name)
    return config


def _add_tls_flags(p: argparse.ArgumentParser, *, own_name: str) -> None:
    g = p.add_argument_group("security (mutual TLS is required unless --insecure)")
    g.add_argument("--tls-dir", default=None,
                   help=f"folder with ca.pem, NAME.pem and NAME.key (NAME = {own_name}), as "
                        "written by `efpsn certs`")
    g.add_argument("--tls-cert", default=None, help="this node's certificate (PEM)")
    g.add_argument("--tls-key", default=None, help="this node's private key (PEM)")
    g.add_argument("--tls-ca", default=None, help="the CA certificate every node trusts (PEM)")
    g.add_argument("--insecure", action="store_true",
                   help="plaintext gRPC without authentication (tests, trusted networks only)")


def _coordinator(args: argparse.Namespace) -> int:
    from efpsn.coordinator.registry import default_names
    from efpsn.coordinator.service import serve
    from efpsn.problem import build_problem

    setup_logging(args.verbose)
    config = config_from_args(args)
    check_key_policy(config, allow_insecure_keys=args.allow_insecure_keys)
    tls = tls_from_args(args, args.tls_name)
    expected = _names(args.expected_names) if args.expected_names else default_names(config.agents)
    if len(expected) != config.agents:
        raise ValueError(f"--expected-names lists {len(expected)} names for {config.agents} agents")
    if not args.skip_data_check:
        build_problem(config)  # every parameter error surfaces here, before agents start
    asyncio.run(serve(
        config, listen=args.listen, run_id=args.run_id, port_file=args.port_file,
        register_timeout=args.register_timeout, expected_names=expected, tls=tls,
    ))
    return 0


def _names(text: str) -> set[str]:
    return {n.strip() for n in text.split(",") if n.strip()}


async def _until_signalled(work: Coroutine[Any, Any, T], *, what: str) -> T:
    """Run `work`; SIGTERM/SIGINT cancel it, so `finally` blocks run and the process exits soon.

    Orchestrators (docker stop, Kubernetes, `efpsn up`) send SIGTERM; an agent stopped this way
    keeps its state folder and resumes when started again with the same command.
    """
    from efpsn.net import install_stop_signals

    task = asyncio.ensure_future(work)
    stop = asyncio.Event()
    install_stop_signals(stop)
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if not task.done():
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            raise KeyboardInterrupt(f"{what} stopped by a signal") from None
    stopper.cancel()
    return task.result()


def _agent(args: argparse.Namespace) -> int:
    from efpsn.agent.node import AgentNode, AgentOptions

    setup_logging(args.verbose)
    options = AgentOptions(
        name=args.name, listen=args.listen, advertise=args.advertise,
        coordinator=args.coordinator, results_dir=Path(args.results),
        register_timeout=args.register_timeout, port_file=args.port_file,
        tls=tls_from_args(args, args.name), coordinator_name=args.coordinator_name,
        state_dir=Path(args.state_dir) if args.state_dir else None,
        checkpoint_every=args.checkpoint_every, keep_rounds=args.keep_rounds,
        insecure_noise_seed=args.insecure_noise_seed, debug_expose_mask=args.debug_expose_mask,
        allow_insecure_keys=args.allow_insecure_keys,
    )
    result = asyncio.run(_until_signalled(AgentNode(options).run(), what=args.name))
    final = result["final"]
    print(f"{args.name}: done; local loss {final['loss']:.4f}, accuracy {final['accuracy']:.4f}")
    return 0


def _up(args: argparse.Namespace) -> int:
    from efpsn.launcher import launch_local_network

    config = config_from_args(args)
    summary = launch_local_network(
        config, results=Path(args.results) if args.results else None, host=args.host,
        quiet=args.quiet, insecure=args.insecure, checkpoint_every=args.checkpoint_every,
        insecure_noise_seed=args.insecure_noise_seed,
        debug_expose_mask=args.debug_expose_mask, allow_insecure_keys=args.allow_insecure_keys,
    )
    return 0 if summary["ok"] else 1


def _certs(args: argparse.Namespace) -> int:
    from efpsn.tls import generate_certificates

    names = [n.strip() for n in args.names.split(",") if n.strip()]
    written = generate_certificates(
        args.out, names, ips=["127.0.0.1", *(args.ip or [])], dns=args.dns or [], days=args.days,
        key_type=args.key_type, overwrite=args.force,
    )
    out = Path(args.out)
    print(f"CA: {out / 'ca.pem'} (its key {out / 'ca.key'} signs new certificates: keep it "
          "offline)")
    for name, path in written.items():
        print(f"{name}: {path} + {out / (name + '.key')} (mode 0600)")
    return 0


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
    coord.add_argument("--expected-names", default=None,
                       help="comma-separated agent names allowed to register "
                            "(default agent1..agentN)")
    coord.add_argument("--verbose", action="store_true")
    coord.add_argument("--allow-insecure-keys", action="store_true", help=argparse.SUPPRESS)
    _add_tls_flags(coord, own_name="--tls-name")
    coord.add_argument("--tls-name", default="coordinator",
                       help="the coordinator's certificate name (default coordinator)")
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
    _add_tls_flags(agent, own_name="--name")
    agent.add_argument("--coordinator-name", default="coordinator",
                       help="the name in the coordinator's certificate (default coordinator)")
    crash = agent.add_argument_group("crash safety (restart with the same command to resume)")
    crash.add_argument("--state-dir", default=None,
                       help="assignment, mask and checkpoints (default RESULTS/NAME/state)")
    crash.add_argument("--checkpoint-every", type=int, default=50,
                       help="save the phase II state every this many rounds (default 50)")
    crash.add_argument("--keep-rounds", type=int, default=128,
                       help="recent outboxes kept for restarting neighbours (default 128; must "
                            "exceed every agent's --checkpoint-every + 2)")
    _add_debug_flags(agent)
    agent.set_defaults(handler=_agent)

    up = sub.add_parser("up", help="the main job: coordinator + n agents as local processes")
    add_run_arguments(up)
    up.add_argument("--results", default=None, help="results folder (default: results/run-TIME)")
    up.add_argument("--host", default="127.0.0.1", help="loopback address to serve on")
    up.add_argument("--quiet", action="store_true", help="no progress bar")
    up.add_argument("--insecure", action="store_true",
                    help="plaintext gRPC (default: a fresh CA and certificates in RESULTS/tls, "
                         "mutual TLS everywhere)")
    up.add_argument("--checkpoint-every", type=int, default=50,
                    help="agents save their phase II state every this many rounds")
    _add_debug_flags(up)
    up.set_defaults(handler=_up)

    certs = sub.add_parser("certs", help="a CA and one key/certificate per node for mutual TLS")
    certs.add_argument("--out", required=True, help="folder for ca.pem, NAME.pem, NAME.key")
    certs.add_argument("--names", required=True,
                       help="comma-separated node names, e.g. coordinator,agent1,agent2")
    certs.add_argument("--ip", action="append", default=None,
                       help="IP subject-alternative name: IP (every certificate) or NAME=IP "
                            "(repeatable; 127.0.0.1 is always included)")
    certs.add_argument("--dns", action="append", default=None,
                       help="extra DNS subject-alternative name: DNS or NAME=DNS (repeatable)")
    certs.add_argument("--days", type=int, default=365, help="validity (default 365)")
    certs.add_argument("--key-type", choices=("ec", "rsa"), default="ec",
                       help="EC P-256 (default) or RSA 3072")
    certs.add_argument("--force", action="store_true", help="overwrite existing NAME files")
    certs.set_defaults(handler=_certs)
