"""Fault injection on loopback ports: agents and the coordinator killed with SIGKILL.

* Phase II: the coordinator is killed right after bootstrap, then a random agent kills itself
  (SIGKILL, tests/crash_hook: localnet.crash_at) on reaching a random round, so its newest
  checkpoint is known exactly; the agent is restarted with the very same command line. It reloads
  its assignment and mask, rebinds its port, pulls the rounds it lost from its neighbours
  (Agent.GetRound), replays them from its checkpoint, and the run ends bit for bit like an
  uninterrupted simulation.
* Phase I: an agent killed before its mask was saved refuses to resume (a new mask would break
  the zero sum); the others report it silent after the departure deadline, the coordinator
  declares it gone in phase I, and they finish without it (agent/departure/phase_one.py).

EFPSN_FAULT_SEED=S picks the algorithm (the default accelerated gradient tracking, the paper's DSGD
or gradient tracking), the victim and the round
reproducibly (default: a fresh seed); the seed is always printed.
"""

from __future__ import annotations

import json
import os
import random
import socket
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from localnet import LocalNet, crash_at

from efpsn.launch.summary import load_agent_results
from efpsn.params.config import PRESETS, RunConfig
from efpsn.simulator import run_simulation

pytestmark = [pytest.mark.process, pytest.mark.timeout(900)]

NOISE_SEED = 13
CHECKPOINT_EVERY = 20
BASE = RunConfig(iterations=240, eval_every=40, key_bits=2048, round_timeout_seconds=90.0)
ALGORITHMS = {"agt": {}, "dsgd": {**PRESETS["paper"], "iterations": 240},
              "gt": {"algorithm": "gt", "schedule": "constant:0.05"}}
