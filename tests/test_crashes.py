"""Two adjacent agents killed (SIGKILL) at different checkpoints both resume, and the finished run
is bit for bit the simulator's; a run that truly cannot resume says so in one line and on disk."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from localnet import LocalNet

from agent.state import StateStore
from efpsn.launch.summary import load_agent_results
from efpsn.params.config import RunConfig
from efpsn.simulator import run_simulation

pytestmark = pytest.mark.timeout(400)

CONFIG = RunConfig(agents=4, iterations=120, eval_every=40, key_bits=2048,
                   round_timeout_seconds=60.0)
SEED = 11
# agent2 and agent3 are neighbours in the 4-ring; checkpoints every 7 and 11 rounds differ
# between rounds 7 and 76 whatever the moment of the crash
EVERY = {"agent1": 50, "agent2": 7, "agent3": 11, "agent4": 50}


def _newest_checkpoint(folder: Path, name: str) -> int:
    dirs = sorted((folder / name / "state" / "checkpoints").glob("round-*"))
    return int(dirs[-1].name.split("-")[1]) if dirs else 0


@pytest.mark.process
def test_adjacent_agents_crashed_at_different_checkpoints_resume(tmp_path: Path) -> None:
    with LocalNet(tmp_path, CONFIG, noise_seed=SEED) as net:
        net.start_coordinator()
        for name in net.names:
            net.agent_args = ["--checkpoint-every", str(EVERY[name])]
            net.start_agent(name, wait=False)
        for name in net.names:
            net.wait_port(name)
        net.wait_round("agent2", 30, timeout=180)
        net.kill("agent2")
        net.kill("agent3")
        saved = {n: _newest_checkpoint(tmp_path, n) for n in ("agent2", "agent3")}
        assert saved["agent2"] != saved["agent3"] and min(saved.values()) > 0, saved
        time.sleep(0.5)
        net.restart("agent2")
        net.restart("agent3")
        codes = net.wait_agents(timeout=300)
        logs = {n: net.log(n) for n in net.names}
    assert codes == {n: 0 for n in net.names}, (saved, {n: t[-2000:] for n, t in logs.items()})
    for name in ("agent2", "agent3"):
        assert "resumes run" in logs[name] and f"at round {saved[name]}" in logs[name]
    _, xs = load_agent_results(tmp_path, net.names)
    sim = run_simulation(CONFIG, noise_seed=SEED)
    assert max(float((a - b).abs().max()) for a, b in zip(xs, sim.xs, strict=True)) == 0.0
    for name in net.names:  # private files: the loss history is values of f_i
        for file in ("result.json", "model.npy"):
            assert (tmp_path / name / file).stat().st_mode & 0o777 == 0o600
        assert not (tmp_path / name / "state" / "outbox").exists()


def test_an_unresumable_run_says_so_on_disk_and_at_every_restart(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    reason = ("run r1 cannot resume at agent2: it must replay round 28 from its checkpoint 28, "
              "and agent3 no longer holds that round")
    store.mark_unresumable(reason)
    assert store.unresumable() == reason
    assert (tmp_path / "state" / "unresumable.json").stat().st_mode & 0o777 == 0o600
