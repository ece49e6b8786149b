"""The default masks over real gRPC agents (every parameter perturbed, `--refresh fading`): phase I
shares one encrypted seed per neighbour, every round's fixed and fading noise comes from the
seeds, and the run equals the simulator bit for bit, also after
an agent is killed (SIGKILL) mid-run and restarted from its saved seeds; the seeds never reach
a log or a result, and are deleted from the state folder when the run ends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from localnet import LocalNet, crash_at

from efpsn.launch.summary import load_agent_results
from efpsn.masks.seeds import exchange_seeds_fast
from efpsn.params.config import RunConfig
from efpsn.simulator import run_simulation
from efpsn.topology import build_graph

pytestmark = [pytest.mark.process, pytest.mark.timeout(600)]

NOISE_SEED = 11
CONFIG = RunConfig(iterations=90, eval_every=30, key_bits=2048, round_timeout_seconds=60.0,
                   gamma=1e4)  # the defaults: selection all, K = 1, refresh fading
NAMES = [f"agent{i}" for i in range(1, CONFIG.agents + 1)]
VICTIM, CRASH_AT, CHECKPOINT_EVERY = "agent3", 47, 20


@pytest.fixture(scope="module")
def refreshed_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("refresh")
    seen: dict[str, Any] = {"folder": folder}
    crash = {VICTIM: crash_at(CRASH_AT)}
    with LocalNet(folder, CONFIG, noise_seed=NOISE_SEED, agent_env=crash,
                  agent_args=("--checkpoint-every", str(CHECKPOINT_EVERY))) as net:
        net.start_all()
        seen["victim_rc"] = net.procs[VICTIM].wait(timeout=300)  # killed itself at CRASH_AT
        state = folder / VICTIM / "state"
        seen["state_while_down"] = sorted(p.name for p in state.iterdir())
        seen["seeds_mode"] = (state / "seeds.json").stat().st_mode & 0o777
        net.restart(VICTIM)
        seen["agent_rc"] = net.wait_agents(timeout=400)
        seen["logs"] = {n: net.log(n) for n in ["coordinator", *NAMES]}
    return seen


def test_network_with_refreshed_masks_equals_the_simulator_after_a_crash(refreshed_run) -> None:
    seen = refreshed_run
    assert seen["victim_rc"] == -9
    assert seen["agent_rc"] == {n: 0 for n in NAMES}, {
        n: t[-2000:] for n, t in seen["logs"].items()}
    results, xs = load_agent_results(seen["folder"], NAMES)
    sim = run_simulation(CONFIG, noise_seed=NOISE_SEED)
    assert sim.masks_sum_to_zero() and sim.periods_zero_sum == CONFIG.iterations.total
    assert sim.config.refresh.fade is not None and str(sim.config.selection) == "all"
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0
    victim = next(r for r in results if r["name"] == VICTIM)
    assert victim["resumed_from_round"] == CRASH_AT // CHECKPOINT_EVERY * CHECKPOINT_EVERY
    assert "saved seeds reloaded" in seen["logs"][VICTIM]
    # phase I cost one ciphertext per neighbour each way, whatever N (7,851 here)
    assert victim["timings"]["encryptions"] == 2 and victim["timings"]["decryptions"] == 2


def test_seeds_stay_private_and_are_deleted_after_the_run(refreshed_run) -> None:
    seen = refreshed_run
    assert "seeds.json" in seen["state_while_down"] and "mask.json" not in seen["state_while_down"]
    assert seen["seeds_mode"] == 0o600
    folder: Path = seen["folder"]
    for name in NAMES:
        assert sorted(p.name for p in (folder / name / "state").iterdir()) == ["assignment.json"]
    # the very seeds of this run (the test hook makes them reproducible) appear nowhere
    graph = build_graph(CONFIG.topology, CONFIG.agents, seed=CONFIG.seed)
    secrets = {s.hex() for edge in exchange_seeds_fast(graph, noise_seed=NOISE_SEED)
               for _, s in (*edge.sent, *edge.received)}
    written = "".join(seen["logs"].values()) + "".join(
        p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file()
        and p.suffix in (".json", ".log", ""))
    assert len(secrets) == 2 * len(graph.edges) and not any(s in written for s in secrets)
    result = json.loads((folder / NAMES[0] / "result.json").read_text())
    assert result["settings"]["refresh"] == str(CONFIG.resolved().refresh)
