"""The receive rules (efpsn/ledger.py), without a network: every verdict with hand-made
messages, and properties of the window over arbitrary sequences of deliveries."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from efpsn.ledger import PhaseOneLedger, RoundLedger, Verdict


def _ledger(**kw: int | None) -> RoundLedger:
    return RoundLedger(**{"last": 100, "keep": 4, "position": 10, "resumed_from": None, **kw})


def test_window_accepts_the_current_and_the_next_round_and_defers_later_ones() -> None:
    ledger = _ledger()
    assert ledger.judge("agent2", 10, b"a").verdict is Verdict.ACCEPT
    assert ledger.judge("agent2", 11, b"b").verdict is Verdict.ACCEPT
    later = ledger.judge("agent2", 12, b"c")
    assert later.verdict is Verdict.LATER and later.code == "UNAVAILABLE"
    assert "ahead of its window" in later.reason
    assert ledger.holds("agent2", 10) and not ledger.holds("agent2", 12)


def test_a_copy_is_a_duplicate_and_a_different_copy_a_refusal() -> None:
    ledger = _ledger()
    ledger.judge("agent2", 10, b"a")
    assert ledger.judge("agent2", 10, b"a").verdict is Verdict.DUPLICATE
    conflict = ledger.judge("agent2", 10, b"z")
    assert (conflict.verdict, conflict.code) == (Verdict.REFUSE, "INVALID_ARGUMENT")
    assert "already received" in conflict.reason
    # another sender's message for the same round is its own
    assert ledger.judge("agent5", 10, b"z").verdict is Verdict.ACCEPT


def test_consumed_rounds_are_compared_with_their_digest_until_forgotten() -> None:
    ledger = _ledger()
    ledger.judge("agent2", 10, b"a")
    ledger.advance(11)
    assert ledger.judge("agent2", 10, b"a").verdict is Verdict.DUPLICATE
    behind = ledger.judge("agent2", 10, b"b")
    assert (behind.verdict, behind.code) == (Verdict.REFUSE, "INVALID_ARGUMENT")
    ledger.advance(15)  # keep = 4: rounds < 11 forgotten
    old = ledger.judge("agent2", 10, b"a")
    assert (old.verdict, old.code) == (Verdict.REFUSE, "FAILED_PRECONDITION")
    assert "older than the rounds it remembers" in old.reason
    assert ledger.remembered() == 0


def test_rounds_before_a_restart_are_acknowledged_blindly() -> None:
    """The previous process consumed them (it reached a later checkpoint): a retry whose
    acknowledgement the crash lost."""
    ledger = _ledger(position=40, resumed_from=40)
    assert ledger.judge("agent2", 39, b"x").verdict is Verdict.DUPLICATE
    assert ledger.judge("agent2", 40, b"x").verdict is Verdict.ACCEPT
    ledger.advance(41)
    assert ledger.judge("agent2", 40, b"y").verdict is Verdict.REFUSE  # this process's own


def test_rounds_beyond_the_run_are_refused_and_the_window_only_moves_forward() -> None:
    ledger = _ledger(last=10)
    beyond = ledger.judge("agent2", 11, b"x")
    assert (beyond.verdict, beyond.code) == (Verdict.REFUSE, "INVALID_ARGUMENT")
    assert ledger.judge("agent2", 10, b"x").verdict is Verdict.ACCEPT  # the final round
    with pytest.raises(ValueError, match="only moves forward"):
        ledger.advance(9)
    with pytest.raises(ValueError, match="keep"):
        RoundLedger(last=5, keep=0)


def test_every_ledger_draws_its_own_secret_digest_seed() -> None:
    """The key of the digests a ledger compares (efpsn/wire/rounds.py's round_digest) is drawn
    per ledger, in memory only like the digests; a given one must fit 64 bits unsigned."""
    seeds = {RoundLedger(last=10, keep=2).seed for _ in range(8)}
    assert len(seeds) == 8 and all(0 <= seed < 2**64 for seed in seeds)
    assert RoundLedger(last=10, keep=2, seed=2**64 - 1).seed == 2**64 - 1
    for bad in (-1, 2**64):
        with pytest.raises(ValueError, match="seed must be in"):
            RoundLedger(last=10, keep=2, seed=bad)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["judge", "advance"]), st.sampled_from(["a", "b"]),
                          st.integers(0, 40), st.sampled_from([b"1", b"2"])), max_size=80))
def test_the_ledger_agrees_with_a_model_of_its_rules(ops: list) -> None:
    """Against a plain model: what is accepted is what is new and in the window, a digest is
    remembered for `keep` rounds, and the memory never holds more than that."""
    ledger = RoundLedger(last=35, keep=3)
    model: dict[tuple[str, int], bytes] = {}
    position = 0
    for op, sender, r, digest in ops:
        if op == "advance":
            position = max(position, r)
            ledger.advance(position)
            model = {k: v for k, v in model.items() if k[1] >= position - 3}
            continue
        verdict = ledger.judge(sender, r, digest).verdict
        known = model.get((sender, r))
        if r > 35:
            expected = Verdict.REFUSE
        elif r < position:
            expected = Verdict.DUPLICATE if known == digest else Verdict.REFUSE
        elif r > position + 1:
            expected = Verdict.LATER
        elif known is None:
            expected = Verdict.ACCEPT
            model[(sender, r)] = digest
        else:
            expected = Verdict.DUPLICATE if known == digest else Verdict.REFUSE
        assert verdict is expected, (op, sender, r, digest, position)
    assert ledger.remembered() == len(model)


def test_phase_one_accepts_one_message_per_kind_and_neighbour_then_closes() -> None:
    ledger = PhaseOneLedger()
    assert ledger.judge("key", "agent2", b"k").verdict is Verdict.ACCEPT
    assert ledger.judge("key", "agent2", b"k").verdict is Verdict.DUPLICATE
    assert ledger.judge("key", "agent2", b"other").code == "INVALID_ARGUMENT"
    assert ledger.judge("shares", "agent2", b"s").verdict is Verdict.ACCEPT
    ledger.close()
    assert ledger.judge("shares", "agent2", b"s").verdict is Verdict.DUPLICATE
    late = ledger.judge("key", "agent5", b"k5")
    assert (late.verdict, late.code) == (Verdict.REFUSE, "FAILED_PRECONDITION")
    assert ledger.received() == {"key": {"agent2": b"k"}, "shares": {"agent2": b"s"}}
    with pytest.raises(ValueError, match="kind"):
        ledger.judge("rounds", "agent2", b"")


def test_a_restored_phase_one_acknowledges_only_what_the_previous_process_received() -> None:
    ledger = PhaseOneLedger()
    ledger.restore({"key": {"agent2": b"k"}, "shares": {"agent2": b"s"}})
    assert ledger.closed
    assert ledger.judge("key", "agent2", b"k").verdict is Verdict.DUPLICATE
    assert ledger.judge("shares", "agent2", b"t").verdict is Verdict.REFUSE


def test_a_one_round_memory_is_allowed_and_bounded() -> None:
    # keep = 1: the smallest memory; walking round by round, the ledger never holds more than
    # the remembered round and the two-round window per sender
    ledger = RoundLedger(last=500, keep=1)
    for t in range(400):
        for sender in ("agent1", "agent2"):
            assert ledger.judge(sender, t, bytes([t % 256])).verdict is Verdict.ACCEPT
        assert ledger.digest("agent1", t) == bytes([t % 256])
        ledger.advance(t + 1)
        assert ledger.remembered() <= 2 * (1 + 2), (t, ledger.remembered())
    assert ledger.digest("agent1", 399) == bytes([399 % 256])
    assert ledger.digest("agent1", 300) is None and ledger.digest("agent3", 399) is None
    # a forgotten round can no longer be compared: refused, not taken for a duplicate
    late = ledger.judge("agent1", 300, bytes([300 % 256]))
    assert (late.verdict, late.code) == (Verdict.REFUSE, "FAILED_PRECONDITION")


def test_refusals_name_the_round_and_the_sender() -> None:
    beyond = RoundLedger(last=10, keep=2).judge("agent1", 11, b"d")
    assert (beyond.verdict, beyond.code) == (Verdict.REFUSE, "INVALID_ARGUMENT")
    assert beyond.reason == "round 11 is beyond the run's last round 10"
    phase_one = PhaseOneLedger()
    assert phase_one.judge("key", "agent2", b"k1").verdict is Verdict.ACCEPT
    other = phase_one.judge("key", "agent2", b"k2")
    assert (other.verdict, other.code) == (Verdict.REFUSE, "INVALID_ARGUMENT")
    assert "a different key message from agent2 was already received" in other.reason
