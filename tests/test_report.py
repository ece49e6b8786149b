"""`efpsn report`'s reading and drawing on a hand-made results folder: two agents that finished
(result.json), one that was killed (its last checkpoint's history), a departure; the
certificate's bound per round from the agents' measures; the PNG; and one line for a folder
that holds no run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from efpsn.optimize.certificate import distance_bound
from efpsn.params.config import RunConfig
from efpsn.report.curves import Departure, certificate_curve, read_curves
from efpsn.report.picture import write_picture

SETTINGS = RunConfig(agents=3, iterations=400, l2=0.01).to_dict()


def _record(t: int, k: int) -> dict[str, float]:
    decay = 0.5 ** (t / 50)
    return {"round": t, "loss": 0.3 + decay / k, "accuracy": 0.9 - 0.5 * decay,
            "step": 0.1 * decay, "gap": decay, "tracker": 2 * decay,
            "relative_step": 0.1 * decay / 4, "relative_gap": decay / 4,
            "relative_tracker": 2 * decay / 4}  # ||x_i|| = 4


def _folder(root: Path) -> Path:
    departure = {"agent": "agent3", "round": 201, "rebase_round": 206, "late": []}
    for k in (1, 2):
        history = [{"round": 0, "loss": 2.3, "accuracy": 0.1}] + [
            _record(t, k) for t in range(100, 401, 100)]
        history[3]["departed"] = "agent3"  # a record may carry words beside its numbers
        (root / f"agent{k}").mkdir(parents=True)
        (root / f"agent{k}" / "result.json").write_text(json.dumps({
            "settings": SETTINGS, "run_id": "r-1", "name": f"agent{k}", "history": history,
            "final": history[-1], "departures": [departure]}))
    checkpoint = root / "agent3" / "state" / "checkpoints" / "round-00000200"
    checkpoint.mkdir(parents=True)
    (checkpoint / "state.json").write_text(json.dumps(
        {"round": 200, "history": [_record(t, 3) for t in (100, 200)]}))
    return root


def test_the_curves_of_a_run_with_a_killed_agent(tmp_path: Path) -> None:
    curves = read_curves(_folder(tmp_path))
    assert [(a.name, a.finished) for a in curves.agents] == [
        ("agent1", True), ("agent2", True), ("agent3", False)]
    assert curves.departures == [Departure("agent3", 201, 206)] and curves.run_id == "r-1"
    assert curves.agents[2].series("loss") == ([100, 200], [0.3 + 0.25 / 3, 0.3 + 0.0625 / 3])


def test_the_certificate_per_round_is_the_bound_over_the_norm(tmp_path: Path) -> None:
    from efpsn.departure.membership import reconfigure
    from efpsn.optimize.certificate import Certifier
    from efpsn.topology import build_graph

    rounds, bounds, why = certificate_curve(read_curves(_folder(tmp_path)))
    assert why is None and rounds == [100, 200, 300, 400]
    config = RunConfig.from_dict(SETTINGS)
    graph = build_graph(config.topology, 3, seed=config.seed)
    after = Certifier.for_run(config, reconfigure(graph, {2}).remaining_weights())
    worst = _record(400, 1)  # the same measures at every agent: the worst is any one's
    assert after.curvature is not None
    expected = distance_bound(tracker=worst["tracker"], gap=worst["gap"], step=worst["step"],
                              curvature=after.curvature, l2=after.l2, hops=after.hops,
                              momentum=after.momentum) / 4.0
    assert math.isclose(bounds[-1], expected, rel_tol=1e-12)
    assert bounds == sorted(bounds, reverse=True)


def test_the_picture_is_a_png_and_an_empty_folder_says_what_it_lacks(tmp_path: Path) -> None:
    path = write_picture(_folder(tmp_path / "run"))
    assert path == tmp_path / "run" / "training.png"
    assert path.read_bytes()[:4] == b"\x89PNG" and path.stat().st_size > 20_000
    (tmp_path / "empty" / "logs").mkdir(parents=True)
    with pytest.raises(ValueError, match="holds no agent's history"):
        write_picture(tmp_path / "empty")
