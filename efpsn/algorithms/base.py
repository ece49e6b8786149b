"""Step-function protocol shared by every decentralized algorithm, and the mixing primitive."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from efpsn.masks.aggregation import FRACTION_BITS, dequantise, quantise

Message = dict[str, torch.Tensor]
"""What one agent sends its neighbours in one round: named flat tensors (e.g. "x", "y")."""

Received = Mapping[str, "torch.Tensor | np.ndarray"]
"""A neighbour's message as a step receives it: in the simulator the sender's own tensors, in
the networked agent read-only float64 arrays over the received bytes (efpsn/wire/rounds.py,
RoundRecord). A step reads them (mix, float64_arrays, difference) and never writes into them:
a write into a received array raises."""

GradientOracle = Callable[[torch.Tensor, int], torch.Tensor]
"""oracle(x, t) -> the agent's (masked, possibly stochastic) gradient at x for round t."""


@dataclass(frozen=True)
class AgentState:
    """An agent's algorithm state after `t` completed rounds: named tensors, nothing else.

    Keeping state as plain named tensors makes checkpoints and wire messages trivial.
    """

    t: int
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]


@dataclass(frozen=True)
class StepContext:
    """Everything a step needs besides state and inbox: who I am, my weights, my step size."""

    agent: int
    weights: Mapping[int, float]  # w_ij for j in N_i and j == agent (self weight)
    lr: float
    oracle: GradientOracle

    @property
    def neighbours(self) -> tuple[int, ...]:
        return tuple(sorted(j for j in self.weights if j != self.agent))


class Algorithm(Protocol):
    """A decentralized algorithm as a sans-I/O state machine."""

    name: str
    state_keys: tuple[str, ...]  # the tensors of its state (what a checkpoint holds)
    message_keys: tuple[str, ...]  # the tensors of its round message (a subset of the state's)

    def mixing(self, ctx: StepContext) -> StepContext:
        """The context whose weights the step mixes messages with (what a sender weights its
        message to each neighbour by under secure aggregation)."""
        ...

    def init(self, x0: torch.Tensor, ctx: StepContext, *, t: int = 0
             ) -> tuple[AgentState, Message]:
        """State at round t (0; a party that joins: the round it joins at) and the message to
        send in that round."""
        ...

    def step(
        self, state: AgentState, inbox: Mapping[int, Received], ctx: StepContext
    ) -> tuple[AgentState, Message]:
        """Consume the neighbours' round-t messages (read, never written into); return the
        state at t + 1 and its message."""
        ...


