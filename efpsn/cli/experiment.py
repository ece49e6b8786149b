"""`efpsn experiment NAME [--quick] [--out DIR] ...`: one command per experiment of Sec. 5."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from efpsn.experiments import EXPERIMENTS
from efpsn.experiments.common import DEFAULT_ROOT, parse_floats
from efpsn.flags.arguments import add_run_arguments

__all__ = ["default_out", "register", "run_experiment"]

Runner = Callable[[argparse.Namespace, str | Path | None], dict[str, Any]]


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in parse_floats(text))


def _words(text: str) -> tuple[str, ...]:
    return tuple(w.strip() for w in text.split(",") if w.strip())


def _words_or_none(text: str) -> tuple[str, ...]:
    """Like _words; "none" is the empty list."""
    return () if text.strip() == "none" else _words(text)


def _floats_or_none(text: str) -> tuple[float, ...]:
    """Like parse_floats; "none" is the empty list."""
    return () if text.strip() == "none" else parse_floats(text)


def _profile(args: argparse.Namespace) -> str:
    return "quick" if args.quick else "full"


# ------------------------------------------------------------------------------ runners


def _accuracy_convex(args: argparse.Namespace, out: str | Path | None) -> dict[str, Any]:
    from efpsn.experiments import accuracy_convex

    if getattr(args, "frontier_only", False):
        if not getattr(args, "attack_results", None) or out is None:
            raise ValueError("--frontier-only redraws the frontier of the results in --out with "
                             "--attack-results: give --attack-results")
        return accuracy_convex.redraw_frontier(out, attack_results=args.attack_results,
                                               figures_to=args.figures)
    settings = accuracy_convex.settings_for(
        _profile(args), iterations=_rounds(args),
        gammas=getattr(args, "gammas", None), extras=not getattr(args, "no_extras", False),
        noise_seed=getattr(args, "noise_seed", None), selection=getattr(args, "selection", None),
        refreshes=getattr(args, "refreshes", None),
        refresh_gammas=getattr(args, "refresh_gammas", None), clips=getattr(args, "clips", None),
        clip_gammas=getattr(args, "clip_gammas", None),
        attack_results=getattr(args, "attack_results", None),
    )
    return accuracy_convex.run(settings, out=out, figures_to=args.figures)


def _accuracy_nonconvex(args: argparse.Namespace, out: str | Path | None) -> dict[str, Any]:
    from efpsn.experiments import accuracy_nonconvex

    settings = accuracy_nonconvex.settings_for(
        _profile(args), iterations=_rounds(args),
        gammas=getattr(args, "gammas", None), noise_seed=getattr(args, "noise_seed", None),
        refreshes=getattr(args, "refreshes", None),
        refresh_gammas=getattr(args, "refresh_gammas", None),
    )
    return accuracy_nonconvex.run(settings, out=out, figures_to=args.figures,
                                  estimate_only=getattr(args, "estimate", False))


def _attack(args: argparse.Namespace, out: str | Path | None) -> dict[str, Any]:
    from efpsn.experiments import attack

    only_many = getattr(args, "only_many_rounds", False)
    settings = attack.settings_for(
        _profile(args), models=() if only_many else getattr(args, "models", None),
        gammas=getattr(args, "gammas", None),
        seeds=getattr(args, "seeds", None), images_per_seed=getattr(args, "images", None),
        iterations=getattr(args, "attack_iterations", None),
        attack_rounds=getattr(args, "attack_rounds", None),
        perturbations=getattr(args, "perturbations", None),
        multi_round=False if getattr(args, "no_multi_round", False) else None,
        refreshes=getattr(args, "refreshes", None),
        refresh_gammas=getattr(args, "refresh_gammas", None),
        averaging_rounds=getattr(args, "averaging_rounds", None),
        base=attack.base_config(args.base) if getattr(args, "base", None) else None,
    )
    if getattr(args, "no_many_rounds", False):
        settings = attack.dataclasses.replace(settings, many_rounds=None)
    messages = getattr(args, "messages", "clear")
    if messages != "clear" and settings.many_rounds is not None:
        settings = attack.dataclasses.replace(settings, many_rounds=attack.dataclasses.replace(
            settings.many_rounds, messages=messages))
    return attack.run(settings, out=out, figures_to=args.figures)


def _perturbation(args: argparse.Namespace, out: str | Path | None) -> dict[str, Any]:
    import dataclasses

    from efpsn.experiments import perturbing_function

    settings = perturbing_function.PROFILES[_profile(args)]
    if getattr(args, "no_fresh", False):
        settings = dataclasses.replace(settings, fresh_seed=None)
    elif getattr(args, "fresh_seed", None) is not None:
        settings = dataclasses.replace(settings, fresh_seed=args.fresh_seed)
    return perturbing_function.run(settings, out=out, figures_to=args.figures)


def _privacy(args: argparse.Namespace, out: str | Path | None) -> dict[str, Any]:
    import dataclasses

    from efpsn.experiments import epsilon

    settings = epsilon.PROFILES[_profile(args)]
    changes = {k: getattr(args, k, None) for k in ("delta", "agents", "p", "q", "sensitivity")}
    settings = dataclasses.replace(settings, **{k: v for k, v in changes.items() if v is not None})
    return epsilon.run(settings, out=out, figures_to=args.figures)


def _rounds(args: argparse.Namespace) -> int | None:
    """--iterations N (a Rounds value, efpsn/params/values.py), or None: the profile's."""
    rounds = getattr(args, "iterations", None)
    return None if rounds is None else rounds.count


