"""`efpsn status`: every agent's phase, round, neighbours and departures, for a local run (its
results folder) or a run on several hosts (its coordinator, or one of its agents)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

__all__ = ["register"]

EPILOG = """\
examples:
  efpsn status results/run-X                     a local run (efpsn up): every agent
  efpsn status --coordinator 192.0.2.10:50050 --tls-dir tls
  efpsn status --agent agent2=192.0.2.12:50051 --tls-dir tls --json

With --tls-dir, present your own certificate (the folder's only key, or --tls-name NAME):
a party of the run sees every agent's neighbours, when each was last heard and who left;
another certificate of the CA sees counts only; figures of an agent's own data (loss,
accuracy) go to that agent's own operator only.
"""


def _handler(args: argparse.Namespace) -> int:
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")  # a refused handshake is said in one line
    from efpsn.monitor.gather import from_agent, from_coordinator, from_results, own_credentials
    from efpsn.monitor.lines import progress_json, progress_lines

    given = [w for w in (args.results, args.coordinator, args.agent) if w]
    if len(given) != 1:
        raise ValueError("give one of RESULTS (a local run), --coordinator HOST:PORT or "
                         "--agent NAME=HOST:PORT")
    if args.results:
        progress = asyncio.run(from_results(Path(args.results)))
    else:
        tls = None if args.insecure else own_credentials(_tls_dir(args), args.tls_name)
        if args.coordinator:
            progress = asyncio.run(from_coordinator(args.coordinator, tls=tls,
                                                    name=args.coordinator_name))
        else:
            name, sep, address = args.agent.partition("=")
            if not sep or not name or ":" not in address:
                raise ValueError(f"--agent expects NAME=HOST:PORT (the name its certificate "
                                 f"carries), got {args.agent!r}")
            progress = asyncio.run(from_agent(name, address, tls=tls))
    if args.json:
        print(json.dumps(progress_json(progress), indent=2))
    else:
        print("\n".join(progress_lines(progress)))
    return 0 if any(r.status is not None for r in progress.rows) else 1


def _tls_dir(args: argparse.Namespace) -> str:
    if not args.tls_dir:
        raise ValueError("--tls-dir DIR is needed to reach a run with mutual TLS (your own "
                         "NAME.pem, NAME.key and the run's ca.pem); --insecure for plaintext")
    return args.tls_dir


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `efpsn status` to the `efpsn` parser's subcommands; returns its parser."""
    parser = subparsers.add_parser(
        "status", help="every agent's phase, round, neighbours and departures",
        description="One line per agent of a running network: its phase, its round and about "
                    "how many are left (to the run's last round; the stop rule may end it at "
                    "an earlier check), its neighbours with the seconds since it last heard "
                    "each, who left the run, and whom it waits for. Exit 1 when no agent "
                    "answers.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="?", default=None, metavar="RESULTS",
                        help="a local run's results folder (efpsn up --results; it holds the "
                             "addresses and the certificates)")
    parser.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                        help="a run on several hosts, through its coordinator (while it serves: "
                             "--keep-serving)")
    parser.add_argument("--coordinator-name", default="coordinator",
                        help="the name the coordinator's certificate carries (default "
                             "coordinator)")
    parser.add_argument("--agent", default=None, metavar="NAME=HOST:PORT",
                        help="a run on several hosts, through one agent (and the neighbours it "
                             "names, and theirs)")
    parser.add_argument("--tls-dir", default=None,
                        help="your own NAME.pem and NAME.key and the run's ca.pem")
    parser.add_argument("--tls-name", default=None,
                        help="whose certificate in --tls-dir to present (default: its only key)")
    parser.add_argument("--insecure", action="store_true",
                        help="plaintext, for a run started with --insecure")
    parser.add_argument("--json", action="store_true", help="the same as JSON, for scripts")
    parser.set_defaults(handler=_handler, numeric=False)
    return parser
