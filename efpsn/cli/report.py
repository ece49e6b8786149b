"""`efpsn report RESULTS`: the picture of a run (RESULTS/training.png), for any results folder."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["register"]


def _handler(args: argparse.Namespace) -> int:
    from efpsn.report.picture import write_picture

    folder = Path(args.results)
    path = write_picture(folder, out=Path(args.out) if args.out else None)
    print(f"wrote {path}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `efpsn report` to the `efpsn` parser's subcommands; returns its parser."""
    parser = subparsers.add_parser(
        "report", help="the picture of a run: RESULTS/training.png",
        description="Draw a run's training from the histories its agents left: the objective "
                    "(each agent's loss on its own data), the test accuracy, the consensus "
                    "(distance to a neighbour's iterate) and the certificate's bound against "
                    "the rounds, departures marked. `efpsn up` writes it at the end of every "
                    "run; this makes it for any results folder, also of a stopped or older run "
                    "(an agent that did not finish: to its last checkpoint).")
    parser.add_argument("results", metavar="RESULTS", help="the run's results folder")
    parser.add_argument("--out", default=None, metavar="FILE.png",
                        help="where to write it (default RESULTS/training.png)")
    parser.set_defaults(handler=_handler, numeric=False)
    return parser
