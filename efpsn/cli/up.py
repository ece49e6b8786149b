"""`efpsn up`: the command line of the local network launcher (efpsn/launch/network.py)."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from efpsn.departure.joins import JOIN_CHECK_EVERY, parse_join
from efpsn.flags.arguments import add_run_arguments, folder_of, network_config
from efpsn.flags.parser import OneLineParser, add_data_dir_arguments
from efpsn.flags.services import add_debug_flags, add_departure_flag
from efpsn.launch.placement import DEFAULT_PLACEMENT, PLACEMENTS
from efpsn.launch.record import default_results
from efpsn.process.signals import Stopped, StopSignals

__all__ = ["add_launch_flags", "add_parser", "parse_up", "resume_line", "run_up"]


def _up(args: argparse.Namespace) -> int:
    # a failure raises NetworkFailed, whose message leads with the root cause; SIGTERM, SIGHUP
    # and SIGINT raise Stopped, once every process it started is stopped
    given = args.results is not None
    args.results = args.results or str(default_results())  # named in the resume line
    with StopSignals("efpsn up"):
        try:
            summary = run_up(args)
        except Stopped:
            print(resume_line(args.results, given=given), file=sys.stderr, flush=True)
            raise
    return 0 if summary["ok"] else 1


def resume_line(results: str, *, given: bool) -> str:
    """How to resume a stopped `efpsn up`: its agents' checkpoints are in `results`."""
    how = ("run the same command again" if given
           else f"run the same command with --results {shlex.quote(results)}")
    return f"efpsn up: to resume from the last checkpoints in {results}, {how}"


def run_up(args: argparse.Namespace) -> dict[str, Any]:
    """`efpsn up` with parsed arguments: the --data-dir folder inspected once (every problem of
    every file in one message, before anything starts), the run's config (network_config) and
    the launcher's options, the local network run; returns its summary. efpsn.notebook.train
    calls launch_local_network with the same values."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # no gRPC notices in the user's terminal
    from efpsn.launch.network import launch_local_network

    folder = folder_of(args)
    config = network_config(args, folder=folder)
    options = {
        "results": Path(args.results) if args.results else None, "host": args.host,
        "folder": folder, "holdout": args.holdout,
        "label_column": args.label_column, "quiet": args.quiet, "insecure": args.insecure,
        "checkpoint_every": args.checkpoint_every, "fork_agents": not args.no_fork,
        "cpu_placement": args.cpu_placement,
        "departure_deadline": args.departure_deadline,
        "insecure_noise_seed": args.insecure_noise_seed,
        "debug_expose_mask": args.debug_expose_mask,
        "allow_insecure_keys": args.allow_insecure_keys,
        "late": {f"agent{j.agent + 1}": j.round
                 for j in (parse_join(text, agents=config.agents) for text in args.join)},
    }
    return launch_local_network(config, **options)


def parse_up(argv: list[str]) -> argparse.Namespace:
    """`efpsn up ARGV` parsed by the command's own parser, a usage error as a ValueError with the
    command's one line (never SystemExit): efpsn.notebook.train's way in."""
    parser = OneLineParser(prog="efpsn")
    add_parser(parser.add_subparsers(dest="command", required=True))
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args(["up", *argv])
    except SystemExit:
        lines = err.getvalue().strip().splitlines()
        raise ValueError(lines[-1] if lines else f"bad arguments {argv}") from None


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """`efpsn up`: a coordinator and n agents as local processes."""
    up = sub.add_parser("up", help="the main job: coordinator + n agents as local processes",
                        description="Run a whole EFPSN network on this machine: a coordinator "
                                    "and one process per agent, on free loopback ports, with "
                                    "mutual TLS. Every agent reads only its own data folder. "
                                    "Ctrl-C, SIGTERM or SIGHUP stop every process it started "
                                    "(exit 128 + the signal); killed -9, its processes stop "
                                    "by themselves. To resume a stopped or crashed run, give "
                                    "the same command with the same --results: the agents go "
                                    "on from their last checkpoints (every "
                                    "--checkpoint-every rounds) and it says 'resuming from "
                                    "round R'. `efpsn status RESULTS` shows a running one.")
    add_run_arguments(up)
    add_data_dir_arguments(up)
    add_launch_flags(up)
    up.add_argument("--late", "--join", dest="join", action="append", default=[],
                    metavar="agentK@R",
                    help="agent K's seat starts empty (--late-seats, implied) and its process "
                         "starts once every other agent has passed round R; it asks the "
                         "coordinator to join, which names the round it takes part from (the "
                         f"next check round, every {JOIN_CHECK_EVERY}, that no member has "
                         "passed); from then on the run ends at the optimum of every member's "
                         "data; repeatable")
    # numeric=False: the launcher starts the processes at once and loads torch in the
    # background, so the network's start-up does not wait for it.
    up.set_defaults(handler=_up, numeric=False)
    return up


def add_launch_flags(parser: argparse.ArgumentParser, *, ignored: bool = False) -> None:
    """The launcher's own flags (results, host, TLS, forking, checkpoints, test hooks).
    ignored=True: for a command that takes a run's flags but does not depend on these (efpsn
    privacy): accepted, so that the run's own command line can be given as it is."""
    up: argparse.ArgumentParser | argparse._ArgumentGroup = parser
    if ignored:
        up = parser.add_argument_group("efpsn up's own flags (accepted and ignored: the "
                                       "guarantee does not depend on them)")
    up.add_argument("--results", default=None,
                    help="results folder (default: results/run-TIME); a folder that holds a "
                         "stopped run resumes it")
    up.add_argument("--host", default="127.0.0.1", help="loopback address to serve on")
    up.add_argument("--quiet", action="store_true", help="no progress bar")
    up.add_argument("--insecure", action="store_true",
                    help="plaintext gRPC (default: a fresh CA and certificates in RESULTS/tls, "
                         "mutual TLS everywhere)")
    up.add_argument("--no-fork", action="store_true",
                    help="start every agent as its own interpreter (default: fork them all from "
                         "one process that loaded Python, torch, numpy and phe once, so that "
                         "memory is shared)")
    up.add_argument("--cpu-placement", choices=PLACEMENTS, default=DEFAULT_PLACEMENT,
                    help="each agent's CPUs, out of efpsn up's own: blocks (consecutive agents, "
                         "ring neighbours, on one CPU), spread (agent k on CPU k mod m: ring "
                         "neighbours apart), none (not placed); fewer agents than CPUs: each its "
                         f"own share; one CPU: none (default {DEFAULT_PLACEMENT}: an agent's "
                         "threads and its neighbours' wake each other on one CPU, not across)")
    up.add_argument("--checkpoint-every", type=int, default=50,
                    help="agents save their phase II state every this many rounds")
    add_departure_flag(up)
    if not ignored:  # test hooks that break privacy: never accepted by efpsn privacy
        add_debug_flags(parser)
