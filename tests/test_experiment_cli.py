"""`efpsn experiment all --quick` through the console script, on the cheap experiments: the whole
set takes about 5.5 min (256 s of CPU, measured on the shared 2-core machine), too much for every
CI run, and tests/test_experiments.py already runs each expensive sweep, shortened."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

EXPENSIVE = "accuracy-convex,accuracy-nonconvex,attack,network-check"


def check_all_output(stdout: str, root: Path, names: list[str]) -> None:
    """The closing table names every experiment run, in order, and each wrote its results."""
    lines = stdout.splitlines()
    summary = lines[lines.index("== all experiments ==") + 1:]
    assert [line.split()[0] for line in summary] == [*names, "total"], summary
    assert summary[-1].endswith(f"results under {root}/")
    for name in names:
        results = json.loads((root / f"{name}-quick" / "results.json").read_text())
        assert results["experiment"] == name


def test_experiment_all_quick_through_the_cli(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "efpsn", "experiment", "all", "--quick", "--out",
         str(tmp_path / "exp"), "--skip", EXPENSIVE, "--figures", str(tmp_path / "figures")],
        check=False, capture_output=True, text=True, timeout=280,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    check_all_output(out.stdout, tmp_path / "exp", ["perturbation", "privacy"])
    for name in ("perturbation", "privacy"):
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
