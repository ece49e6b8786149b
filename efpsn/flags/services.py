"""Flags and helpers shared by the service commands (`efpsn coordinator`, `efpsn agent`,
`efpsn up`, and `python -m agent` / `python -m coordinator`).

The commands themselves live with their services (agent/cli.py, coordinator/cli.py). Nothing
here imports torch or grpc at module level, so every command starts quickly."""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from efpsn.wire.tls import TlsConfig

T = TypeVar("T")


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )


def tls_from_args(args: argparse.Namespace, name: str) -> TlsConfig | None:
    """The node's mutual-TLS material from --tls-dir or --tls-cert/--tls-key/--tls-ca; None with
    --insecure. Neither is a (one-line) error: plaintext must be asked for explicitly."""
    from efpsn.wire.tls import TlsConfig

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


def add_tls_flags(p: argparse.ArgumentParser, *, own_name: str) -> None:
    g = p.add_argument_group("security (mutual TLS is required unless --insecure)")
    g.add_argument("--tls-dir", default=None,
                   help=f"folder with ca.pem, NAME.pem and NAME.key (NAME = {own_name}), as "
                        "written by `efpsn certs`")
    g.add_argument("--tls-cert", default=None, help="this node's certificate (PEM)")
    g.add_argument("--tls-key", default=None, help="this node's private key (PEM)")
    g.add_argument("--tls-ca", default=None, help="the CA certificate every node trusts (PEM)")
    g.add_argument("--insecure", action="store_true",
                   help="plaintext gRPC without authentication (tests, trusted networks only)")


def parse_names(text: str) -> set[str]:
    return {n.strip() for n in text.split(",") if n.strip()}


async def until_signalled(work: Coroutine[Any, Any, T], *, what: str,
                          recancel_every: float = 1.0, final: bool = False) -> T:
    """Run `work`; SIGTERM/SIGINT cancel it, so `finally` blocks run and the process exits soon.

    The cancellation is repeated at every further signal and every `recancel_every` seconds
    until the work has ended: library code can swallow one (asyncio.wait_for on Python 3.11
    does when it lands with a result), and the agent must still stop.
    Orchestrators (docker stop, Kubernetes, `efpsn up`) send SIGTERM; an agent stopped this way
    keeps its state folder and resumes when started again with the same command. final: the
    process ends with this work, and ignores stop signals once one has come
    (efpsn.wire.net.install_stop_signals); then only the timer re-cancels.
    """
    from efpsn.wire.net import install_stop_signals

    task = asyncio.ensure_future(work)
    stop = asyncio.Event()
    install_stop_signals(stop, what=what, final=final)
    stopper = asyncio.ensure_future(stop.wait())
    signalled = False
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        while not task.done():
            signalled = True
            task.cancel()
            stop.clear()
            stopper = asyncio.ensure_future(stop.wait())
            await asyncio.wait({task, stopper}, timeout=recancel_every,
                               return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
    finally:
        stopper.cancel()
    if task.cancelled() or (signalled and task.exception() is not None):
        raise KeyboardInterrupt(f"{what} stopped by a signal")
    return task.result()


def add_departure_flag(parser: Any) -> None:
    """--departure-deadline (the agent's and `efpsn up`'s)."""
    parser.add_argument("--departure-deadline", type=float, default=None, metavar="SECONDS",
                        help="in phase I or II, a neighbour silent this long is reported to the "
                             "coordinator, which decides whether it left for good; the others "
                             "then finish without it (default: the run's --round-timeout; 0: "
                             "never, a silent neighbour stops this agent with exit 2)")


def add_debug_flags(p: argparse.ArgumentParser) -> None:
    # Hidden test hooks: they break privacy and exist so tests can compare with the simulator.
    p.add_argument("--insecure-noise-seed", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--debug-expose-mask", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--allow-insecure-keys", action="store_true", help=argparse.SUPPRESS)
