"""The stop rule over real gRPC agents (efpsn/optimize/stopping.py): every agent stops at the round
the simulator stops at, with the same iterates bit for bit, also when an agent is killed inside a
check window and resumes from a checkpoint taken in it (its stop integers come back with it)."""

from __future__ import annotations

from typing import Any

import pytest
from localnet import LocalNet, crash_at

from efpsn.launch.summary import load_agent_results
from efpsn.optimize.certificate import TARGET
from efpsn.params.config import STOP_EVERY, RunConfig
from efpsn.simulator import run_simulation

pytestmark = [pytest.mark.process, pytest.mark.timeout(600)]

NOISE_SEED = 5
# l2 = 10: the step rule's cap is 289 rounds and the target is met well before it; the fixed
# mask keeps the simulator fast (the fading mask's fresh part would hold the stop back)
CONFIG = RunConfig(l2=10.0, eval_every=50, key_bits=2048, refresh="never",
                   round_timeout_seconds=60.0)
NAMES = [f"agent{i}" for i in range(1, CONFIG.agents + 1)]
# a checkpoint at the check round 50 (inside its window: rounds 50 and 51 carry the integers)
VICTIM, CRASH_AT, CHECKPOINT_EVERY = "agent2", 51, 25


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("stop")
    seen: dict[str, Any] = {"folder": folder}
    crash = {VICTIM: crash_at(CRASH_AT)}
    with LocalNet(folder, CONFIG, noise_seed=NOISE_SEED, agent_env=crash,
                  agent_args=("--checkpoint-every", str(CHECKPOINT_EVERY))) as net:
        net.start_all()
        seen["victim_rc"] = net.procs[VICTIM].wait(timeout=300)
        net.restart(VICTIM)
        seen["agent_rc"] = net.wait_agents(timeout=400)
        seen["logs"] = {n: net.log(n) for n in ["coordinator", *NAMES]}
    return seen


def test_every_agent_and_the_simulator_stop_at_the_same_round(stopped_run) -> None:
    seen = stopped_run
    assert seen["victim_rc"] == -9
    assert seen["agent_rc"] == {n: 0 for n in NAMES}, {
        n: t[-2000:] for n, t in seen["logs"].items()}
    results, xs = load_agent_results(seen["folder"], NAMES)
    sim = run_simulation(CONFIG, noise_seed=NOISE_SEED)
    rounds = sim.timings["rounds"]
    assert sim.config.stop_every.rounds == STOP_EVERY and rounds < sim.config.iterations.total
    assert {r["final"]["round"] for r in results} == {rounds}
    assert {r["timings"]["rounds"] for r in results} == {rounds}
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0
    assert sim.convergence is not None and TARGET / 100 <= sim.convergence.bound <= TARGET
    victim = next(r for r in results if r["name"] == VICTIM)
    assert victim["resumed_from_round"] == CRASH_AT // CHECKPOINT_EVERY * CHECKPOINT_EVERY
