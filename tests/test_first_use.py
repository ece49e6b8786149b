"""A person's first use with their own data, through the commands they type (real processes):
a folder of agent1..3/train.csv (2 classes, 12 features, column `label`) and schema.json runs
with `efpsn up --data-dir D --iterations 300` and no other run flag, and its average model loads
into the person's own module with the accuracy `efpsn up` printed; NaN at agent2 fails the run
with agent2's own reason first; an agent whose coordinator is missing says so within seconds.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from commands import efpsn, free_port
from test_datadir import write_csv
from test_launcher import leftovers

from efpsn.launch.processes import spawn, stop_children

pytestmark = pytest.mark.timeout(400)

SAMPLES = 150  # per agent, and as many in the public test set




def user_folder(root: Path) -> Path:
    """agent1..3/train.csv and a public test.csv: 2 classes, 12 standardised features (the
    step rule's public bound holds with the default scale), label column `label`."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 4 * SAMPLES)
    direction = rng.normal(size=12)
    x = rng.normal(size=(4 * SAMPLES, 12)) + 1.2 * np.outer(2 * y - 1, direction) \
        / np.linalg.norm(direction)
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    for k in range(3):
        part = slice(k * SAMPLES, (k + 1) * SAMPLES)
        write_csv(root / f"agent{k + 1}" / "train.csv", x[part], y[part])
    write_csv(root / "test.csv", x[3 * SAMPLES:], y[3 * SAMPLES:])
    (root / "schema.json").write_text(json.dumps({"input_shape": "12", "classes": 2}))
    return root


def read_csv(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    table = np.loadtxt(path, delimiter=",", skiprows=1)
    return torch.from_numpy(table[:, :-1]), torch.from_numpy(table[:, -1]).long()


@pytest.mark.process
def test_a_csv_folder_runs_with_no_other_run_flag_and_its_model_loads(tmp_path: Path) -> None:
    # prepare
    data = user_folder(tmp_path / "D")
    # execute: the command of the README, nothing but the folder and the rounds
    out = efpsn("up", "--data-dir", str(data), "--iterations", "300", "--results", "R",
                timeout=360, cwd=tmp_path)
    # assert: it ran to the end and printed the average model's accuracy on test.csv
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].endswith("3 agents (ring); mutual TLS; results in R"), lines
    printed = re.search(r"^final: test accuracy ([0-9.]+) \(x_bar, public test set\)",
                        lines[1])
    assert printed, lines
    summary = json.loads((tmp_path / "R" / "summary.json").read_text())
    assert summary["ok"] and summary["settings"]["agents"] == 3
    assert (summary["settings"]["input_shape"], summary["settings"]["classes"]) == ("12", 2)
    assert summary["settings"]["scale"] == "standard"  # a table without a public scale
    assert f"{summary['final']['accuracy']:.4f}" == printed.group(1)
    assert float(printed.group(1)) > 0.75  # two separated classes: chance is 0.5
    assert leftovers(str(tmp_path)) == ""
    # the README's lines: the network average into the person's own module (other names:
    # "0.weight", "0.bias"), by model order, which read_model keeps (safetensors sorts by name)
    from safetensors.torch import load_file

    from efpsn.tasks.model_io import load_into, read_model

    saved = read_model(tmp_path / "R" / "model.safetensors")
    mine = load_into(torch.nn.Sequential(torch.nn.Linear(12, 2)).double(), saved.state)
    x, y = read_csv(data / "test.csv")
    with torch.no_grad():
        # the run's scaling (a table: standardised with the network's statistics) from the file
        accuracy = float((mine(saved.inputs(x)).argmax(dim=1) == y).double().mean())
    assert accuracy == summary["final"]["accuracy"]
    # ... and into the built-in module, by name; every agent's own model loads the same way
    from efpsn.tasks.models import LogisticRegression

    for path in [tmp_path / "R" / "model.safetensors",
                 *(tmp_path / "R" / f"agent{k}" / "model.safetensors" for k in (1, 2, 3))]:
        built_in = LogisticRegression(features=12, classes=2).double()
        built_in.load_state_dict(load_file(path))
    # `efpsn evaluate` measures the saved average on the same file alike
    evaluated = efpsn("evaluate", "--model", "R/model.safetensors", "--data", str(data / "test.csv"),
                      timeout=360, cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr
    assert evaluated.stdout.startswith(f"accuracy {printed.group(1)}, loss "), evaluated.stdout
    assert efpsn("evaluate", "--help", timeout=360, cwd=tmp_path).returncode == 0


@pytest.mark.process
def test_a_value_too_large_at_agent2_fails_the_run_with_agent2s_reason_first(
        tmp_path: Path) -> None:
    # prepare: one value too large for float64 arithmetic in agent2's file (what the folder's
    # one pass does not look at: only the agent checks its values' range)
    data = user_folder(tmp_path / "D")
    path = data / "agent2" / "train.csv"
    rows = path.read_text().splitlines()
    rows[4] = "1e300" + rows[4][rows[4].index(","):]  # line 5 of the file
    path.write_text("\n".join(rows) + "\n")
    # execute
    out = efpsn("up", "--data-dir", str(data), "--iterations", "300", "--results", "R",
                timeout=360, cwd=tmp_path)
    # assert: exit 2; the error's first line is agent2's own reason (the cell, never its
    # value), then who stopped because of it, then where the logs are; nothing else is said
    assert out.returncode == 2, out.stderr[-3000:]
    before, error = out.stderr.split("efpsn: error: ", 1)
    assert "agent" not in before, before  # the progress bar only
    lines = error.splitlines()
    assert lines[0].startswith(f"agent2: {path}: X has a value too large for float64 "
                               "arithmetic at row 4 (line 5), column 'x0': its magnitude "
                               "exceeds "), error
    assert "1e300" not in lines[0]  # the cell, never its value
    assert lines[1:] == ["agent1, agent3 stopped because agent2 did", "logs: R/logs/"], error
    assert not (tmp_path / "R" / "summary.json").exists()
    assert not (tmp_path / "R" / "model.safetensors").exists()
    assert leftovers(str(tmp_path)) == ""




@pytest.mark.process
def test_an_agent_without_its_coordinator_says_so_within_seconds(tmp_path: Path) -> None:
    # prepare: nobody listens at the address
    address = f"127.0.0.1:{free_port()}"
    child = spawn("agent1", ["efpsn", "agent", "--name", "agent1", "--listen", "127.0.0.1:0",
                             "--insecure", "--coordinator", address, "--results",
                             str(tmp_path / "results")], tmp_path)
    started = time.monotonic()
    try:
        # execute: wait for the line a person at the terminal reads
        said = ""
        while time.monotonic() - started < 25 and not said:
            said = next((line for line in child.log_path.read_text().splitlines()
                         if "still waiting for the coordinator" in line), "")
            assert child.running, child.log_tail()
            time.sleep(0.1)
        # assert: the address, the gRPC reason, and how long it will wait and how to change it
        assert said, f"nothing said within 25 s:\n{child.log_tail()}"
        assert re.search(rf"agent1: still waiting for the coordinator at {address} after \d+s "
                         r"\(UNAVAILABLE: .+\); giving up after 120s \(--connect-timeout\)$",
                         said), said
    finally:
        stop_children([child], grace=5.0)


@pytest.mark.process
def test_an_agent_gives_up_on_a_missing_coordinator_saying_how_to_wait_longer(
        tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    child = spawn("agent1", ["efpsn", "agent", "--name", "agent1", "--listen", "127.0.0.1:0",
                             "--insecure", "--coordinator", address, "--connect-timeout", "2",
                             "--results", str(tmp_path / "results")], tmp_path)
    try:
        code = child.process.wait(timeout=120)
    finally:
        stop_children([child], grace=5.0)
    last = child.log_tail(1).strip()
    assert code == 2, child.log_tail()
    assert last.startswith(f"efpsn: error: agent1: coordinator {address}: unreachable "
                           "until the deadline ("), last
    assert last.endswith("is the coordinator running there? (--connect-timeout SECONDS waits "
                         "longer)"), last


@pytest.mark.parametrize("outcome", ["assigned", "cancelled"])
def test_the_coordinator_exits_linger_seconds_after_its_bootstrap(
        tmp_path: Path, outcome: str) -> None:
    # prepare: a coordinator in this process with --linger 1; three agents' registrations
    # (declaring the run's schema and model), or one agent reporting that it cannot take part
    import asyncio

    import grpc

    from agent.bootstrap import registration
    from agent.options import AgentOptions
    from agent.prepare import prepare
    from coordinator.service import serve
    from efpsn.params.config import RunConfig
    from efpsn.wire.v1 import coordinator_pb2, coordinator_pb2_grpc

    config = RunConfig(agents=3, key_bits=2048, iterations=10)
    port_file = tmp_path / "coordinator.port"

    async def scenario() -> float:
        coordinator = asyncio.ensure_future(serve(config, listen="127.0.0.1:0",
                                                  port_file=str(port_file), linger=1.0))
        try:
            while not port_file.exists() or not port_file.read_text().strip():
                await asyncio.sleep(0.01)
            address = f"127.0.0.1:{int(port_file.read_text())}"
            async with grpc.aio.insecure_channel(address) as channel:
                stub = coordinator_pb2_grpc.CoordinatorStub(channel)
                if outcome == "assigned":
                    declared = prepare(config, AgentOptions(name="agent1", listen="127.0.0.1:0",
                                                            coordinator=address))
                    await asyncio.gather(*(stub.Register(
                        registration(declared, name=f"agent{k}", address=f"127.0.0.1:{k}"),
                        timeout=30) for k in (1, 2, 3)))
                else:
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await stub.Register(coordinator_pb2.RegisterRequest(
                            name="agent2", address="127.0.0.1:2",
                            failure="its local data cannot be used"), timeout=30)
                    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            over = time.monotonic()
            # execute: nothing more is asked of it
            async with asyncio.timeout(30):
                await coordinator
            return time.monotonic() - over
        finally:
            coordinator.cancel()

    # assert: it returned by itself, after its linger
    assert 0.9 < asyncio.run(scenario()) < 10


@pytest.mark.process
def test_a_folder_without_any_test_set_runs_masked_and_unmasked_to_the_same_point(
        tmp_path: Path) -> None:
    # prepare: scikit-learn's wine in 3 private folders, no public test set, no held-out part
    split = efpsn("data", "split", "--data", "sklearn:wine", "--agents", "3", "--out", "D",
                  "--test-fraction", "0", timeout=360, cwd=tmp_path)
    assert split.returncode == 0, split.stderr
    # execute: the defaults over the network, masked and unmasked
    runs = {mask: efpsn("up", "--data-dir", "D", "--holdout", "0", "--quiet", "--mask", mask,
                        "--results", f"R-{mask}", timeout=360, cwd=tmp_path) for mask in ("zero-sum", "none")}
    # assert: both finish (no accuracy exists: said, not a crash), both converged, and the
    # masked network ends where the unmasked one does
    finals = {}
    for mask, out in runs.items():
        assert out.returncode == 0, out.stderr[-2000:]
        lines = out.stdout.splitlines()
        assert "accuracy n/a (no test set, no held-out part)" in lines[1], lines
        assert lines[-1].startswith("converged:"), lines[-1]
        summary = json.loads((tmp_path / f"R-{mask}" / "summary.json").read_text())
        assert summary["final"]["accuracy"] == "nan"  # strict JSON, as json_safe writes it
        finals[mask] = summary["final"]["mean_agent_loss"]
    # both stop at the certificate's target (1e-3 relative to x*; the unmasked run earlier,
    # measured 1.2e-8 apart in loss): near x* the loss is quadratic in the distance
    assert finals["zero-sum"] == pytest.approx(finals["none"], rel=1e-6)
    assert leftovers(str(tmp_path)) == ""