@dataclass(frozen=True, eq=False)
class Aggregate(Mapping[int, Message]):
    """A receiver's inbox under secure aggregation (efpsn/masks/aggregation.py): for each message
    tensor only sum_j w_ij m_j over its neighbours (decoded from their masked vectors), never
    one neighbour's message; `stops`: the neighbours' stop integers (they travel in the clear).

    As a Mapping it lists the neighbours it aggregates but holds none of their messages
    (indexing raises KeyError), so code that reads one neighbour's message fails loudly.
    """

    neighbours: tuple[int, ...]
    sums: dict[str, torch.Tensor]
    bits: int = FRACTION_BITS
    stops: dict[int, torch.Tensor] = field(default_factory=dict)

    def __getitem__(self, j: int) -> Message:
        raise KeyError(f"an aggregate holds no single neighbour's message (asked for {j})")

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.neighbours)

    def __len__(self) -> int:
        return len(self.neighbours)

    def mixed(self, key: str, own: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """kept + sum_j w_ij m_j: of its own message the agent keeps exactly what it did not
        send (m_i - sum_j rint(w_ji m_i 2^F) 2^-F, the neighbours in ascending order), so every
        message mixes to its total over the network (the aggregation module's docstring)."""
        values = own.detach().numpy()
        sent = np.zeros_like(values)
        for j in sorted(self.neighbours):
            sent = sent + dequantise(quantise(values, ctx.weights[j], bits=self.bits),
                                     bits=self.bits)
        return torch.from_numpy(values - sent) + self.sums[key]

    def mean(self, key: str, ctx: StepContext) -> torch.Tensor:
        """The weighted mean of the neighbours' `key`: sum_j w_ij m_j / sum_j w_ij."""
        return self.sums[key] / sum(ctx.weights[j] for j in self.neighbours)


def check_inbox(inbox: Mapping[int, Received], ctx: StepContext, keys: tuple[str, ...]) -> None:
    """Raise ValueError unless the inbox holds exactly one well-formed message per neighbour
    (or, aggregated, the sum of every neighbour's)."""
    expected = set(ctx.neighbours)
    got = set(inbox)
    if got != expected:
        missing = sorted(expected - got)
        extra = sorted(got - expected)
        raise ValueError(
            f"agent {ctx.agent}: inbox must hold messages from neighbours {sorted(expected)}; "
            f"missing {missing}, unexpected {extra}"
        )
    if isinstance(inbox, Aggregate):
        absent = [k for k in keys if k not in inbox.sums]
        if absent:
            raise ValueError(f"agent {ctx.agent}: the aggregate lacks tensors {absent}")
        return
    for j, msg in inbox.items():
        absent = [k for k in keys if k not in msg]
        if absent:
            raise ValueError(f"agent {ctx.agent}: message from {j} lacks tensors {absent}")


def mix(
    key: str, own: Message, inbox: Mapping[int, Received], ctx: StepContext
) -> torch.Tensor:
    """sum_j w_ij v_j over j in N_i and i itself, always in ascending agent order: a new
    tensor, the caller's to change in place.

    The fixed order makes the floating-point result identical wherever the step runs
    (in-process simulator or networked agent), so both give bitwise-equal iterates. An
    Aggregate inbox (secure aggregation) gives Aggregate.mixed. float64 vectors are mixed by
    numpy into one new array and one scratch array (the same products and sums, rounded the
    same way, as torch's, without a tensor per term: float64_arrays)."""
    if isinstance(inbox, Aggregate):
        return inbox.mixed(key, own[key], ctx)
    messages: dict[int, Received] = dict(inbox)
    messages[ctx.agent] = own
    order = sorted(messages)
    arrays = float64_arrays([messages[j][key] for j in order])
    if arrays is None:
        total: torch.Tensor | None = None
        for j in order:
            term = as_tensor(messages[j][key]) * ctx.weights[j]
            total = term if total is None else total + term
        assert total is not None
        return total
    mixed = np.multiply(arrays[0], ctx.weights[order[0]])
    scratch = np.empty_like(mixed)
    for j, values in zip(order[1:], arrays[1:], strict=True):
        np.multiply(values, ctx.weights[j], out=scratch)
        np.add(mixed, scratch, out=mixed)
    return torch.from_numpy(mixed)


def float64_arrays(tensors: list[torch.Tensor | np.ndarray]) -> list[np.ndarray] | None:
    """The tensors' numpy views when every one is a float64 CPU tensor without autograd, or a
    native float64 array (a received message's, read-only), all of one shape (a step's
    vectors), else None (the caller keeps torch's operations). numpy's and torch's elementwise
    float64 products, sums and differences are the same IEEE operations, so the bits agree;
    numpy's cost less per call and write into given arrays."""
    shape = tuple(tensors[0].shape)
    out = []
    for t in tensors:
        if isinstance(t, np.ndarray):
            if t.dtype != np.float64 or t.shape != shape:
                return None
            out.append(t)
        elif (t.dtype != torch.float64 or t.device.type != "cpu" or t.requires_grad
                or tuple(t.shape) != shape):
            return None
        else:
            out.append(t.numpy())
    return out


def as_tensor(value: torch.Tensor | np.ndarray) -> torch.Tensor:
    """A tensor as is; an array (a received message's) as a fresh tensor, copied (torch has
    no read-only tensors: a view would let torch write into the received bytes)."""
    if isinstance(value, torch.Tensor):
        return value
    return torch.from_numpy(np.array(value, dtype=value.dtype.newbyteorder("=")))


def difference(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> torch.Tensor:
    """a - b as a new tensor (numpy's subtraction for float64 vectors: the same IEEE bits as
    torch's, float64_arrays), whether a and b are tensors or received arrays."""
    arrays = float64_arrays([a, b])
    if arrays is None:
        return as_tensor(a) - as_tensor(b)
    return torch.from_numpy(np.subtract(arrays[0], arrays[1]))
