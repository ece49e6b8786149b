"""Every mode a user can pick says what it protects (efpsn/privacy/modes.py): a measured worst
attack or an accountant's epsilon, against whom, and a loud BROKEN where a measured attacker
removes the mask; the line reaches simulate's output and its JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from efpsn.params.config import PRESETS, RunConfig
from efpsn.privacy.modes import ANY_GAMMA, MEASURED, mode_of, privacy_statement
from efpsn.topology import build_graph

RING = build_graph("ring", 5)


@pytest.mark.parametrize(("changes", "mode", "broken"), [
    ({}, "fading", False),
    ({"refresh": "never"}, "fixed", True),
    ({"refresh": "never", "K": 2, "N": 15701}, "fixed-k2", True),
    ({"refresh": "every:10", "algorithm": "dsgd"}, "every:R", True),
    ({"refresh": "every:1", "algorithm": "dsgd"}, "every:1", False),
    ({"selection": "last-bias"}, "partial", True),
    ({"mask": "none"}, "none", True),
    ({"mask": "independent"}, "fixed", True),
])
def test_every_mode_has_a_measured_row_and_says_when_it_is_broken(changes, mode, broken) -> None:
    config = RunConfig(**changes).resolved()
    statement = privacy_statement(config, RING)
    assert statement.mode == mode_of(config) == mode
    line = statement.line()
    assert line.startswith("privacy: BROKEN: " if broken else "privacy: ") and "\n" not in line
    assert ("BROKEN" in line) is broken
    assert " dB" in line and "see docs/RESULTS.md" in line
    assert statement.to_json()["line"] == line


def test_the_presets_name_their_numbers() -> None:
    dp = RunConfig.preset("dp").resolved()
    statement = privacy_statement(dp, RING)
    # the accountant's epsilon at the preset's gamma (docs/RESULTS.md: 2.67 at 3.5e4)
    assert statement.epsilon == pytest.approx(2.67, abs=0.01)
    assert "epsilon 2.67 per sample" in statement.line() and "logreg 11.2 dB" in statement.line()
    paper = privacy_statement(RunConfig.preset("paper").resolved(), RING)
    assert paper.line().startswith("privacy: BROKEN") and paper.epsilon is None
    assert set(PRESETS) == {"paper", "dp"}


def test_the_worst_is_taken_at_or_below_the_run_s_gamma() -> None:
    every = MEASURED["every:1"]
    assert every.worst(3.5e4)["logreg"] == (11.2, 3.5e4)
    assert every.worst(3.4e4)["logreg"] == (16.2, 3e4)  # never a gamma above the run's
    assert every.worst(0.5) == {"logreg": None, "lenet": None}
    assert MEASURED["fixed"].worst(1e9)["logreg"][1] == ANY_GAMMA
    low = privacy_statement(RunConfig(refresh="every:1", algorithm="dsgd", gamma=0.5), RING)
    assert "not measured at this gamma" in low.line()


def test_a_single_neighbour_is_named() -> None:
    line = privacy_statement(RunConfig(topology="path").resolved(), build_graph("path", 5)).line()
    assert "agents agent1, agent5 have a single neighbour" in line
    assert "single neighbour" not in privacy_statement(RunConfig().resolved(), RING).line()


def test_epsilon_exists_only_where_the_accountant_gives_one() -> None:
    for changes in ({}, {"refresh": "never"}, {"refresh": "every:1", "algorithm": "dsgd"},
                    {"refresh": "every:1", "algorithm": "dsgd", "clip": 1.0}):
        statement = privacy_statement(RunConfig(**changes).resolved(), RING)
        assert statement.epsilon is None and "no epsilon (" in statement.line()
    clipped = RunConfig(refresh="every:1", algorithm="dsgd", clip=1.0, batch_size=64,
                        iterations=100).resolved()
    eps = privacy_statement(clipped, RING).epsilon
    assert eps is not None and math.isfinite(eps) and eps > 0


def test_simulate_prints_the_line_and_writes_it(tmp_path: Path) -> None:
    from efpsn.cli.main import main

    out = tmp_path / "sim.json"
    assert main(["simulate", "--agents", "3", "--topology", "ring", "--iterations", "3",
                 "--eval-every", "3", "--quiet", "--no-optimum", "--json", str(out)]) == 0
    privacy = json.loads(out.read_text())["privacy"]
    assert privacy["mode"] == "fading" and privacy["line"].startswith("privacy: ")
    assert privacy["epsilon"] is None and privacy["worst_psnr_db"]["logreg"]["psnr_db"] == 12.8
