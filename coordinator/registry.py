"""Pure bootstrap logic: who registered, deterministic ids, topology and mixing weights."""

from __future__ import annotations

import re

from efpsn.config import RunConfig
from efpsn.topology import build_graph, metropolis_weights
from efpsn.wire.records import Assignment, Peer

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
MAX_ADDRESS_CHARS = 255


class NotExpected(ValueError):
    """A registration under a name this run does not expect."""


def default_names(agents: int) -> set[str]:
    """agent1..agentN: the names `efpsn up`, `efpsn certs` and the compose file use."""
    return {f"agent{i}" for i in range(1, agents + 1)}


def check_address(address: str) -> None:
    """host:port with a port in 1..65535 (IPv6 hosts in brackets)."""
    if len(address) > MAX_ADDRESS_CHARS:
        raise ValueError(f"address must be at most {MAX_ADDRESS_CHARS} characters, "
                         f"got {len(address)}")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"address must be HOST:PORT with a port in 1..65535, got {address!r}")


class Registry:
    """Collects registrations, then assigns ids by sorted name (deterministic across restarts)."""

    def __init__(self, config: RunConfig, *, run_id: str, expected_names: set[str] | None = None):
        self.config = config
        self.run_id = run_id
        # Validate the topology now: a disconnected graph must fail before anyone registers.
        self.graph = build_graph(config.topology, config.agents, seed=config.seed)
        self.weights = metropolis_weights(self.graph)
        if expected_names is not None and len(expected_names) != config.agents:
            raise ValueError(
                f"{len(expected_names)} expected names given for {config.agents} agents"
            )
        self.expected_names = expected_names
        self.addresses: dict[str, str] = {}
        self._assignments: dict[str, Assignment] | None = None

    @property
    def complete(self) -> bool:
        return len(self.addresses) == self.config.agents

    def register(self, name: str, address: str) -> None:
        """Record an agent. Re-registering the same name with the same address is idempotent;
        before the run is complete a re-registration may move the agent to a new address (an
        agent restarted before the run began). Other conflicts are ValueErrors, names outside
        the expected set NotExpected."""
        if not NAME_PATTERN.match(name):
            shown = name if len(name) <= 64 else name[:64] + "..."
            raise ValueError(
                f"agent name must match {NAME_PATTERN.pattern} (e.g. agent1), got {shown!r}"
            )
        check_address(address)
        if self.expected_names is not None and name not in self.expected_names:
            raise NotExpected(f"{name!r} is not one of the expected agents")
        holder = next((other for other, at in self.addresses.items()
                       if at == address and other != name), None)
        if holder is not None:
            # two agents cannot both be reached at one address: a neighbour dialling it would
            # reach only one of them (and be refused by TLS for the other)
            raise ValueError(f"address {address} is already registered by {holder!r}; every "
                             "agent needs its own --advertise HOST:PORT")
        known = self.addresses.get(name)
        if known is not None:
            if known != address:
                if self.complete:
                    raise ValueError(
                        f"{name!r} is already registered at {known}, not {address}, and the "
                        "run's assignments are out"
                    )
                self.addresses[name] = address
            return
        if self.complete:
            raise ValueError(
                f"the run already has its {self.config.agents} agents; {name!r} cannot join"
            )
        self.addresses[name] = address

    def assignments(self) -> dict[str, Assignment]:
        """All assignments, once every agent registered (computed once, then frozen)."""
        if not self.complete:
            raise ValueError(
                f"only {len(self.addresses)} of {self.config.agents} agents registered"
            )
        if self._assignments is None:
            names = sorted(self.addresses)
            out: dict[str, Assignment] = {}
            params = self.config.to_dict()
            for i, name in enumerate(names):
                peers = tuple(
                    Peer(
                        name=names[j], index=j, address=self.addresses[names[j]],
                        weight=float(self.weights[i, j]),
                    )
                    for j in self.graph.neighbours(i)
                )
                out[name] = Assignment(
                    run_id=self.run_id, index=i, name=name, neighbours=peers,
                    self_weight=float(self.weights[i, i]), params=params,
                    num_agents=self.config.agents,
                )
            self._assignments = out
        return self._assignments
