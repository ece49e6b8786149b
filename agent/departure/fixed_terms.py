"""The paper's fixed mask (`--refresh never`) across a departure, at one agent.

Agent i's fixed mask is numerator_i = sum_j (z_ij - z_ji) over its neighbours j: z_ij it drew,
z_ji came encrypted under its own key. Phase I's Masker decrypts only the sum of the z_ji (one
decryption per plaintext), so the agent keeps its Masker in memory and, when neighbour d leaves
for good, decrypts d's ciphertexts alone and subtracts z_id - z_di
(efpsn.masks.zero_sum.Masker.edge_terms): exactly the terms it shares with d, which it could always
read, and what the simulator's replay does with efpsn/departure/remask.py's PairShares. A new
edge (a departure that cut the graph) runs the paper's phase I for that edge alone
(agent/departure/new_edges.py, a Masker on the new neighbours), whose terms are added at the re-base
round.

A neighbour that left in phase I itself (Masker.drop) never had terms in the mask: dropping
it subtracts nothing.

A restart: when departures are on (--departure-deadline > 0), the agent decrypts every edge's
terms alone as soon as phase I ends (`save_phase_one`: deg * ceil(N / slots) decryptions, once)
and saves them in STATE/edge_terms.json before its mask (0600, written atomically and synced,
deleted with the run's other secrets when it ends: agent/state.py); each departure's new edges'
terms are added to it. Integers only, z_ij and z_ji per edge, with the fingerprints of the Paillier
keys they were received under: mask shares, random integers drawn for the run, nothing derived from
the agent's data, and nothing the agent could not read (the same secrets as the seeds a refreshed
mask saves); never the private key. A restarted agent reloads them (`restore`: their phase I edges
must add up to its saved mask), so a departure after the restart, or one before it that it
re-applies (agent/departure/local.py), subtracts the same integers as the replay.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from agent.state import EDGE_TERMS, StateStore
from efpsn.crypto import paillier
from efpsn.masks.refresh import FixedMask
from efpsn.masks.zero_sum import MaskCoefficients, Masker

__all__ = ["EdgeTerms", "save_phase_one"]

FORMAT = 1
Terms = tuple[tuple[int, ...], tuple[int, ...]]


class EdgeTerms:
    """Where this agent's per-edge terms of the fixed mask are: phase I's Masker, then the
    new edges' ones (or, after a restart, the terms saved before it)."""

    def __init__(self, masker: Masker | None) -> None:
        self._maskers: list[Masker] = [] if masker is None else [masker]
        self._phase_one = set() if masker is None else set(masker.neighbours)
        self._known: dict[int, Terms] = {}  # decrypted or reloaded, per neighbour
        self._left: set[int] = set()  # reloaded: the neighbours that left in phase I
        self._keys: list[str] = []  # reloaded: fingerprints of the keys the terms came under

    @property
    def available(self) -> bool:
        return bool(self._maskers or self._known)

    @property
    def held(self) -> set[int]:
        """The neighbours whose edge's terms this agent holds (in a Masker, or reloaded)."""
        return set(self._known).union(*(m.neighbours for m in self._maskers))

    def add(self, masker: Masker) -> None:
        """A new edge's phase I (finished): its terms are added at the re-base round."""
        self._maskers.append(masker)
        for j in masker.neighbours:
            self._known.pop(j, None)  # the newest edge with j

    def _terms(self, j: int) -> Terms:
        if j in self._known:
            return self._known[j]
        for masker in reversed(self._maskers):  # the newest edge with j
            if j in masker.neighbours:
                self._known[j] = masker.edge_terms(j)
                return self._known[j]
        raise ValueError(f"agent{j + 1} shares no mask terms with this agent")

    def _departed(self, j: int) -> bool:
        return j in self._left or any(j in masker.departed for masker in self._maskers)

    def _shifted(self, mask: FixedMask, agents: Iterable[int], sign: int) -> FixedMask:
        numerators = list(mask.mask.numerators)
        for j in agents:
            if self._departed(j):
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

    def save(self, store: StateStore, *, run_id: str) -> None:
        """Every edge's terms (decrypted alone, once) to STATE/edge_terms.json, for a restart."""
        for masker in self._maskers:
            for j in masker.neighbours:
                self._terms(j)
        left = self._left | {j for m in self._maskers for j in m.departed}
        keys = self._keys + [paillier.fingerprint(m.public_key).hex() for m in self._maskers]
        store.save_record(EDGE_TERMS, {
            "format": FORMAT, "run_id": run_id, "keys": sorted(set(keys)),
            "phase_one": sorted(self._phase_one), "left_in_phase_one": sorted(left),
            "terms": {str(j): [list(out), list(back)] for j, (out, back) in
                      sorted(self._known.items())},
        })

    def restore(self, store: StateStore, *, run_id: str, mask: FixedMask) -> None:
        """The terms saved before a restart; ValueError when missing, another run's, damaged or
        not the terms of `mask` (phase I's saved mask: its edges' z_ij - z_ji add up to it)."""
        path = store.record_path(EDGE_TERMS)
        if not store.has_record(EDGE_TERMS):
            raise ValueError(f"no per-edge terms of the fixed mask in {path}")
        try:
            payload = store.load_record(EDGE_TERMS, fmt=FORMAT, run_id=run_id)
            assert payload is not None
            known = {int(j): (tuple(int(z) for z in out), tuple(int(z) for z in back))
                     for j, (out, back) in payload["terms"].items()}
            phase_one = {int(j) for j in payload["phase_one"]}
            left = {int(j) for j in payload["left_in_phase_one"]}
            keys = [str(k) for k in payload["keys"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path} is damaged: {exc}") from None
        total = [0] * len(mask.mask.numerators)
        for j in sorted(phase_one - left):
            if j not in known:
                raise ValueError(f"{path} lacks the terms of the edge with agent{j + 1}")
            out, back = known[j]
            if len(out) != len(total) or len(back) != len(total):
                raise ValueError(f"{path} holds terms of another length than the mask")
            total = [t + z_out - z_in for t, z_out, z_in in zip(total, out, back, strict=True)]
        if tuple(total) != mask.mask.numerators:
            raise ValueError(f"the terms in {path} do not add up to the saved mask")
        self._known.update(known)
        self._phase_one, self._left, self._keys = phase_one, left, keys


def save_phase_one(masker: Masker, store: StateStore, *, run_id: str
                   ) -> tuple[EdgeTerms, dict[str, float]]:
    """Phase I just ended with departures on: every edge's terms, decrypted alone and saved
    for a restart (before the mask is saved, so a saved mask always has its terms); the terms
    and what it cost phase I (seconds, decryptions: deg * ceil(N / slots))."""
    start, before = time.perf_counter(), masker.decryptions
    terms = EdgeTerms(masker)
    terms.save(store, run_id=run_id)
    return terms, {"edge_terms_seconds": time.perf_counter() - start,
                   "edge_terms_decryptions": masker.decryptions - before}
