"""Pure bootstrap logic: who registered (and with which data schema and model), deterministic
ids, topology and mixing weights; and a late seat taking its place (a party that joins the
running network: coordinator/joins.py decides when)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from efpsn.params.config import RunConfig
from efpsn.topology import graph_over, metropolis_weights
from efpsn.wire.records import Assignment, Peer

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
MAX_ADDRESS_CHARS = 255


FINGERPRINT_BYTES = 32  # sha256
MAX_FAILURE_CHARS = 200


class NotExpected(ValueError):
    """A registration under a name this run does not expect."""


class RunCancelled(ValueError):
    """The run cannot start: an agent failed before phase I or declared a schema or model that
    does not match. Every held and later registration is refused with this message; `by` names
    the agent that caused it."""

    def __init__(self, message: str, *, by: str) -> None:
        super().__init__(message)
        self.by = by


@dataclass(frozen=True)
class Declaration:
    """What an agent declares at registration: its data schema and its model's fingerprint
    (compared as bytes: the coordinator never builds a model)."""

    input_shape: str = ""
    classes: int = 0
    model_fingerprint: bytes = b""
    failure: str = ""


def _shown(text: str, limit: int = 64) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def default_names(agents: int) -> set[str]:
    """agent1..agentN: the names `efpsn up`, `efpsn certs` and the compose file use."""
    return {f"agent{i}" for i in range(1, agents + 1)}


def seat_order(names: set[str] | list[str]) -> list[str]:
    """Names in seat order (their index order): natural order, agent2 before agent10, so that
    agentK holds index K - 1 as the simulator and the data folders number them."""
    return sorted(names, key=lambda n: [int(t) if t.isdigit() else t
                                        for t in re.split(r"(\d+)", n)])


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
        # agents receive concrete numbers, never "auto"; except a scale standard run's, which
        # every agent resolves after the secure sum of column statistics
        # (agent/phases/secure_sum.py)
        self.config = config if config.scale.standard else config.resolved()
        self.run_id = run_id
        # Validate the topology now: a disconnected graph must fail before anyone registers.
        # With seats that join later, the graph is the topology over those present at the start
        self.graph = graph_over(config.topology, config.starting_members, agents=config.agents,
                                seed=config.seed)
        self.weights = metropolis_weights(self.graph)
        if expected_names is not None and len(expected_names) != config.agents:
            raise ValueError(
                f"{len(expected_names)} expected names given for {config.agents} agents"
            )
        if expected_names is None and config.late_seats:  # seats by their agentK names
            expected_names = default_names(config.agents)
        self.expected_names = expected_names
        seats = None if expected_names is None else seat_order(expected_names)
        # the late seats' names: the seats the run leaves empty at the start (agentK: index K-1)
        self.late = frozenset() if seats is None else frozenset(seats[i]
                                                                for i in config.late_seats)
        self.joined: dict[str, int] = {}  # a late seat that took its place -> its index
        self.addresses: dict[str, str] = {}
        self.declared: dict[str, Declaration] = {}
        self.cancelled: str | None = None  # why the run was cancelled, once it is
        self.cancelled_by = ""  # the agent that caused it
        self._assignments: dict[str, Assignment] | None = None

    @property
    def complete(self) -> bool:
        """Every seat but the late ones registered (a late seat joins later)."""
        return len(set(self.addresses) - self.late) == self.config.agents - len(self.late)

    @property
    def starting(self) -> int:
        """How many agents the run starts with."""
        return self.config.agents - len(self.late)

    def cancel(self, reason: str, *, by: str) -> RunCancelled:
        """Cancel the run because of agent `by` (the first reason sticks); the error to raise."""
        if self.cancelled is None:
            self.cancelled, self.cancelled_by = reason, by
        return RunCancelled(self.cancelled, by=self.cancelled_by)

    def _check_declaration(self, name: str, d: Declaration) -> None:
        c = self.config
        if d.failure:
            why = "".join(ch if ch.isprintable() else "?" for ch in d.failure[:MAX_FAILURE_CHARS])
            raise self.cancel(f"{name} stopped before phase I: {why}; the run is cancelled",
                              by=name)
        if d.input_shape != c.input_shape:
            raise self.cancel(f"{name} declared input_shape {_shown(d.input_shape)}, but the "
                              f"run's data schema has input_shape {c.input_shape!r}; the run "
                              "is cancelled", by=name)
        if d.classes != c.classes:
            raise self.cancel(f"{name} declared classes {d.classes}, but the run's data schema "
                              f"has classes {c.classes}; the run is cancelled", by=name)
        if len(d.model_fingerprint) != FINGERPRINT_BYTES:
            raise self.cancel(f"{name} declared a model_fingerprint of "
                              f"{len(d.model_fingerprint)} bytes, expected {FINGERPRINT_BYTES} "
                              "(sha256); the run is cancelled", by=name)

    def _check_models(self) -> None:
        """Once everyone registered: all model fingerprints must agree. Agents whose
        fingerprint differs from the most common one are named (all of them on a tie)."""
        prints = {n: d.model_fingerprint for n, d in self.declared.items()}
        counts = Counter(prints.values()).most_common()
        if len(counts) == 1:
            return
        majority = counts[0][0] if counts[0][1] > counts[1][1] else None
        odd = sorted(n for n, fp in prints.items() if fp != majority)
        shown = ", ".join(f"{n} ({prints[n].hex()[:12]})" for n in odd)
        if majority is None:
            raise self.cancel(f"the agents disagree on model_fingerprint: {shown}; every agent "
                              f"must build the same model for task {str(self.config.task)!r}; the "
                              "run is cancelled", by=odd[0])
        raise self.cancel(f"model_fingerprint of {shown} differs from the other agents' "
                          f"({majority.hex()[:12]}): every agent must build the same model for "
                          f"task {str(self.config.task)!r}; the run is cancelled", by=odd[0])

    def register(self, name: str, address: str,
                 declaration: Declaration | None = None) -> None:
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
        if name in self.late:
            raise NotExpected(f"{name!r} is a seat that joins the running network later "
                              "(--late-seats): start it with `efpsn agent --join`")
        if self.cancelled is not None:
            raise RunCancelled(self.cancelled, by=self.cancelled_by)
        holder = next((other for other, at in self.addresses.items()
                       if at == address and other != name), None)
        if holder is not None:
            # two agents cannot both be reached at one address: a neighbour dialling it would
            # reach only one of them (and be refused by TLS for the other)
            raise ValueError(f"address {address} is already registered by {holder!r}; every "
                             "agent needs its own --advertise HOST:PORT")
        if declaration is not None and not self.complete:  # once complete, all were checked
            self._check_declaration(name, declaration)
        known = self.addresses.get(name)
        if known is not None:
            if known != address:
                if self.complete:
                    raise ValueError(
                        f"{name!r} is already registered at {known}, not {address}, and the "
                        "run's assignments are out"
                    )
                self.addresses[name] = address
            if declaration is not None and not self.complete:
                self.declared[name] = declaration
            return
        if self.complete:
            raise ValueError(
                f"the run already has its {self.starting} agents; {name!r} cannot join"
            )
        self.addresses[name] = address
        if declaration is not None:
            self.declared[name] = declaration
        if self.complete and len(self.declared) == len(self.addresses):
            self._check_models()

    def assignments(self) -> dict[str, Assignment]:
        """All assignments, once every agent registered (computed once, then frozen)."""
        if not self.complete:
            raise ValueError(
                f"only {len(self.addresses)} of {self.starting} agents registered"
            )
        if self._assignments is None:
            names = self.seats
            members = tuple(names)  # every seat, the late ones too (they join later)
            out: dict[str, Assignment] = {}
            for i, name in enumerate(names):
                if name in self.late:
                    continue
                peers = tuple(
                    Peer(
                        name=names[j], index=j, address=self.addresses[names[j]],
                        weight=float(self.weights[i, j]),
                    )
                    for j in self.graph.neighbours(i)
                )
                out[name] = Assignment(
                    run_id=self.run_id, index=i, name=name, neighbours=peers,
                    self_weight=float(self.weights[i, i]),
                    num_agents=self.config.agents, members=members,
                )
            self._assignments = out
        return self._assignments

    @property
    def seats(self) -> list[str]:
        """Every seat's name in index order (the expected names; else, once complete, the
        registered ones)."""
        return seat_order(self.expected_names if self.expected_names is not None
                          else set(self.addresses))

    def index_of(self, name: str) -> int:
        return self.seats.index(name)

    def take_seat(self, name: str, address: str, declaration: Declaration) -> int:
        """A late seat's party joins (seat_of checked it): its address and declaration are
        recorded; its index."""
        index = self.seat_of(name, address, declaration)
        self.addresses[name] = address
        self.declared[name] = declaration
        self.joined[name] = index
        return index

    def seat_of(self, name: str, address: str, declaration: Declaration) -> int:
        """A late seat's party asks to join: its name, address and declaration checked as a
        registration's (the same schema, the members' model); its index (nothing recorded).
        NotExpected or ValueError (one line: why) when it cannot."""
        if name not in self.late:
            raise NotExpected(f"{name!r} is not a seat of this run that joins later (late "
                              f"seats: {', '.join(seat_order(self.late)) or 'none'})")
        if not self.complete or self.cancelled is not None:
            raise ValueError(f"{name} asks to join run {self.run_id}, which has not started")
        check_address(address)
        holder = next((other for other, at in self.addresses.items()
                       if at == address and other != name), None)
        if holder is not None:
            raise ValueError(f"address {address} is already registered by {holder!r}; every "
                             "agent needs its own --advertise HOST:PORT")
        known = self.addresses.get(name)
        if known is not None and known != address:
            raise ValueError(f"{name!r} asked to join at {known}, not {address}")
        self._check_joiner(name, declaration)
        return self.index_of(name)

    def _check_joiner(self, name: str, d: Declaration) -> None:
        """A joiner's declaration against the run's (its refusal cancels nothing)."""
        c = self.config
        if d.failure:
            raise ValueError(f"{name} cannot take part: "
                             + "".join(ch if ch.isprintable() else "?"
                                       for ch in d.failure[:MAX_FAILURE_CHARS]))
        if (d.input_shape, d.classes) != (c.input_shape, c.classes):
            raise ValueError(f"{name} declared input shape {_shown(d.input_shape)} and "
                             f"{d.classes} classes; the run's data schema is "
                             f"{c.input_shape!r} with {c.classes} classes")
        prints = Counter(x.model_fingerprint for n, x in self.declared.items()
                         if n not in self.late)
        model = prints.most_common(1)[0][0] if prints else b""
        if d.model_fingerprint != model:
            raise ValueError(f"{name}'s model fingerprint {d.model_fingerprint.hex()[:12]} "
                             f"differs from the members' ({model.hex()[:12]}): it must build "
                             f"the same model for task {str(c.task)!r}")


def local_assignments(config: RunConfig, addresses: Mapping[str, str], *,
                      run_id: str) -> dict[str, Assignment]:
    """Every agent's assignment when every agent of `addresses` registers at once (a local run
    without the coordinator's process: the tests' harness, the benchmarks)."""
    registry = Registry(config, run_id=run_id, expected_names=set(addresses))
    for name, address in addresses.items():
        registry.register(name, address)
    return registry.assignments()
