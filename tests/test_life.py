"""The agent's life (agent/life.py): every legal path, every illegal event refused, the wire
phase and round GetStatus reports, and no I/O in the module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from agent.life import IllegalTransition, Life, Stage
from agent.status import Status
from efpsn.wire.records import Phase

SESSION, STANDARDISED = object(), object()  # the life holds them, never looks inside

EVENTS = {
    "assign": lambda life: life.assign(SESSION),  # type: ignore[arg-type]
    "keys": Life.keys,
    "shares": Life.shares,
    "stats": Life.stats,
    "standardised": lambda life: life.standardised(STANDARDISED),  # type: ignore[arg-type]
    "optimizing": lambda life: life.optimizing(0),
    "advance": lambda life: life.advance(life.round + 1),
    "done": Life.done,
    "fail": lambda life: life.fail("boom"),
}
# the events each stage allows (everything else raises IllegalTransition)
LEGAL = {
    Stage.REGISTERING: {"assign", "fail"},
    Stage.ASSIGNED: {"keys", "stats", "optimizing", "fail"},
    Stage.KEYS: {"shares", "stats", "optimizing", "fail"},
    Stage.SHARES: {"stats", "optimizing", "fail"},
    Stage.STATS: {"standardised", "fail"},  # optimizing once standardised
    Stage.OPTIMIZING: {"advance", "done", "fail"},
    Stage.DONE: {"fail"},
    Stage.FAILED: set(),
}
# a way to reach each stage from a new life
PATHS = {
    Stage.REGISTERING: [],
    Stage.ASSIGNED: ["assign"],
    Stage.KEYS: ["assign", "keys"],
    Stage.SHARES: ["assign", "keys", "shares"],
    Stage.STATS: ["assign", "keys", "shares", "stats"],
    Stage.OPTIMIZING: ["assign", "keys", "shares", "optimizing"],
    Stage.DONE: ["assign", "optimizing", "done"],
    Stage.FAILED: ["assign", "fail"],
}


def at(stage: Stage) -> Life:
    life = Life()
    for event in PATHS[stage]:
        EVENTS[event](life)
    assert life.stage is stage
    return life


@pytest.mark.parametrize("stage", list(Stage))
@pytest.mark.parametrize("event", list(EVENTS))
def test_each_event_is_legal_exactly_where_the_diagram_says(stage: Stage, event: str) -> None:
    life = at(stage)
    if event in LEGAL[stage]:
        EVENTS[event](life)
    else:
        with pytest.raises(IllegalTransition, match=f"{event} in stage {stage.value}"):
            EVENTS[event](life)
        assert life.stage is stage  # a refused event changes nothing


def test_a_fresh_scale_standard_run_from_registration_to_done() -> None:
    status = Status()
    life = status.life
    assert (life.session, status.phase) == (None, Phase.PHASE_UNSPECIFIED)
    life.assign(SESSION)  # type: ignore[arg-type]
    assert (life.session, status.phase) == (SESSION, Phase.PHASE_UNSPECIFIED)
    life.keys()
    assert status.phase == Phase.KEYS
    life.shares()
    assert status.phase == Phase.SHARES
    life.stats()
    assert status.phase == Phase.STATS
    with pytest.raises(IllegalTransition, match="before the secure sum's totals are known"):
        life.optimizing(0)  # phase II waits for the totals
    life.standardised(STANDARDISED)  # type: ignore[arg-type]
    assert life.session is STANDARDISED
    life.optimizing(0)
    for t in (1, 2, 2, 3):
        life.advance(t)
    assert (status.phase, status.round, status.finished) == (Phase.OPTIMIZE, 3, False)
    with pytest.raises(IllegalTransition, match="advance to round 2 from round 3"):
        life.advance(2)
    life.done()
    assert (status.phase, status.round, status.finished, status.error) == (
        Phase.DONE, 3, True, "")


def test_a_restart_is_assigned_again_and_optimizes_from_its_checkpoint() -> None:
    life = Life()
    life.assign(SESSION)  # type: ignore[arg-type]
    with pytest.raises(IllegalTransition, match="optimizing from round -1"):
        life.optimizing(-1)
    life.optimizing(40)
    assert (life.stage, life.round, life.phase) == (Stage.OPTIMIZING, 40, Phase.OPTIMIZE)


def test_a_failure_keeps_the_phase_it_happened_in_and_its_error() -> None:
    status = Status()
    status.life.assign(SESSION)  # type: ignore[arg-type]
    status.life.keys()
    status.life.fail("neighbour agent2 refused")
    assert (status.life.stage, status.phase, status.error, status.finished) == (
        Stage.FAILED, Phase.KEYS, "neighbour agent2 refused", False)
    done = at(Stage.DONE)
    done.fail("the last push failed")  # after DONE: still finished
    assert Status(life=done).finished and done.phase == Phase.DONE


def test_the_life_is_sans_io() -> None:
    tree = ast.parse((Path(__file__).resolve().parent.parent / "agent" / "life.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert not imported & {"asyncio", "grpc", "socket", "threading", "time"}, imported
