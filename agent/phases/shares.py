"""What a receiver of phase I's shares expects: ciphertexts under its own key, so many of them,
packed or not. Phase I (agent/phases/phase_one.py) and a new edge's phase I
(agent/departure/new_edges.py) both check a sender's shares against it, at the router."""

from __future__ import annotations

from dataclasses import dataclass

from efpsn.crypto import paillier
from efpsn.params.config import RunConfig

__all__ = ["ShareCheck", "shares_packed"]


def shares_packed(config: RunConfig) -> bool:
    """The `packed` flag of this run's shares: a seed (refreshed masks) is one plaintext
    carrying many values, so it travels as a packed batch of one ciphertext."""
    return config.packed or config.refresh.refreshed


@dataclass(frozen=True)
class ShareCheck:
    """What this agent's phase I expects in a neighbour's shares: ciphertexts under its own
    key, so many of them (set once its key exists)."""

    public_key: paillier.PublicKey
    count: int
    packed: bool
