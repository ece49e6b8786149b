"""`efpsn experiment all --quick` through the console script, on the cheap experiments only (the
whole quick set takes many minutes on 2 cores; tests/test_experiments.py runs each sweep)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

EXPENSIVE = "accuracy-convex,accuracy-nonconvex,attack,network-check"


def test_experiment_all_quick_through_the_cli(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "efpsn", "experiment", "all", "--quick", "--out",
         str(tmp_path / "exp"), "--skip", EXPENSIVE, "--figures", str(tmp_path / "figures")],
        check=False, capture_output=True, text=True, timeout=280,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    summary = lines[lines.index("== all experiments ==") + 1:]
    assert [line.split()[0] for line in summary] == ["perturbation", "privacy", "total"]
    assert summary[-1].endswith(f"results under {tmp_path / 'exp'}/")
    for name in ("perturbation", "privacy"):
        results = json.loads((tmp_path / "exp" / f"{name}-quick" / "results.json").read_text())
        assert results["experiment"] == name
        assert (tmp_path / "figures" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "exp" / "attack-quick").exists()


def test_experiment_all_refuses_an_unknown_skip() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "efpsn", "experiment", "all", "--quick", "--skip", "atack"],
        check=False, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 2
    assert out.stderr.startswith("efpsn: error: --skip: unknown experiments ['atack']; known: ")
    assert out.stderr.count("\n") == 1
