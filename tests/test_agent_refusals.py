"""An agent refuses what it cannot do safely, with one line that says why: restarts after the run
finished, with another --listen/--advertise or another agent's state folder, damaged state, mask
or checkpoint files; --listen 0.0.0.0 without --advertise; a neighbour unreachable from the start.

Each case runs `efpsn agent` in-process (efpsn.cli.main) against a state folder written here
with the agent's own StateStore, so no real run is needed to reach it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from pathlib import Path

import pytest

from agent.state import StateStore
from coordinator.registry import Registry, default_names
from efpsn.cli.main import main
from efpsn.masks.zero_sum import MaskCoefficients
from efpsn.params.config import RunConfig

pytestmark = pytest.mark.timeout(120)

# the paper's DSGD: a round message is one tensor x, which these tests craft by hand
CONFIG = RunConfig.preset("paper", agents=3, iterations=10, eval_every=5, key_bits=2048, round_timeout_seconds=2.0)
RUN = "run-13"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_state(results: Path, *, name: str = "agent2", finished: bool = False,
                mask: bool = True) -> tuple[StateStore, int, dict[str, str]]:
    """A state folder as an agent leaves it after phase I (or after the run, `finished`)."""
    ports = {n: closed_port() for n in sorted(default_names(3))}
    registry = Registry(CONFIG, run_id=RUN, expected_names=default_names(3))
    for n, port in ports.items():
        registry.register(n, f"127.0.0.1:{port}")
    store = StateStore(results / name / "state")
    store.save_assignment(registry.assignments()[name], config=CONFIG,
                          advertise=f"127.0.0.1:{ports[name]}", port=ports[name],
                          finished=finished)
    if mask:
        numerators = tuple(range(-5, CONFIG.basis_counts()[1] - 5))
        store.save_mask(MaskCoefficients(numerators, CONFIG.precision), run_id=RUN, stats={})
    return store, ports[name], {n: f"127.0.0.1:{p}" for n, p in ports.items()}


def agent(results: Path, *extra: str, name: str = "agent2",
          listen: str = "127.0.0.1:0") -> list[str]:
    return ["agent", "--name", name, "--listen", listen, "--coordinator", "127.0.0.1:9",
            "--insecure", "--results", str(results), "--register-timeout", "5", *extra]


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("efpsn: error: ") and err.count("\n") == 1, err
    return err.removeprefix("efpsn: error: ").strip()


# ------------------------------------------------------------------------- restarts refused


def test_restart_after_the_run_finished_is_refused(tmp_path: Path, capsys) -> None:
    store, _, _ = write_state(tmp_path, finished=True, mask=False)
    err = one_line_error(capsys, agent(tmp_path))
    assert err == (f"agent2 already finished run {RUN} (state in {store.folder}); remove that "
                   "folder (or give another --results/--state-dir) to start a new run")


def test_state_folder_of_another_agent_is_refused(tmp_path: Path, capsys) -> None:
    store, _, _ = write_state(tmp_path, name="agent1")
    err = one_line_error(capsys, agent(tmp_path, "--state-dir", str(store.folder)))
    assert err == f"the state in {store.folder} belongs to agent1, not agent2"


def test_restart_without_a_mask_is_refused(tmp_path: Path, capsys) -> None:
    store, _, _ = write_state(tmp_path, mask=False)
    err = one_line_error(capsys, agent(tmp_path))
    assert err.startswith(f"agent2 was stopped during phase I of run {RUN}: its mask was never "
                          f"saved (state in {store.folder})")
    assert err.endswith("This run cannot continue: start a new run")


def test_restart_with_another_listen_address_is_refused(tmp_path: Path, capsys) -> None:
    _, port, _ = write_state(tmp_path)
    err = one_line_error(capsys, agent(tmp_path, listen="127.0.0.2:0"))
    assert err == (f"agent2 advertised 127.0.0.1:{port} in run {RUN}, but would now be reached "
                   f"at 127.0.0.2:{port}: restart it with the same --listen/--advertise")


def test_restart_with_another_advertised_address_is_refused(tmp_path: Path, capsys) -> None:
    _, port, _ = write_state(tmp_path)
    err = one_line_error(capsys, agent(tmp_path, "--advertise", "localhost:1"))
    assert err == (f"agent2 advertised 127.0.0.1:{port} in run {RUN}, but would now be reached "
                   "at localhost:1: restart it with the same --listen/--advertise")


# ------------------------------------------------------------------------- damaged files


def test_damaged_assignment_is_refused(tmp_path: Path, capsys) -> None:
    store, _, _ = write_state(tmp_path)
    payload = json.loads(store.assignment_path.read_text())
    payload["assignment"]["neighbours"] = "agent1"
    store.assignment_path.write_text(json.dumps(payload))
    err = one_line_error(capsys, agent(tmp_path))
    assert err.startswith(f"{store.assignment_path} is damaged: ")
    store.assignment_path.write_bytes(b"\x00garbage")
    err = one_line_error(capsys, agent(tmp_path))
    assert err.startswith(f"cannot read {store.assignment_path}: ")


def test_damaged_mask_is_refused(tmp_path: Path, capsys) -> None:
    store, _, _ = write_state(tmp_path)
    store.mask_path.write_text("{\"format\": ")
    err = one_line_error(capsys, agent(tmp_path))
    assert err.startswith(f"agent2 cannot resume: cannot read {store.mask_path}: ")
    store.save_mask(MaskCoefficients((1, 2), CONFIG.precision), run_id=RUN, stats={})
    err = one_line_error(capsys, agent(tmp_path))
    assert err == (f"agent2 cannot resume: no usable mask for {CONFIG.basis_counts()[1]} coefficients in "
                   f"{store.mask_path}")
    store.save_mask(MaskCoefficients(tuple(range(CONFIG.basis_counts()[1])), CONFIG.precision),
                    run_id="another-run", stats={})
    err = one_line_error(capsys, agent(tmp_path))
    assert err.startswith(f"agent2 cannot resume: {store.mask_path} belongs to run "
                          "'another-run'")


def test_damaged_checkpoint_is_skipped_and_unreachable_neighbours_are_named(
    tmp_path: Path, capsys, caplog: pytest.LogCaptureFixture
) -> None:
    # prepare: a checkpoint whose array no longer matches its sha256
    import torch

    store, _, addresses = write_state(tmp_path)
    store.save_checkpoint(run_id=RUN, round_=5, history=[],
                          tensors={"x": torch.zeros(7850, dtype=torch.float64)})
    x = store.checkpoint_folder / "round-00000005" / "x.npy"
    x.write_bytes(x.read_bytes()[:-8] + b"\x00" * 7 + b"\x01")
    # execute
    with caplog.at_level(logging.WARNING):
        err = one_line_error(capsys, agent(tmp_path))
    # assert: the checkpoint was skipped with a warning saying why, the agent started over
    # from round 0 with its saved mask, and its neighbours (nobody listens there) are named
    # with their addresses once the round deadline passed
    text = caplog.text
    assert f"skipping checkpoint {x.parent}: {x} does not match its sha256" in text
    assert f"agent2 resumes run {RUN} at round 0 (saved mask reloaded; no checkpoint yet)" in text
    assert "round 0" in err and "unreachable until the deadline" in err, err
    assert any(f"{n} ({addresses[n]})" in err for n in ("agent1", "agent3")), err


# ------------------------------------------------------------------------- fresh starts


def test_listen_on_every_interface_needs_advertise(tmp_path: Path, capsys) -> None:
    err = one_line_error(capsys, agent(tmp_path, listen="0.0.0.0:0"))
    assert err == "--listen 0.0.0.0:0 binds every interface: give --advertise HOST:PORT"
    assert not (tmp_path / "agent2" / "state" / "assignment.json").exists()


def test_neighbour_unreachable_from_the_start_is_named_with_its_address(tmp_path: Path) -> None:
    # prepare: a coordinator in this process; agent1 is real, agent2 and agent3 register
    # addresses where nothing listens
    import grpc

    from agent.bootstrap import registration
    from agent.node import AgentNode
    from agent.options import AgentFailure, AgentOptions
    from agent.prepare import prepare
    from coordinator.service import serve
    from efpsn.wire.v1 import coordinator_pb2_grpc

    config = CONFIG.replace(key_bits=512, round_timeout_seconds=3.0)
    port_file = tmp_path / "coordinator.port"
    dead = {"agent2": closed_port(), "agent3": closed_port()}

    async def scenario() -> str:
        stop = asyncio.Event()
        coordinator = asyncio.ensure_future(serve(config, listen="127.0.0.1:0",
                                                  port_file=str(port_file), stop=stop))
        try:
            while not port_file.exists() or not port_file.read_text().strip():
                await asyncio.sleep(0.01)
            address = f"127.0.0.1:{int(port_file.read_text())}"
            node = AgentNode(AgentOptions(name="agent1", listen="127.0.0.1:0",
                                          coordinator=address, results_dir=tmp_path,
                                          allow_insecure_keys=True, register_timeout=30))
            running = asyncio.ensure_future(node.run())
            # they declare the run's schema and model, as real agents would
            declared = prepare(config, AgentOptions(name="agent2", listen="127.0.0.1:0",
                                                    coordinator=address))
            async with grpc.aio.insecure_channel(address) as channel:
                stub = coordinator_pb2_grpc.CoordinatorStub(channel)
                await asyncio.gather(*(
                    stub.Register(registration(declared, name=n, address=f"127.0.0.1:{p}"),
                                  timeout=30)
                    for n, p in dead.items()))
            with pytest.raises(AgentFailure) as info:
                async with asyncio.timeout(60):
                    await running
            return str(info.value)
        finally:
            stop.set()
            await coordinator

    # execute
    error = asyncio.run(scenario())
    # assert: phase I could not start, and the error names a neighbour with its address
    assert "round 0" in error and "unreachable until the deadline" in error, error
    assert any(f"{n} (127.0.0.1:{p})" in error for n, p in dead.items()), error
