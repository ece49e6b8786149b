"""One intake of round messages (agent/phases/phase_two.py) for pushes, streams and a restart's
replay: the replay (agent/resume.py) takes a pulled message exactly as a push is taken, and answers
every judgement (none is dropped silently)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from harness import assigned_agents, message

from agent.exchange import Replay
from agent.options import AgentFailure
from efpsn.ledger import Verdict
from efpsn.params.config import RunConfig

RUN = "intake-test"
CONFIG = RunConfig(agents=3, topology="ring", iterations=50, key_bits=2048)
AT = 3  # agent1 is in phase II at round 3


class ServingPeers:
    """agent1's neighbours as a restart sees them: each serves what `served` holds."""

    def __init__(self, served: dict[tuple[str, int], Any]) -> None:
        self.served = served
        self.pulls: list[tuple[str, int]] = []

    async def pull(self, name: str, t: int, *, deadline: float) -> Any:
        self.pulls.append((name, t))
        return self.served.get((name, t))


def _replay(agent: Any, peers: ServingPeers) -> Replay:
    return Replay(peers=peers, take=agent.phase_two.take_round, mailbox=agent.mailbox,  # type: ignore[arg-type]
                  neighbours={"agent2", "agent3"}, describe_loss=lambda *a: "lost",
                  on_loss=lambda reason: None)


def test_a_replayed_round_is_taken_as_a_pushed_one_and_every_outcome_answered(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        async with assigned_agents(tmp_path, CONFIG, run_id=RUN, names=("agent1",), serve=(),
                                   tls=False, round_=AT) as agents:
            one = agents["agent1"]
            # a push and a pull of the same message get the same judgement from the one intake
            pushed = one.phase_two.take_round(message(one, AT, sender="agent2"),
                                           senders={"agent2", "agent3"})
            assert pushed.verdict == Verdict.ACCEPT
            peers = ServingPeers({("agent2", AT): message(one, AT, sender="agent2"),
                                  ("agent3", AT): message(one, AT, sender="agent3")})
            replay = _replay(one, peers)
            await replay.fill(AT, deadline=0.0)
            assert peers.pulls == [("agent3", AT)]  # agent2's push is in the mailbox already
            assert one.mailbox.has("round", AT, "agent3")
            # a duplicate (the push reached this process too) is answered: taken, not filed
            one.mailbox.discard_before("round", AT + 1)
            await replay.fill(AT, deadline=0.0)
            assert not one.mailbox.has("round", AT, "agent2")
            # a different copy of a round already taken: the replay fails, naming the neighbour
            peers.served[("agent2", AT)] = message(one, AT, sender="agent2", value=9.0)
            with pytest.raises(AgentFailure, match=f"neighbour agent2 served round {AT}: "
                                                   "a different round message"):
                await replay.fill(AT, deadline=0.0)
            # a round ahead of the window (LATER): no longer dropped silently
            peers.served[("agent2", AT + 2)] = message(one, AT + 2, sender="agent2")
            with pytest.raises(AgentFailure, match=f"served round {AT + 2}: this agent is at "
                                                   f"round {AT}"):
                await replay.fill(AT + 2, deadline=0.0)
            # a message that fails the wire checks blames its sender (a new process's replay)
            peers.served[("agent3", AT + 1)] = message(one, AT, sender="agent3")
            with pytest.raises(AgentFailure, match=f"neighbour agent3 served a bad round "
                                                   f"{AT + 1}") as info:
                await _replay(one, peers).fill(AT + 1, deadline=0.0)
            assert info.value.blame == "agent3"

    asyncio.run(scenario())
