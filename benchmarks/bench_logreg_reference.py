"""Logistic regression over private image folders against scikit-learn on the pooled rows.

    python benchmarks/bench_logreg_reference.py --data-dir F [--l2 default,3e-3] [--json OUT]

F is a data folder of `efpsn data split` with npz images and a public test.npz (e.g. `--data
fashion-mnist --agents 5`). Per L2 weight (`default`: the logreg task's, 1e-2):
- ours: `efpsn up --data-dir F --quiet [--l2 L]` alone (every private row trained on: the folder
  has a public test file), its public-test accuracy, whether the certificate came and after how
  many rounds, and its own wall time;
- the reference: scikit-learn's LogisticRegression (lbfgs) on every agent's rows pooled, pixels
  / 255 as the schema's unit scale gives them, at the same objective (mean loss + (l2 / 2)
  ||(W, b)||^2: C = 1 / (n l2), the bias a column of ones so that it is penalised as ours is),
  scored on the same test.npz; once more at its own defaults (C = 1, the bias not penalised).
The reference reads what no party can pool: it is the centralised answer the network must match,
not a deployment. The machine's load is printed before and after each run.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from efpsn.data.local import read_data_file
from efpsn.params.model_sizes import DEFAULT_L2
from efpsn.process.runtime import machine_load

EFPSN = [sys.executable, "-m", "efpsn"]


def pooled(folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every agent folder's rows, and the public test set, as pixels / 255 (float64)."""
    parts = [read_data_file(p, who=p.name) for p in sorted(folder.glob("agent*")) if p.is_dir()]
    if not parts:
        raise SystemExit(f"{folder}: no agent folders (make them with `efpsn data split`)")
    if not (folder / "test.npz").exists():
        raise SystemExit(f"{folder}: no public test.npz to score on")
    x_test, y_test = read_data_file(folder / "test.npz", who="test")
    if any(x.dtype != np.uint8 for x in (x_test, *(x for x, _ in parts))):
        raise SystemExit(f"{folder}: images of uint8 pixels only (the reference scales them "
                         "by 1 / 255, as the schema's unit scale does)")

    def flat(x: np.ndarray) -> np.ndarray:
        return x.reshape(len(x), -1).astype(np.float64) / 255.0
    return (flat(np.concatenate([x for x, _ in parts])), np.concatenate([y for _, y in parts]),
            flat(x_test), y_test)


def reference(data: tuple[np.ndarray, ...], *, c: float, same_objective: bool
              ) -> dict[str, float]:
    """scikit-learn's fit and its test accuracy; `same_objective`: ours (the bias penalised
    like the weights), else its defaults' (an unpenalised intercept)."""
    from sklearn.linear_model import LogisticRegression
    x, y, x_test, y_test = data
    if same_objective:
        x, x_test = (np.hstack([a, np.ones((len(a), 1))]) for a in (x, x_test))
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lbfgs' iteration cap, reported as iterations below
        model = LogisticRegression(C=c, max_iter=2000, fit_intercept=not same_objective)
        model.fit(x, y)
    return {"accuracy": float(model.score(x_test, y_test)), "C": c,
            "seconds": time.perf_counter() - start, "iterations": int(np.max(model.n_iter_))}


def ours(folder: Path, l2: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-logreg-") as tmp:
        cmd = [*EFPSN, "up", "--data-dir", str(folder), "--quiet", "--results", tmp]
        if l2 != "default":
            cmd += ["--l2", l2]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
        summary = json.loads((Path(tmp) / "summary.json").read_text())
    return {"accuracy": summary["final"]["accuracy"], "wall_seconds": summary["wall_seconds"],
            "converged": summary["convergence"]["converged"],
            "line": summary["convergence"]["line"]}


def l2_list(text: str) -> list[str]:
    """'default,3e-3' -> ['default', '3e-3'], each a weight >= 0 or 'default'."""
    weights = [w.strip() for w in text.split(",") if w.strip()]
    for w in weights:
        try:
            ok = w == "default" or math.isfinite(float(w)) and float(w) > 0
        except ValueError:
            ok = False
        if not ok:
            raise argparse.ArgumentTypeError(f"{w!r} is not 'default' or a weight > 0")
    if not weights:
        raise argparse.ArgumentTypeError("no L2 weight given")
    return weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--l2", type=l2_list, default=["default"],
                        help="comma-separated L2 weights > 0, 'default' for the task's")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    weights = args.l2
    data = pooled(args.data_dir)
    n = len(data[1])
    rows = []
    for w in weights:
        l2 = DEFAULT_L2["logreg"] if w == "default" else float(w)
        before = machine_load()
        mine = ours(args.data_dir, w)
        ref = reference(data, c=1.0 / (n * l2), same_objective=True)
        rows.append({"l2": l2, "ours": mine, "reference": ref,
                     "load": [before, machine_load()]})
        print(f"l2 {l2:g}: ours {mine['accuracy']:.4f} in {mine['wall_seconds']:.1f} s "
              f"({mine['line']}); scikit-learn at the same L2 {ref['accuracy']:.4f} "
              f"({ref['iterations']} iterations); {rows[-1]['load'][0]} -> "
              f"{rows[-1]['load'][1]}", flush=True)
    default = reference(data, c=1.0, same_objective=False)
    print(f"scikit-learn at its default C = 1 on the {n} pooled rows: {default['accuracy']:.4f}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "sklearn_default": default}, indent=2))


if __name__ == "__main__":
    main()
