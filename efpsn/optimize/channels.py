"""How a round's message reaches the neighbours: in the clear, or as per-receiver masked integer
vectors that only sum to something at the receiver (efpsn/masks/aggregation.py).

A channel turns an agent's outbox into what it sends each neighbour (`seal`) and what it
received from all of them into the inbox its step consumes (`open`). The in-process simulator
and a networked agent call the same two methods, so both mix the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from efpsn.algorithms.base import Aggregate, Algorithm, Message, StepContext
from efpsn.masks.aggregation import (
    FRACTION_BITS,
    PairSeed,
    agree_seeds,
    check_symmetric,
    decode,
    encode,
    generate_private_key,
    public_key_bytes,
    quantise,
)
from efpsn.optimize.stopping import STOP_KEY

__all__ = ["MESSAGE_MODES", "AggregateChannel", "Channel", "ClearChannel", "Sealed",
           "simulated_channels"]

MESSAGE_MODES = ("clear", "aggregate")


@dataclass(frozen=True, eq=False)
class Sealed:
    """What one sender sends one receiver in one round under aggregation: the masked words of
    the message tensors (uint64, in `keys` order, each flattened), their shapes, and the stop
    integers of a check window (clear, or None)."""

    words: np.ndarray
    keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    stop: torch.Tensor | None = None


class ClearChannel:
    """Every neighbour gets the outbox itself; the inbox is the neighbours' outboxes."""

    mode = "clear"

    def seal(self, outbox: Message, t: int, neighbours: Sequence[int]) -> dict[int, Message]:
        return {j: outbox for j in neighbours}

    def open(self, received: Mapping[int, Message], t: int) -> Mapping[int, Message]:
        return dict(received)


class AggregateChannel:
    """Agent `agent`'s side of secure aggregation: its mixing weights (the algorithm's, which
    must be symmetric: w_ij = w_ji), the message keys, and the pair seeds by receiver."""

    mode = "aggregate"

    def __init__(self, *, agent: int, mixing: StepContext, keys: Sequence[str],
                 seeds: Mapping[int, Sequence[PairSeed]], fan_in: Mapping[int, int],
                 bits: int = FRACTION_BITS) -> None:
        neighbours = set(mixing.neighbours)
        if set(seeds) != neighbours or not neighbours <= set(fan_in):
            raise ValueError(f"agent {agent}: seeds for {sorted(seeds)} but neighbours "
                             f"{sorted(neighbours)}")
        self.agent = agent
        self.mixing = mixing
        self.keys = tuple(keys)
        self.seeds = {j: tuple(s) for j, s in seeds.items()}
        self.fan_in = dict(fan_in)
        self.bits = bits

    def seal(self, outbox: Message, t: int, neighbours: Sequence[int]) -> dict[int, Sealed]:
        """E_ij(t) for every neighbour j (the outbox's STOP_KEY integers travel beside it)."""
        values = [outbox[k].detach().numpy() for k in self.keys]
        shapes = tuple(tuple(v.shape) for v in values)
        flat = np.concatenate([v.reshape(-1) for v in values])
        stop = outbox.get(STOP_KEY)
        out = {}
        for j in neighbours:
            q = quantise(flat, self.mixing.weights[j], bits=self.bits,
                         fan_in=self.fan_in[j])
            out[j] = Sealed(words=encode(q, self.seeds[j], t), keys=self.keys, shapes=shapes,
                            stop=stop)
        return out

    def open(self, received: Mapping[int, Sealed], t: int) -> Aggregate:
        """The Aggregate of the neighbours' round-t vectors (their masks cancel here)."""
        if set(received) != set(self.mixing.neighbours):
            raise ValueError(f"agent {self.agent}: received from {sorted(received)}, "
                             f"expected {sorted(self.mixing.neighbours)}")
        order = sorted(received)
        first = received[order[0]]
        if any(received[j].keys != self.keys or received[j].shapes != first.shapes
               for j in order):
            raise ValueError(f"agent {self.agent}: the neighbours' vectors disagree on the "
                             "message's tensors")
        total = decode([received[j].words for j in order], bits=self.bits)
        sums, start = {}, 0
        for key, shape in zip(self.keys, first.shapes, strict=True):
            size = int(np.prod(shape, dtype=np.int64))
            sums[key] = torch.from_numpy(total[start:start + size].reshape(shape).copy())
            start += size
        stops = {j: received[j].stop for j in order if received[j].stop is not None}
        return Aggregate(neighbours=tuple(order), sums=sums, bits=self.bits,
                         stops=stops)  # type: ignore[arg-type]


Channel = ClearChannel | AggregateChannel


def simulated_channels(mode: str, *, algorithm: Algorithm, contexts: Sequence[StepContext],
                       weights: np.ndarray, run_id: bytes = b"simulation"
                       ) -> list[Channel]:
    """Every agent's channel for an in-process run: each draws its own X25519 key and agrees
    its pair seeds exactly as a networked agent would (the masks cancel, so the run's numbers
    do not depend on the keys)."""
    if mode not in MESSAGE_MODES:
        raise ValueError(f"messages must be one of {MESSAGE_MODES}, got {mode!r}")
    if mode == "clear":
        return [ClearChannel() for _ in contexts]
    check_symmetric(weights)
    neighbours = {c.agent: c.neighbours for c in contexts}
    keys = [generate_private_key() for _ in contexts]
    public = {c.agent: public_key_bytes(k) for c, k in zip(contexts, keys, strict=True)}
    channels: list[Channel] = []
    for c, key in zip(contexts, keys, strict=True):
        mixing = algorithm.mixing(c)
        channels.append(AggregateChannel(
            agent=c.agent, mixing=mixing, keys=algorithm.message_keys,
            seeds=agree_seeds(c.agent, key, public, neighbours, run_id=run_id),
            fan_in={j: len(neighbours[j]) for j in c.neighbours}))
    return channels