def _network_check(args: argparse.Namespace, out: str | Path | None) -> dict[str, Any]:
    from efpsn.experiments import network_check

    settings = network_check.settings_for(
        _profile(args), iterations=_rounds(args),
        key_bits=getattr(args, "key_bits", None), gamma=getattr(args, "gamma", None),
        noise_seed=getattr(args, "noise_seed", None),
    )
    return network_check.run(settings, out=out)


RUNNERS: dict[str, Runner] = {
    "accuracy-convex": _accuracy_convex,
    "accuracy-nonconvex": _accuracy_nonconvex,
    "attack": _attack,
    "perturbation": _perturbation,
    "privacy": _privacy,
    "network-check": _network_check,
}
# `all` runs the cheap ones first, the LeNet sweep (by far the most expensive) last.
ALL_ORDER = ("perturbation", "privacy", "accuracy-convex", "network-check", "attack",
             "accuracy-nonconvex")
assert set(RUNNERS) == set(EXPERIMENTS) == set(ALL_ORDER)


def default_out(name: str, *, quick: bool, root: Path = DEFAULT_ROOT) -> Path:
    """results/experiments/NAME, or NAME-quick for --quick (a quick run never overwrites a full
    one)."""
    return root / (f"{name}-quick" if quick else name)


def run_experiment(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one experiment from parsed arguments."""
    if name not in RUNNERS:
        raise ValueError(f"unknown experiment {name!r}: expected one of {sorted(RUNNERS)}")
    out = args.out if args.out is not None else default_out(name, quick=args.quick)
    return RUNNERS[name](args, out)


def _handle_one(args: argparse.Namespace) -> int:
    run_experiment(args.experiment, args)
    return 0


def _handle_all(args: argparse.Namespace) -> int:
    root = Path(args.out) if args.out is not None else DEFAULT_ROOT
    skip = set(args.skip or ())
    unknown = skip - set(RUNNERS)
    if unknown:
        raise ValueError(f"--skip: unknown experiments {sorted(unknown)}; known: {sorted(RUNNERS)}")
    walls = []
    for name in ALL_ORDER:
        if name in skip:
            continue
        summary = RUNNERS[name](args, default_out(name, quick=args.quick, root=root))
        walls.append((name, summary["wall_seconds"]))
    print("\n== all experiments ==")
    for name, seconds in walls:
        print(f"{name:20s} {seconds:8.0f} s")
    print(f"{'total':20s} {sum(s for _, s in walls):8.0f} s; results under {root}/")
    return 0


# ------------------------------------------------------------------------------ parser


def _common(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="the quick profile (a few minutes on 2 cores) instead of the paper's")
    if name == "all":
        parser.add_argument("--out", metavar="DIR", default=None,
                            help=f"root folder (default {DEFAULT_ROOT}); each experiment writes "
                                 "into DIR/NAME, or DIR/NAME-quick with --quick")
    else:
        parser.add_argument("--out", metavar="DIR", default=None,
                            help=f"output folder (default {DEFAULT_ROOT}/{name}, or "
                                 f"{DEFAULT_ROOT}/{name}-quick with --quick)")
    parser.add_argument("--figures", metavar="DIR", default=None,
                        help="also copy the PNG figures into DIR (e.g. docs/figures)")


def _add_sweep_overrides(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser, only=("iterations",),
                      title="run parameters instead of the profile's (an intermediate profile)",
                      show_defaults=False)
    parser.add_argument("--gammas", type=parse_floats, default=None, metavar="G1,G2,...",
                        help="noise levels instead of the profile's")
    parser.add_argument("--noise-seed", type=int, default=None,
                        help="seed of every agent's noise (simulations are not private)")
    parser.add_argument("--refreshes", type=_words_or_none, default=None,
                        metavar="never,every:1,every:10",
                        help="rows with every parameter perturbed (K=1, uniform measure) and the "
                             "zero-sum masks fixed (never) or refreshed every R rounds; 'none' "
                             "runs no such rows")
    parser.add_argument("--refresh-gammas", type=parse_floats, default=None, metavar="1,1e2,...",
                        help="noise levels of those rows")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `experiment` with one sub-command per experiment (and `all`) to the efpsn CLI."""
    exp = subparsers.add_parser(
        "experiment", help="reproduce the paper's evaluation (Sec. 5), one command each",
        description="Reproduce the paper's evaluation. Each experiment writes rows.csv, "
                    "results.json, table.md and PNG figures into --out and prints its table. "
                    "Without --quick the paper's settings are used.",
    )
    sub = exp.add_subparsers(dest="experiment", required=True, metavar="NAME")

    p = sub.add_parser("accuracy-convex",
                       help="logistic regression: ||x_bar - x*|| and accuracy vs gamma "
                            "(Sec. 5.2.1)")
    _common(p, "accuracy-convex")
    _add_sweep_overrides(p)
    p.add_argument("--no-extras", action="store_true",
                   help="skip the extra rows (full-batch gradient tracking and DSGD to 1e6)")
    p.add_argument("--selection", default=None, metavar="all",
                   help="perturb every parameter (K=1, N=d+1, uniform-measure basis) instead of "
                        "the paper's last-layer bias")
    p.add_argument("--clips", type=_floats_or_none, default=None, metavar="C1,C2",
                   help="rows with masks refreshed every round and per-sample gradients clipped "
                        "to C (what the accountant's epsilon needs), with their own noise-free "
                        "run; 'none' runs no such rows")
    p.add_argument("--clip-gammas", type=parse_floats, default=None, metavar="1e4,1e5,...",
                   help="noise levels of the clipped rows")
    p.add_argument("--attack-results", type=_words, default=None, metavar="DIR1,DIR2",
                   help="results of `efpsn experiment attack` (folders or results.json) whose "
                        "refreshed rows give the frontier's strongest-attacker PSNR")
    p.add_argument("--frontier-only", action="store_true",
                   help="run nothing: redraw the frontier of the earlier results in --out with "
                        "--attack-results")

    p = sub.add_parser("accuracy-nonconvex",
                       help="LeNet: ||avg grad||^2 and accuracy vs gamma (Sec. 5.2.2)")
    _common(p, "accuracy-nonconvex")
    _add_sweep_overrides(p)
    p.add_argument("--estimate", action="store_true",
                   help="only measure seconds per round here and print the profile's cost")

    p = sub.add_parser("attack",
                       help="iDLG on agent 1: reconstructions and PSNR vs gamma (Sec. 5.3)")
    _common(p, "attack")
    p.add_argument("--models", type=_words, default=None, metavar="logreg,lenet")
    p.add_argument("--gammas", type=parse_floats, default=None, metavar="0,1e1,...",
                   help="noise levels (0: no perturbation)")
    p.add_argument("--seeds", type=_ints, default=None, metavar="S1,S2,...",
                   help="noise seeds (each also picks the images and the dummy init)")
    p.add_argument("--images", type=int, default=None, help="images per seed")
    p.add_argument("--attack-iterations", type=int, default=None,
                   help="L-BFGS steps (each up to 20 iterations, as in the DLG code)")
    p.add_argument("--attack-rounds", type=_ints, default=None, metavar="R1,R2",
                   help="x_1 = agent 1's iterate after R rounds of noise-free DSGD")
    p.add_argument("--perturbations", type=_words_or_none, default=None,
                   metavar="last-bias,all-k1,all-k2",
                   help="fixed-mask perturbation settings: the paper's last-layer bias, every "
                        "parameter with K=1, every parameter with the squares added (K=2); "
                        "'none' runs only the refreshed rows")
    p.add_argument("--no-multi-round", action="store_true",
                   help="skip the attackers that combine several rounds of agent 1")
    p.add_argument("--refreshes", type=_words_or_none, default=None,
                   metavar="every:1,every:10",
                   help="rows with agent 1's mask refreshed every R rounds (every parameter, "
                        "K=1); 'none' runs only the fixed masks")
    p.add_argument("--refresh-gammas", type=parse_floats, default=None, metavar="1,1e2,...",
                   help="noise levels of the refreshed rows")
    p.add_argument("--base", choices=("paper", "defaults"), default=None,
                   help="the run agent 1's iterates and mask rate come from: the paper's "
                        "preset (DSGD, batch 64; the default) or the defaults (logreg: agt full "
                        "batch; lenet: agt on batches of 64, the one-cycle step, 1,500 rounds)")
    p.add_argument("--averaging-rounds", type=int, default=None, metavar="A",
                   help="rounds the averaging attacker averages over (default: the run's "
                        "10,000; quick: 1,000)")
    many = p.add_mutually_exclusive_group()
    many.add_argument("--only-many-rounds", action="store_true",
                      help="only the attackers that use many or late rounds (late, all rounds, "
                           "regression) on real runs where agent 0 holds one sample")
    many.add_argument("--no-many-rounds", action="store_true",
                      help="skip the attackers that use many or late rounds")
    p.add_argument("--messages", choices=("clear", "aggregate"), default="clear",
                   help="the many-round attackers' runs: messages in the clear, or aggregated "
                        "per receiver (the neighbour sees only its neighbourhood's sum)")

    p = sub.add_parser("perturbation",
                       help="the 2-D perturbing function for (K,m,N) = (3,2,5) (Sec. 5.1)")
    _common(p, "perturbation")
    p.add_argument("--fresh-seed", type=int, default=None,
                   help="seed of the freshly drawn noise sequence shown next to the paper's")
    p.add_argument("--no-fresh", action="store_true", help="show only the paper's sequence")

    p = sub.add_parser("privacy", help="Theorem 4.1: epsilon vs gamma for several topologies")
    _common(p, "privacy")
    p.add_argument("--delta", type=float, default=None)
    p.add_argument("--agents", type=_ints, default=None, metavar="N1,N2")
    add_run_arguments(p, only=("p",), title="run parameters instead of the profile's",
                      show_defaults=False)
    p.add_argument("--q", type=float, default=None)
    p.add_argument("--sensitivity", type=float, default=None)

    p = sub.add_parser("network-check",
                       help="the convex run at gamma=1e3 through real gRPC agents vs the simulator")
    _common(p, "network-check")
    add_run_arguments(p, only=("iterations", "key_bits", "gamma"),
                      title="run parameters instead of the profile's (key size: 3072 full, "
                            "2048 quick)", show_defaults=False)
    p.add_argument("--noise-seed", type=int, default=None)

    for name in EXPERIMENTS:
        sub.choices[name].set_defaults(handler=_handle_one)

    p = sub.add_parser("all", help="every experiment in turn (LeNet last: hours without --quick)")
    _common(p, "all")
    p.add_argument("--skip", type=_words, default=None, metavar="NAME1,NAME2",
                   help="experiments to leave out")
    p.set_defaults(handler=_handle_all)
