"""A new edge's seed exchange, on disk while it runs, so that an end killed in the middle of it
and restarted (the same command) finishes it instead of stopping: STATE/rejoin.json (0600,
written atomically and synced by the state store, deleted once the edge's seeds are in
departures.json).

agent/departure/new_edges.py writes it before it sends anything for the edge: this end's Paillier
key pair for the exchange (its primes p and q), the seeds it drew (s_ij, hex; with the paper's fixed
mask, the 128-bit seed of the generator its shares z_ij are drawn from, or none given a test
noise seed, which draws them again), the run, the decision epoch, the re-base round and the
new neighbours. Then, each before it is used or acknowledged:
the ciphertexts it sends (before the first PutShares, so a retransmission repeats them exactly
and the other end's ledger acknowledges it as a duplicate), and what the other end sent (its
public key's modulus, its ciphertexts: the servicer acknowledges a message of a new edge only
after it is here: NewEdges.take_key / take_shares). A restart reloads it, sends its own
messages again and awaits only what is not in the file, so neither end has to run anything
twice: the exchange's messages are the same, and the seeds are the ones drawn before.

What it holds is secret like the seeds it becomes (the private key decrypts only the other
end's seed or shares for this edge, which departures.json or edge_terms.json then keep anyway); JSON
integers and hex, with the fingerprint of the key pair; never pickle, nothing of the agent's data.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from agent.state import EXCHANGE, StateStore
from efpsn.crypto import paillier

__all__ = ["ExchangeState"]

FORMAT = 1


class ExchangeState:
    """One end's exchange for the new edges of one decision (`epoch`), as saved."""

    def __init__(self, store: StateStore, payload: dict[str, Any]) -> None:
        self.store = store
        self._payload = payload
        self._lock = threading.Lock()  # the servicer's threads and the exchange write it

    @classmethod
    def create(cls, store: StateStore, *, run_id: str, epoch: int, rebase_round: int,
               joiners: Mapping[str, int],
               keypair: tuple[paillier.PublicKey, paillier.PrivateKey],
               seeds: Mapping[int, bytes], entropy: int | None = None) -> ExchangeState:
        """Saved (synced) before anything of the exchange is sent (`entropy`: the fixed
        mask's generator seed, with no `seeds`)."""
        public, private = keypair
        state = cls(store, {
            "format": FORMAT, "run_id": run_id, "epoch": int(epoch),
            "rebase_round": int(rebase_round),
            "joiners": {str(n): int(j) for n, j in sorted(joiners.items())},
            "key": {"p": int(private.p), "q": int(private.q),
                    "fingerprint": paillier.fingerprint(public).hex()},
            "seeds": {str(j): s.hex() for j, s in sorted(seeds.items())}, "entropy": entropy,
            "sent": {}, "received": {"key": {}, "shares": {}},
        })
        state._write()
        return state

    @classmethod
    def load(cls, store: StateStore, *, run_id: str, epoch: int, rebase_round: int,
             joiners: Mapping[str, int], allow_insecure: bool) -> ExchangeState | None:
        """The exchange saved for these new neighbours (None: none was started, so nothing of
        it was sent, and it starts afresh). ValueError when the file is damaged or another's."""
        path = store.record_path(EXCHANGE)
        if not store.has_record(EXCHANGE):
            return None
        try:
            payload = store.load_record(EXCHANGE, fmt=FORMAT, run_id=run_id)
            assert payload is not None
            state = cls(store, payload)
            if (int(payload["epoch"]) != epoch or int(payload["rebase_round"]) != rebase_round
                    or payload["joiners"] != {str(n): int(j) for n, j in joiners.items()}):
                return None  # another decision's (it gave no edge to finish here)
            keypair = state.keypair(allow_insecure=allow_insecure)
            if paillier.fingerprint(keypair[0]).hex() != payload["key"]["fingerprint"]:
                raise ValueError("its key pair does not match its fingerprint")
            state.seeds()
            _ = state.entropy
            state.received()
            state.sent()
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"{path} is damaged: {exc}") from None
        return state

    def keypair(self, *, allow_insecure: bool) -> tuple[paillier.PublicKey, paillier.PrivateKey]:
        key = self._payload["key"]
        return paillier.keypair_from_primes(int(key["p"]), int(key["q"]),
                                            allow_insecure=allow_insecure)

    def seeds(self) -> dict[int, bytes]:
        return {int(j): bytes.fromhex(s) for j, s in self._payload["seeds"].items()}

    @property
    def entropy(self) -> int | None:
        value = self._payload["entropy"]
        return None if value is None else int(value)

    def sent(self) -> dict[int, list[int]]:
        """The ciphertexts sent to each new neighbour (by index); {} before the first send."""
        return {int(j): [int(c) for c in cs] for j, cs in self._payload["sent"].items()}

    def received(self) -> dict[str, dict[str, Any]]:
        """kind ("key": the modulus n; "shares": the ciphertexts) -> sender -> what it sent."""
        got = self._payload["received"]
        return {"key": {str(n): int(v) for n, v in got["key"].items()},
                "shares": {str(n): [int(c) for c in cs] for n, cs in got["shares"].items()}}

    def save_sent(self, sent: Mapping[int, list[int]]) -> None:
        """Before they are sent: a restart sends these again, never new ones."""
        with self._lock:
            self._payload["sent"] = {str(j): [int(c) for c in cs]
                                     for j, cs in sorted(sent.items())}
            self._write()

    def keep(self, kind: str, sender: str, payload: Any) -> None:
        """A new neighbour's message, on disk before it is acknowledged (a thread of the
        servicer calls it): its key (a PublicKey) or its ciphertexts."""
        value: Any = payload.n if kind == "key" else [int(c) for c in payload]
        with self._lock:
            self._payload["received"][kind][sender] = value
            self._write()

    def _write(self) -> None:
        self.store.save_record(EXCHANGE, self._payload)

    def discard(self) -> None:
        """The exchange's seeds are in departures.json (or the run ended): nothing to resume."""
        self.store.discard(EXCHANGE)
