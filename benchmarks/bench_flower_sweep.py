"""The local-epochs / step sweep behind bench_flower.py's Flower defaults, without Flower.

    python benchmarks/bench_flower_sweep.py --data-dir D [--target 0.89] [--rounds 20]
        [--epochs 1,2,3,5] [--steps 0.05,0.1,0.2,0.3,0.5] [--batch-size 64]

FedAvg as benchmarks/flower_app runs it, in one process: every agent's local SGD from the
global model (benchmarks/flower_app/efpsn_flower/model.py, the client's own code and its
seeds [0, node, round]), the models averaged weighted by training rows, the global model
evaluated on D's test file after every round. The accuracies are the deployment engine's
plain FedAvg's to the last digit (its rounds only add time), so the pair reaching the target
in the fewest rounds is the one that reaches it soonest there. Prints one line per pair.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent / "flower_app"))

from efpsn_flower.model import accuracy, load_rows, local_sgd


def _numbers(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def fedavg_curve(data: list[tuple[np.ndarray, np.ndarray]], test: tuple[np.ndarray, np.ndarray],
                 *, rounds: int, epochs: int, lr: float, batch: int, l2: float
                 ) -> list[float]:
    """The global model's test accuracy after each of `rounds` FedAvg rounds from 0."""
    x_test, y_test = test
    w, b = np.zeros((10, x_test.shape[1])), np.zeros(10)
    weights = np.array([len(y) for _, y in data], dtype=np.float64)
    weights /= weights.sum()
    curve = []
    for round_ in range(1, rounds + 1):
        local = [local_sgd(w, b, x, y, epochs=epochs, batch=batch, lr=lr, l2=l2,
                           rng=np.random.default_rng([0, node, round_]))
                 for node, (x, y) in enumerate(data)]
        w = sum(m * lw for m, (lw, _) in zip(weights, local))
        b = sum(m * lb for m, (_, lb) in zip(weights, local))
        curve.append(accuracy(w, b, x_test, y_test))
    return curve


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--target", type=float, default=0.89)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--epochs", default="1,2,3,5")
    p.add_argument("--steps", default="0.05,0.1,0.2,0.3,0.5")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--l2", type=float, default=1e-2)
    args = p.parse_args(argv)
    agents = sorted(args.data_dir.glob("agent*/train.npz"),
                    key=lambda q: int(q.parent.name.removeprefix("agent")))
    from efpsn.data.local import resolve_holdout  # the rows `efpsn up` trains on

    holdout = resolve_holdout(None, public_test=True)
    data = [load_rows(q, holdout=holdout, seed=0) for q in agents]
    test = load_rows(args.data_dir / "test.npz", holdout=0.0, seed=0)
    for epochs in (int(e) for e in _numbers(args.epochs)):
        for lr in _numbers(args.steps):
            curve = fedavg_curve(data, test, rounds=args.rounds, epochs=epochs, lr=lr,
                                 batch=args.batch_size, l2=args.l2)
            hit = next((k + 1 for k, a in enumerate(curve) if a >= args.target), None)
            when = (f"at round {hit}" if hit is not None else
                    f"not within {args.rounds} rounds")
            print(f"epochs {epochs} step {lr:g}: {args.target:g} {when}; accuracy by round "
                  f"{' '.join(f'{a:.3f}' for a in curve)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
