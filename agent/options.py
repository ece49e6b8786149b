"""How one agent runs (its own options; the run's parameters come from the coordinator)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from efpsn.wire.tls import TlsConfig


class AgentFailure(RuntimeError):
    """The run cannot go on at this agent. `blame`: the other agent whose failure (or absence)
    caused it, when known; None when the cause is this agent's own (its input, its state)."""

    def __init__(self, message: str, *, blame: str | None = None) -> None:
        super().__init__(message)
        self.blame = blame


class Cancelled(AgentFailure):
    """The coordinator cancelled the run before phase I because of agent `by`."""

    def __init__(self, message: str, *, by: str) -> None:
        super().__init__(message, blame=by)
        self.by = by


class RefusedByNeighbour(AgentFailure):
    """A neighbour answered a call with an error status (`code`, its name; `detail`)."""

    def __init__(self, message: str, *, code: str, detail: str, neighbour: str) -> None:
        super().__init__(message, blame=neighbour)
        self.code = code
        self.detail = detail


class NotReady(Exception):
    """A message came before the part of this agent that takes it is ready (its phase has not
    begun, its key is not made yet): the router answers UNAVAILABLE and the sender retries."""


@dataclass(frozen=True, kw_only=True)
class AgentOptions:
    """How this agent runs; the run's parameters come from the coordinator."""

    name: str
    listen: str
    coordinator: str
    advertise: str | None = None  # host:port neighbours dial; default: listen host + bound port
    results_dir: Path = Path("results")
    register_timeout: float = 600.0  # for every agent to register, once the coordinator answers
    connect_timeout: float = 120.0  # to reach the coordinator at all
    port_file: str | None = None
    failure_file: Path | None = None  # where to record why this agent stopped (JSON), if asked
    # Mutual TLS (None: plaintext, only with an explicit --insecure). The certificate must name
    # this agent; peers are verified against their agent names, the coordinator against
    # coordinator_name.
    tls: TlsConfig | None = None
    coordinator_name: str = "coordinator"
    # Who may read this agent's private figures (loss, accuracy) through GetStatus: the name in
    # the operator's certificate. None: this agent's own name. Others see liveness only.
    operator_name: str | None = None
    # Crash safety: state folder (default RESULTS/NAME/state), checkpoint interval, and how many
    # recent outboxes to keep for neighbours that restart (must exceed checkpoint_every + 2 at
    # every agent of the run).
    state_dir: Path | None = None
    checkpoint_every: int = 50
    keep_rounds: int = 128
    # The agent's own data (config.data == "local"), read on this host only: a file or IDX
    # folder, the fraction held out locally for evaluation, an optional public test set, and
    # the label column of .csv files.
    data: Path | None = None
    holdout: float | None = None  # None: auto (efpsn.data.local.resolve_holdout)
    test_data: Path | None = None
    label_column: str | None = None  # None: the run's table schema's, else "label"
    quiet: bool = False  # no progress line per evaluation
    # a party of a seat the run leaves empty (RunConfig.late): it asks the running network to
    # take it in (Coordinator.Join) instead of registering before the start
    join: bool = False
    # Phase II: seconds a neighbour may stay silent before this agent asks the coordinator
    # whether it left for good (agent/departure/). None: the run's round timeout; 0: never
    # (a silent neighbour stops this agent, exit 2 naming it).
    departure_deadline: float | None = None
    # Test and debugging hooks. Both break privacy; never use them in a real deployment.
    insecure_noise_seed: int | None = None  # reproducible noise (to compare with the simulator)
    debug_expose_mask: bool = False  # write this agent's mask numerators into result.json
    allow_insecure_keys: bool = False  # accept Paillier keys below 2048 bits

    def __post_init__(self) -> None:
        if self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {self.checkpoint_every}")
        if self.keep_rounds < self.checkpoint_every + 3:
            raise ValueError(
                f"keep_rounds ({self.keep_rounds}) must exceed checkpoint_every + 2 "
                f"({self.checkpoint_every + 2}): a neighbour restarted from its last checkpoint "
                "replays up to checkpoint_every + 2 rounds from our history"
            )
        if self.holdout is not None and not 0.0 <= self.holdout < 1.0:
            raise ValueError(f"holdout must lie in [0, 1), got {self.holdout}")
        if self.departure_deadline is not None and self.departure_deadline < 0:
            raise ValueError(f"departure_deadline must be >= 0 (0: off), got "
                             f"{self.departure_deadline}")
        if self.tls is not None:
            self.tls.require_name(self.name)

    @property
    def operator(self) -> str:
        return self.operator_name or self.name

    @property
    def state_folder(self) -> Path:
        return self.state_dir or Path(self.results_dir) / self.name / "state"
