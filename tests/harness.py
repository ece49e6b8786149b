"""In-process agents for tests, assembled as AgentNode assembles one (agent/assembly.py): agents
of a registered run (coordinator/registry.py's assignments), each with its servicer, ledger,
mailbox, outbox and client side, optionally served on a loopback port, placed in phase II at a
chosen round.

    async with assigned_agents(folder, config, serve=("agent1",), round_=5) as agents:
        a1 = agents["agent1"]            # its AgentService is served at a1.address
        await agents["agent2"].peers.send_round("agent1", 5, message(a1, 5, sender="agent2"),
        timeout=5)
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import torch

from agent.assembly import EXTRA_NAMES, AgentParts, local_agents
from coordinator.registry import local_assignments
from efpsn.params.config import RunConfig
from efpsn.wire.records import Phase, make_header
from efpsn.wire.rounds import message_to_proto
from efpsn.wire.v1 import agent_pb2

__all__ = ["EXTRA_NAMES", "InProcessAgent", "assigned_agents", "message", "round_message"]

InProcessAgent = AgentParts  # one agent's rooms, assigned to a run and in phase II


def round_message(*, run_id: str, sender: str, t: int, x: torch.Tensor,
                  **tensors: torch.Tensor) -> agent_pb2.RoundMessage:
    """A round message as a neighbour sends it ({"x": x} plus any other named tensors)."""
    return message_to_proto({"x": x, **tensors}, header=make_header(
        run_id=run_id, sender=sender, round=t, phase=Phase.OPTIMIZE))


def message(agent: InProcessAgent, t: int, *, sender: str,
            value: float = 1.0) -> agent_pb2.RoundMessage:
    """A valid round-t message from `sender` to `agent` (every entry value + t)."""
    assert agent.session is not None
    tensors = {k: torch.full(shape, value + t, dtype=torch.float64)
               for k, shape in agent.session.message_shapes.items()}
    return message_to_proto(tensors, header=make_header(
        run_id=agent.session.run_id, sender=sender, round=t, phase=Phase.OPTIMIZE))


@contextlib.asynccontextmanager
async def assigned_agents(folder: Path, config: RunConfig, *, run_id: str,
                          names: Sequence[str] = ("agent1",), serve: Sequence[str] = ("agent1",),
                          tls: bool = True, round_: int = 0, keep_rounds: int = 128,
                          ports: Mapping[str, int] | None = None, new_certificates: bool = True,
                          ) -> AsyncIterator[dict[str, InProcessAgent]]:
    """Agents `names` of a run of `config` (every agent registered: the served ones at their
    real address, the others at unused loopback ports), each in phase II at round `round_`
    (agent/assembly.py's local_agents with the registry's assignments)."""
    async with local_agents(folder, config, run_id=run_id,
                            assign=functools.partial(local_assignments, run_id=run_id),
                            names=names, serve_names=serve, tls=tls, round_=round_,
                            keep_rounds=keep_rounds, ports=ports,
                            new_certificates=new_certificates) as agents:
        yield agents