NAMES = [f"agent{i}" for i in range(1, BASE.agents + 1)]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def announce(request: pytest.FixtureRequest, line: str) -> None:
    """Show `line` in pytest's output even when the test passes (a seed must always be seen)."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is None:
        print(line)
        return
    with capture.global_and_fixture_disabled():
        print(line, flush=True)


def port_accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory: pytest.TempPathFactory,
              request: pytest.FixtureRequest) -> dict[str, Any]:
    seed = int(os.environ.get("EFPSN_FAULT_SEED", str(time.time_ns() % 2**31)))
    announce(request, f"\nfault injection: EFPSN_FAULT_SEED={seed}")
    rng = random.Random(seed)
    algorithm = rng.choice(sorted(ALGORITHMS))
    config = BASE.replace(**ALGORITHMS[algorithm])
    victim = rng.choice(NAMES)
    # a random round inside a checkpoint interval, so that the restart has rounds to replay;
    # the victim kills itself (SIGKILL) on reaching it (localnet.crash_at), so its
    # newest checkpoint is known exactly: no race between the kill and a checkpoint write
    target = (CHECKPOINT_EVERY * rng.randint(1, config.iterations.total // CHECKPOINT_EVERY - 3)
              + rng.randint(3, CHECKPOINT_EVERY - 6))
    folder = tmp_path_factory.mktemp("fault")
    seen: dict[str, Any] = {"seed": seed, "victim": victim, "target": target, "folder": folder,
                            "config": config}
    started = time.monotonic()
    crash = {victim: crash_at(target)}
    with LocalNet(folder, config, noise_seed=NOISE_SEED, agent_env=crash,
                  agent_args=("--checkpoint-every", str(CHECKPOINT_EVERY))) as net:
        net.start_all()
        net.wait_for(lambda: all((s := net.status(n)) is not None and s.run_id for n in NAMES),
                     timeout=180, what="every agent assigned")
        net.kill("coordinator")  # bootstrap is over: nobody needs it any more
        seen["victim_running_after_bootstrap"] = net.procs[victim].poll() is None
        seen["victim_rc"] = net.procs[victim].wait(timeout=600)  # it kills itself at `target`
        killed = time.monotonic()
        state = folder / victim / "state"
        seen["state_files"] = {str(p.relative_to(state)): _mode(p)
                               for p in sorted(state.rglob("*"))}
        seen["neighbour_rounds_while_down"] = {
            n: (s.round if (s := net.status(n)) else None) for n in NAMES if n != victim}
        time.sleep(1.0)  # it stays away for a moment; the others wait within their deadline
        seen["coordinator_accepts_at_restart"] = port_accepts(net.ports["coordinator"])
        net.restart(victim)  # the very same command line, without the crash hook
        seen["agent_rc"] = net.wait_agents(timeout=600)
        seen["recovery_seconds"] = time.monotonic() - killed
        seen["logs"] = {n: net.log(n) for n in ["coordinator", *NAMES]}
    seen["wall_seconds"] = time.monotonic() - started
    results = {r["name"]: r for r in load_agent_results(folder, NAMES)[0]}
    seen["resumed_from"] = results[victim]["resumed_from_round"]
    announce(request, f"fault injection: seed {seed}; {algorithm}; coordinator killed after "
             f"bootstrap; {victim} killed itself with SIGKILL at round {target} (exit "
             f"{seen['victim_rc']}); restarted, resumed from checkpoint round "
             f"{seen['resumed_from']}; neighbours at {seen['neighbour_rounds_while_down']} "
             f"meanwhile; run finished {seen['recovery_seconds']:.1f}s after the kill; wall "
             f"{seen['wall_seconds']:.1f}s")
    return seen


def results_run_id(seen: dict[str, Any]) -> str:
    results, _ = load_agent_results(seen["folder"], NAMES)
    return results[0]["run_id"]


def _tails(seen: dict[str, Any]) -> str:
    return "\n".join(f"--- {n}\n{t[-2000:]}" for n, t in seen["logs"].items())


def test_restarted_agent_finishes_the_run_like_the_simulator_bitwise(fault_run) -> None:
    seen = fault_run
    assert seen["agent_rc"] == {n: 0 for n in NAMES}, _tails(seen)
    config = seen["config"]
    results, xs = load_agent_results(seen["folder"], NAMES)
    assert [r["final"]["round"] for r in results] == [config.iterations.total] * len(NAMES)
    sim = run_simulation(config, noise_seed=NOISE_SEED)
    diffs = [float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)]
    print(f"\nmax |x_network - x_simulator| per agent: {diffs}")
    assert max(diffs) == 0.0, diffs  # bitwise, not merely within 1e-6
    # evaluations before the checkpoint came from it, the ones after from the replay
    victim = next(r for r in results if r["name"] == seen["victim"])
    assert [h["round"] for h in victim["history"]] == list(range(0, config.iterations.total + 1,
                                                                 config.eval_every))


def test_it_resumed_from_its_checkpoint_with_its_saved_mask(fault_run) -> None:
    seen = fault_run
    assert seen["victim_rc"] == -9  # the hook's SIGKILL: no handler ran, nothing was flushed
    resumed = seen["resumed_from"]
    # killed at `target`, which is inside a checkpoint interval: its newest checkpoint is the
    # last multiple of CHECKPOINT_EVERY before it, exactly, and nothing newer
    assert resumed == seen["target"] // CHECKPOINT_EVERY * CHECKPOINT_EVERY > 0
    assert sorted(k for k in seen["state_files"] if k.startswith("checkpoints/")
                  and k.count("/") == 1) == [
        f"checkpoints/round-{r:08d}" for r in range(CHECKPOINT_EVERY, resumed + 1,
                                                     CHECKPOINT_EVERY)][-2:]
    # ... beside the log of the round messages it sent (for neighbours that restart too)
    assert any(k.startswith("outbox/rounds-") for k in seen["state_files"]), seen["state_files"]
    log = seen["logs"][seen["victim"]]
    assert f"resumes run {results_run_id(seen)} at round {resumed}" in log
    # phase I's result: the fixed mask, or the edge seeds (the default's fading masks)
    saved = "mask" if not fault_run["config"].refresh.refreshed else "seeds"
    assert f"saved {saved} reloaded" in log and "INTERNAL" not in log
    # it never registered again (the coordinator was dead) and never ran phase I again
    assert log.count(" is agent index ") == 2  # once registered, once restored from its state
    assert log.count("efpsn.agent WARNING") >= 1 and "efpsn: error" not in log
    # nobody else restarted
    results, _ = load_agent_results(seen["folder"], NAMES)
    assert {r["name"]: r["resumed_from_round"] for r in results} == {
        n: (resumed if n == seen["victim"] else None) for n in NAMES}


def test_masks_still_sum_to_exactly_zero(fault_run) -> None:
    results, _ = load_agent_results(fault_run["folder"], NAMES)
    numerators = [[int(v) for v in r["debug_mask_numerators"]] for r in results]
    assert all(any(v != 0 for v in row) for row in numerators)
    config = fault_run["config"]
    assert [sum(col) for col in zip(*numerators, strict=True)] == [0] * config.basis_counts()[1]
    sim = run_simulation(config.replace(iterations=1), noise_seed=NOISE_SEED)
    assert numerators == [list(m.numerators) for m in sim.masks]


def test_coordinator_killed_after_bootstrap_did_not_matter(fault_run) -> None:
    seen = fault_run
    # the coordinator was gone before the victim died and while it restarted ...
    assert seen["victim_running_after_bootstrap"]
    assert not seen["coordinator_accepts_at_restart"]
    # ... and every agent, the restarted one included, still finished the run
    assert seen["agent_rc"] == {n: 0 for n in NAMES}, _tails(seen)
    coordinator_log = seen["logs"]["coordinator"]
    assert coordinator_log.count("registered agent") == len(NAMES)  # nobody came back to it


def test_state_files_are_private_and_removed_after_the_run(fault_run) -> None:
    files = fault_run["state_files"]
    saved = "mask.json" if not fault_run["config"].refresh.refreshed else "seeds.json"
    assert files["assignment.json"] == 0o600 and files[saved] == 0o600
    checkpoints = {k: v for k, v in files.items() if k.startswith("checkpoints/")}
    assert checkpoints and all(v == (0o700 if k.count("/") == 1 else 0o600)
                               for k, v in checkpoints.items() if ".part" not in k)
    assert any(k.endswith("/x.npy") for k in checkpoints)
    # after the run: the mask and the iterates are gone, a finished marker stays
    state = fault_run["folder"] / fault_run["victim"] / "state"
    assert sorted(p.name for p in state.iterdir()) == ["assignment.json"]
    assert json.loads((state / "assignment.json").read_text())["finished"] is True


# ------------------------------------------------------------------------- killed in phase I

PHASE_ONE = RunConfig(iterations=50, eval_every=25, key_bits=3072, round_timeout_seconds=15.0)


@pytest.fixture(scope="module")
def phase_one_kill(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("phase1")
    victim = "agent3"
    seen: dict[str, Any] = {"folder": folder, "victim": victim}
    state = folder / victim / "state"
    with LocalNet(folder, PHASE_ONE, noise_seed=NOISE_SEED) as net:
        net.start_all()
        net.wait_for(lambda: (state / "assignment.json").exists(), timeout=180,
                     what=f"{victim} assigned", every=0.002)
        net.kill(victim)
        killed = time.monotonic()
        seen["mask_saved_at_kill"] = (state / "mask.json").exists()
        net.restart(victim)  # the same command: it must refuse, not draw a new mask
        rc = net.procs[victim].wait(timeout=120)
        seen["restart_rc"], seen["restart_seconds"] = rc, time.monotonic() - killed
        seen["agent_rc"] = net.wait_agents(timeout=8 * PHASE_ONE.round_timeout_seconds + 60)
        seen["abort_seconds"] = time.monotonic() - killed
        seen["logs"] = {n: net.log(n) for n in NAMES}
    print(f"\nphase I kill: {victim} killed before saving its mask; restart refused in "
          f"{seen['restart_seconds']:.1f}s; all agents stopped {seen['abort_seconds']:.1f}s after "
          f"the kill with exit codes {seen['agent_rc']}")
    return seen


def test_agent_killed_in_phase_one_refuses_to_resume(phase_one_kill) -> None:
    seen = phase_one_kill
    assert not seen["mask_saved_at_kill"]
    assert seen["restart_rc"] != 0
    log = seen["logs"][seen["victim"]]
    assert "stopped during phase I" in log and "cannot continue" in log, log[-2000:]


def test_the_others_finish_without_it_declared_gone_in_phase_one(phase_one_kill) -> None:
    seen = phase_one_kill
    others = [n for n in NAMES if n != seen["victim"]]
    assert {n: seen["agent_rc"][n] for n in others} == {n: 0 for n in others}, seen["agent_rc"]
    for neighbour in ("agent2", "agent4"):
        text = seen["logs"][neighbour]
        assert "asking the coordinator whether agent3 left in phase I" in text, text[-2000:]
    # their results name it gone in phase I; it produced none
    for name in others:
        result = json.loads((seen["folder"] / name / "result.json").read_text())
        record = result["departures"][0]
        assert (record["agent"], record["round"], record["phase_one"]) == ("agent3", 0, True)
    assert not (seen["folder"] / seen["victim"] / "result.json").exists()
    assert seen["abort_seconds"] < 8 * PHASE_ONE.round_timeout_seconds + 60
