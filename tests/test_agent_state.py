"""Crash-safety building blocks: the on-disk state store, the mailbox, the
registry's identity rules, and the outbox invariant that resuming from a checkpoint relies on."""

from __future__ import annotations

import asyncio
import json
import logging
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

from agent.mailbox import Mailbox
from agent.options import AgentOptions
from agent.state import StateError, StateStore
from coordinator.registry import NotExpected, Registry, default_names
from efpsn.algorithms import make_algorithm
from efpsn.algorithms.base import StepContext
from efpsn.masks.zero_sum import MaskCoefficients
from efpsn.params.config import RunConfig

CONFIG = RunConfig(agents=3, iterations=10, key_bits=2048)


def _assignment():
    registry = Registry(CONFIG, run_id="run-7", expected_names=default_names(3))
    for i in (1, 2, 3):
        registry.register(f"agent{i}", f"10.0.0.{i}:5005{i}")
    return registry.assignments()["agent2"]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ----------------------------------------------------------------------------- state store


def test_assignment_and_mask_round_trip_privately(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    assert store.load_assignment() is None
    assignment = _assignment()
    store.save_assignment(assignment, config=CONFIG, advertise="10.0.0.2:50052",
                           port=50052)
    mask = MaskCoefficients((3, -(10**40), 0, 7, 1, -1, 2, 2, 5, -5), 6)
    store.save_mask(mask, run_id="run-7", stats={"keygen_seconds": 0.5},
                    received={"shares": {"agent1": b"\x01" * 32}})
    saved = store.load_assignment()
    assert saved is not None and saved.assignment == assignment and saved.config == CONFIG
    assert (saved.advertise, saved.port, saved.finished) == ("10.0.0.2:50052", 50052, False)
    loaded = store.load_mask(run_id="run-7")
    assert loaded is not None and loaded.mask == mask and loaded.stats == {"keygen_seconds": 0.5}
    assert loaded.received == {"shares": {"agent1": b"\x01" * 32}}
    assert _mode(store.folder) == 0o700
    assert _mode(store.assignment_path) == 0o600 and _mode(store.mask_path) == 0o600
    with pytest.raises(StateError, match="belongs to run"):
        store.load_mask(run_id="run-8")
    assert not list(store.folder.glob(".*part"))  # no temporary files left behind


def test_damaged_assignment_is_a_clear_error(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save_assignment(_assignment(), config=CONFIG, advertise="h:1", port=1)
    payload = json.loads(store.assignment_path.read_text())
    payload["assignment"]["self_weight"] = 0.9  # weights no longer sum to 1
    store.assignment_path.write_text(json.dumps(payload))
    with pytest.raises(StateError, match="damaged"):
        store.load_assignment()
    store.assignment_path.write_text("{not json")
    with pytest.raises(StateError, match="cannot read"):
        store.load_assignment()


def test_checkpoints_are_bit_exact_pruned_and_fall_back_when_damaged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = StateStore(tmp_path)
    special = torch.tensor([0.0, -0.0, 5e-324, -np.inf, np.pi, 1e308], dtype=torch.float64)
    expected = {"x": (6,), "y": (6,)}
    for r in (10, 20, 30):
        store.save_checkpoint(run_id="r", round_=r, tensors={"x": special * r, "y": special - r},
                              history=[{"round": r, "loss": 0.5}])
    dirs = sorted(p.name for p in store.checkpoint_folder.iterdir())
    assert dirs == ["round-00000020", "round-00000030"]  # the newest two are kept
    newest = store.checkpoint_folder / "round-00000030"
    assert _mode(newest) == 0o700 and _mode(newest / "x.npy") == 0o600
    assert (newest / "x.npy").read_bytes().startswith(b"\x93NUMPY")  # .npy, no pickle
    np.load(newest / "x.npy", allow_pickle=False)
    cp = store.load_checkpoint(run_id="r", expected=expected)
    assert cp is not None and cp.round == 30 and cp.history == [{"round": 30, "loss": 0.5}]
    assert cp.tensors["x"].numpy().tobytes() == (special * 30).numpy().tobytes()
    # flip one byte of the newest: its sha256 no longer matches, the older one is used
    data = bytearray((newest / "y.npy").read_bytes())
    data[-1] ^= 0xFF
    (newest / "y.npy").write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        cp = store.load_checkpoint(run_id="r", expected=expected)
    assert cp is not None and cp.round == 20 and "sha256" in caplog.text
    # a half-written checkpoint (crash before the rename) is invisible
    (store.checkpoint_folder / ".round-00000040.part").mkdir()
    assert store.load_checkpoint(run_id="r", expected=expected).round == 20
    # another run's or another algorithm's checkpoint is never used
    assert store.load_checkpoint(run_id="other", expected=expected) is None
    assert store.load_checkpoint(run_id="r", expected={"x": (6,)}) is None


def test_finishing_deletes_mask_and_checkpoints(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save_assignment(_assignment(), config=CONFIG, advertise="h:1", port=1)
    store.save_mask(MaskCoefficients((1,) * 10, 6), run_id="run-7", stats={})
    store.save_checkpoint(run_id="run-7", round_=5, tensors={"x": torch.zeros(3,
                          dtype=torch.float64)}, history=[])
    store.mark_finished(store.load_assignment())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["assignment.json"]
    assert store.load_assignment().finished


# ----------------------------------------------------------------------------- mailbox


def test_mailbox_collect_names_who_is_missing() -> None:
    async def scenario() -> str:
        box = Mailbox()
        box.put("round", 0, "agent1", 1)
        try:
            await box.collect("round", 0, ["agent1", "agent3"], timeout=0.05)
        except TimeoutError as exc:
            return str(exc)
        return ""

    assert "agent3" in asyncio.run(scenario())


# ----------------------------------------------------------------------------- registry


def test_registry_accepts_expected_names_only_and_moves_addresses_before_completion() -> None:
    registry = Registry(CONFIG, run_id="r", expected_names=default_names(3))
    with pytest.raises(NotExpected):
        registry.register("intruder", "h:1")
    with pytest.raises(ValueError, match="at most 255"):
        registry.register("agent1", "h" * 300 + ":1")
    registry.register("agent1", "h:1")
    registry.register("agent1", "h:2")  # restarted before the run began: new port
    assert registry.addresses["agent1"] == "h:2"
    registry.register("agent2", "h:3")
    registry.register("agent3", "h:4")
    registry.register("agent3", "h:4")  # idempotent
    with pytest.raises(ValueError, match="assignments are out"):
        registry.register("agent3", "h:5")


# ----------------------------------------------------------------------------- resuming


@pytest.mark.parametrize("name", ["dsgd", "gt"])
def test_outbox_is_the_state_message_tensors(name: str) -> None:
    """A resumed agent rebuilds its outbox from a checkpointed state; this must be exact."""
    algorithm = make_algorithm(name)
    ctx = StepContext(agent=0, weights={0: 0.5, 1: 0.5}, lr=0.1,
                      oracle=lambda x, t: x * 0.25 + t)
    state, outbox = algorithm.init(torch.arange(4, dtype=torch.float64), ctx)
    for _ in range(3):
        assert set(outbox) == set(algorithm.message_keys)
        assert set(state.tensors) == set(algorithm.state_keys)  # what a checkpoint holds
        assert all(outbox[k] is state[k] for k in algorithm.message_keys)
        state, outbox = algorithm.step(state, {1: dict(outbox)}, ctx)


def test_agent_options_need_history_beyond_the_checkpoint_interval() -> None:
    with pytest.raises(ValueError, match="keep_rounds"):
        AgentOptions(name="agent1", listen="h:0", coordinator="h:1", checkpoint_every=50,
                     keep_rounds=52)
    ok = AgentOptions(name="agent1", listen="h:0", coordinator="h:1", results_dir=Path("R"))
    assert ok.state_folder == Path("R") / "agent1" / "state"


def test_an_assignment_for_another_agent_count_than_the_announced_run_is_refused() -> None:
    # the agent takes the run's parameters once (GetRunParameters); the assignment that comes
    # later carries none, only its num_agents, which must be the announced run's
    import dataclasses
    import types

    from agent.options import AgentFailure
    from agent.session import open_session

    prepared = types.SimpleNamespace(config=CONFIG)  # refused before anything else is used
    other = dataclasses.replace(_assignment(), num_agents=4)
    with pytest.raises(AgentFailure, match="is for 4 agents, but the run it announced before "
                                           "registration has 3"):
        asyncio.run(open_session(other, name="agent2", prepared=prepared))  # type: ignore[arg-type]
