"""A run that ends on a consensus tail (efpsn/params/tail.py) over real gRPC agents: every agent
stops at the round the simulator stops at, on the tail's check, with the same iterates bit for bit,
also when an agent is killed inside the tail and resumes from a checkpoint taken in its mixing
rounds."""

from __future__ import annotations

from typing import Any

import pytest
from localnet import LocalNet, crash_at

from efpsn.launch.summary import load_agent_results
from efpsn.optimize.certificate import TARGET
from efpsn.optimize.stopping import StopRule
from efpsn.params.config import RunConfig
from efpsn.problem import build_problem
from efpsn.simulator import run_simulation

pytestmark = [pytest.mark.process, pytest.mark.timeout(900)]

NOISE_SEED = 5
# l2 = 10 converges in about 250 rounds; 1,200 rounds make the tails fit (one is 49 rounds on
# the 5-ring, at most 5% of K) and a check period of 1,200 leaves no regular check: the first
# tail (after round 0.44 K = 528: mixes in rounds 528-550, the gradient in 551, tracking in
# 552-576, its check round 575) ends the run at 577. The fixed mask keeps the simulator fast.
CONFIG = RunConfig(l2=10.0, eval_every=50, key_bits=2048, refresh="never", iterations=1200,
                   stop_every=1200, round_timeout_seconds=60.0)
NAMES = [f"agent{i}" for i in range(1, CONFIG.agents + 1)]
# a checkpoint at round 550 (inside the tail's mixes), killed in its tracking rounds
VICTIM, CRASH_AT, CHECKPOINT_EVERY = "agent3", 562, 25


@pytest.fixture(scope="module")
def tail_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("tail")
    seen: dict[str, Any] = {"folder": folder}
    with LocalNet(folder, CONFIG, noise_seed=NOISE_SEED, agent_env={VICTIM: crash_at(CRASH_AT)},
                  agent_args=("--checkpoint-every", str(CHECKPOINT_EVERY))) as net:
        net.start_all()
        seen["victim_rc"] = net.procs[VICTIM].wait(timeout=400)
        net.restart(VICTIM)
        seen["agent_rc"] = net.wait_agents(timeout=500)
        seen["logs"] = {n: net.log(n) for n in ["coordinator", *NAMES]}
    return seen


def test_every_agent_and_the_simulator_stop_on_the_same_tail_bit_for_bit(tail_run) -> None:
    seen = tail_run
    assert seen["victim_rc"] == -9
    assert seen["agent_rc"] == {n: 0 for n in NAMES}, {
        n: t[-2000:] for n, t in seen["logs"].items()}
    results, xs = load_agent_results(seen["folder"], NAMES)
    sim = run_simulation(CONFIG, noise_seed=NOISE_SEED)
    rule = StopRule.for_run(sim.config, build_problem(sim.config.resolved()).weights)
    rounds = sim.timings["rounds"]
    # the run ended on the first tail: its check round plus the diameter
    assert rule.tail is not None and rule.tail.starts[0] == 528
    assert rounds == rule.tail.check_round(528) + rule.hops == 577
    assert {r["final"]["round"] for r in results} == {rounds}
    assert {r["timings"]["rounds"] for r in results} == {rounds}
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0
    assert sim.convergence is not None and sim.convergence.bound <= TARGET
    victim = next(r for r in results if r["name"] == VICTIM)
    assert victim["resumed_from_round"] == 550 and rule.kind(550) == "mix"
    assert rule.kind(CRASH_AT) == "track"
