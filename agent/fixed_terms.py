"""The paper's fixed mask (`--refresh never`) across a departure, at one agent.

Agent i's fixed mask is numerator_i = sum_j (z_ij - z_ji) over its neighbours j: z_ij it drew,
z_ji came encrypted under its own key. Phase I's Masker decrypts only the sum of the z_ji (one
decryption per plaintext), so the agent keeps its Masker (in memory, never on disk: it holds
the private key and the shares) and, when neighbour d leaves for good, decrypts d's
ciphertexts alone and subtracts z_id - z_di (efpsn.masking.Masker.edge_terms): exactly the
terms it shares with d, which it could always read, and what the simulator's replay does with
efpsn/departure_masks.py's PairShares. A new edge (a departure that cut the graph) runs the
paper's phase I for that edge alone (agent/rejoin.py, a Masker on the new neighbours), whose
terms are added at the re-base round.

A neighbour that left in phase I itself (Masker.drop) never had terms in the mask: dropping
it subtracts nothing.

A restarted agent no longer holds its Masker: a departure after a restart is refused with the
reason (exit 2), the fixed mask's only case that is (agent/departing.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from efpsn.masking import MaskCoefficients, Masker
from efpsn.refresh import FixedMask

__all__ = ["EdgeTerms"]


class EdgeTerms:
    """Where this agent's per-edge terms of the fixed mask are: phase I's Masker, then the
    new edges' ones."""

    def __init__(self, masker: Masker | None) -> None:
        self._maskers: list[Masker] = [] if masker is None else [masker]

    @property
    def available(self) -> bool:
        return bool(self._maskers)

    def add(self, masker: Masker) -> None:
        """A new edge's phase I (finished): its terms are added at the re-base round."""
        self._maskers.append(masker)

    def _terms(self, j: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        for masker in reversed(self._maskers):  # the newest edge with j
            if j in masker.neighbours:
                return masker.edge_terms(j)
        raise ValueError(f"agent{j + 1} shares no mask terms with this agent")

    def _shifted(self, mask: FixedMask, agents: Iterable[int], sign: int) -> FixedMask:
        numerators = list(mask.mask.numerators)
        for j in agents:
            if any(j in masker.departed for masker in self._maskers):
                continue  # it left in phase I: the mask never held its edge's terms
            sent, received = self._terms(j)
            for k, (z_out, z_in) in enumerate(zip(sent, received, strict=True)):
                numerators[k] += sign * (z_out - z_in)
        return FixedMask(MaskCoefficients(tuple(numerators), mask.mask.precision))

    def dropped(self, mask: FixedMask, gone: Iterable[int]) -> FixedMask:
        """The mask without the terms shared with the agents in `gone`."""
        return self._shifted(mask, gone, -1)

    def joined(self, mask: FixedMask, new: Iterable[int]) -> FixedMask:
        """The mask with the terms of the new edges to the agents in `new`."""
        return self._shifted(mask, new, +1)
