"""A neighbour's received round message: read-only views of the received bytes (no copy), which
a write cannot change, and on which every step computes what it computes on the sender's own
tensors, bit for bit (efpsn/wire/rounds.py parse_round, efpsn/algorithms/base.py)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from efpsn.algorithms import make_algorithm
from efpsn.algorithms.base import StepContext, as_tensor, difference, float64_arrays
from efpsn.optimize.driver import progress
from efpsn.optimize.stopping import CEILING, FLOOR, STOP_KEY
from efpsn.wire.rounds import encode_round, parse_round, round_digest
from efpsn.wire.v1 import agent_pb2

SHAPES = {"y": (4,), "z": (4,)}
RING5 = {i: ((i - 1) % 5, (i + 1) % 5) for i in range(5)}
WEIGHTS = {i: {i: 0.4, **{j: 0.3 for j in RING5[i]}} for i in range(5)}


def _received(message: dict[str, torch.Tensor], *, sender: str = "a", round_: int = 0,
              shapes: dict[str, tuple[int, ...]] = SHAPES) -> dict[str, np.ndarray]:
    """`message` as a neighbour receives it: encoded, parsed from the bytes, checked."""
    data = encode_round(message, run_id="r", sender=sender, round_=round_)
    return parse_round(agent_pb2.RoundMessage.FromString(data), run_id="r", senders={sender},
                       shapes=shapes, seed=7).tensors


def _owner(array: np.ndarray) -> object:
    """The object whose memory `array` looks at (the end of its chain of bases)."""
    base: object = array
    while isinstance(base, np.ndarray):
        base = base.base
    return base


def test_a_received_tensor_is_a_read_only_view_and_a_write_raises() -> None:
    # prepare
    y = torch.linspace(-1.0, 1.0, 4, dtype=torch.float64)
    message = {"y": y, "z": -y, STOP_KEY: torch.tensor([FLOOR, 0, 3, CEILING])}
    # execute
    got = _received(message)
    # assert: views of the bytes protobuf handed over (no array owns a copy), read-only
    for name in ("y", "z"):
        array = got[name]
        assert array.dtype == np.float64 and not array.flags.owndata
        assert isinstance(_owner(array), bytes)
        assert not array.flags.writeable
        before = array.tobytes()
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 0.0
        with pytest.raises(ValueError, match="read-only"):
            array += 1.0
        with pytest.raises(ValueError, match="read-only"):
            np.multiply(array, 2.0, out=array)
        with pytest.raises(ValueError):
            array.setflags(write=True)  # the bytes under it are immutable
        assert array.tobytes() == before
    assert got["y"].tolist() == y.tolist() and got["z"].tolist() == (-y).tolist()
    assert got[STOP_KEY].tolist() == [FLOOR, 0, 3, CEILING]
    with pytest.raises(ValueError, match="read-only"):
        got[STOP_KEY][0] = 1
    # what a step gets from it: the same read-only array for numpy, a copy for torch
    assert float64_arrays([got["y"], y])[0] is got["y"]
    copied = as_tensor(got["y"])
    copied.add_(1.0)  # torch has no read-only tensors: as_tensor copies
    assert got["y"].tolist() == y.tolist()


def test_a_received_digest_is_round_digest_of_the_message() -> None:
    """parse_round's digest (its tensors' heads kept per run name and shape) is round_digest
    of the same message, for one message, the next with the same names, and another."""
    for round_, (a, b) in enumerate([("y", "z"), ("y", "z"), ("u", "v")]):
        values = torch.arange(5, dtype=torch.float64) * (round_ + 1)
        data = encode_round({a: values, b: -values}, run_id="r", sender="a", round_=round_)
        pb = agent_pb2.RoundMessage.FromString(data)
        record = parse_round(pb, run_id="r", senders={"a"}, shapes={a: (5,), b: (5,)}, seed=9)
        assert record.digest == round_digest(pb, seed=9)
        assert record.digest != round_digest(pb, seed=10)


def test_the_received_bytes_live_as_long_as_the_views() -> None:
    values = torch.arange(4, dtype=torch.float64) / 3
    data = encode_round({"y": values, "z": values * 2}, run_id="r", sender="a", round_=1)
    pb = agent_pb2.RoundMessage.FromString(data)
    arrays = parse_round(pb, run_id="r", senders={"a"}, shapes=SHAPES, seed=7).tensors
    del pb, data
    gc.collect()
    junk = [bytes(range(256)) * 4 for _ in range(1000)]  # reuse freed memory, if any was
    assert arrays["y"].tobytes() == values.numpy().tobytes()
    assert arrays["z"].tobytes() == (values * 2).numpy().tobytes()
    assert len(junk) == 1000


@pytest.mark.parametrize("name", ["dsgd", "gt", "agt"])
def test_steps_on_received_arrays_equal_steps_on_the_senders_tensors(name: str) -> None:
    """Five agents on a ring, two runs: one hands each agent its neighbours' tensors (the
    simulator), the other what the wire delivers (read-only arrays). Every state and message
    agrees bit for bit, and no step changed a received byte."""
    algorithm = make_algorithm(name, momentum=0.3)
    keys = algorithm.message_keys
    shapes = {k: (4,) for k in keys}
    gen = torch.Generator().manual_seed(3)
    centers = [torch.randn(4, generator=gen, dtype=torch.float64) for _ in range(5)]
    ctxs = [StepContext(agent=i, weights=WEIGHTS[i], lr=0.2,
                        oracle=lambda x, t, c=centers[i]: (x - c) * (1 + t % 3))
            for i in range(5)]
    x0 = torch.zeros(4, dtype=torch.float64)
    direct = [algorithm.init(x0, c) for c in ctxs]
    wired = [algorithm.init(x0, c) for c in ctxs]
    for t in range(12):
        outs = [m for _, m in wired]
        received = [_received(outs[j], sender=f"a{j}", round_=t, shapes=shapes)
                    for j in range(5)]
        kept = [{k: v.tobytes() for k, v in r.items()} for r in received]
        stepped_direct, stepped_wired = [], []
        for i in range(5):
            inbox_direct = {j: direct[j][1] for j in RING5[i]}
            inbox_wired = {j: received[j] for j in RING5[i]}
            stepped_direct.append(algorithm.step(direct[i][0], inbox_direct, ctxs[i]))
            stepped_wired.append(algorithm.step(wired[i][0], inbox_wired, ctxs[i]))
            mixing = algorithm.mixing(ctxs[i])
            assert (progress(direct[i][0], stepped_direct[i][0], inbox_direct, mixing)
                    == progress(wired[i][0], stepped_wired[i][0], inbox_wired, mixing))
        direct, wired = stepped_direct, stepped_wired
        for i in range(5):
            for key in algorithm.state_keys:
                assert _bits(direct[i][0][key]) == _bits(wired[i][0][key]), (t, i, key)
        assert [{k: v.tobytes() for k, v in r.items()} for r in received] == kept


@pytest.mark.parametrize("kind", ["mix", "gradient", "track"])
def test_a_tail_step_on_received_arrays_equals_one_on_tensors(kind: str) -> None:
    algorithm = make_algorithm("agt", momentum=0.5)
    ctx = StepContext(agent=0, weights={0: 0.5, 1: 0.25, 4: 0.25}, lr=0.1,
                      oracle=lambda x, t: 2.0 * x - 1.0)
    state, _ = algorithm.init(torch.linspace(0, 1, 4, dtype=torch.float64), ctx)
    messages = {j: {"y": torch.full((4,), 0.1 * j, dtype=torch.float64),
                    "z": torch.linspace(-j, j, 4, dtype=torch.float64)} for j in (1, 4)}
    inbox = {j: _received(m, round_=0) for j, m in messages.items()}
    direct = algorithm.tail_step(kind, state, messages, ctx, lazy_mixing=True)
    wired = algorithm.tail_step(kind, state, inbox, ctx, lazy_mixing=True)
    for key in algorithm.state_keys:
        assert _bits(direct[0][key]) == _bits(wired[0][key])
    assert all(not a.flags.writeable for m in inbox.values() for a in m.values())


def test_difference_of_received_and_own_is_torch_subtraction() -> None:
    a = torch.tensor([1.0, 1e-300, -0.0, 3.0], dtype=torch.float64)
    b = torch.tensor([1.0 / 3, 2e-300, 0.0, -1e300], dtype=torch.float64)
    got = _received({"y": a, "z": b})
    assert _bits(difference(got["y"], b)) == _bits(a - b)
    assert _bits(difference(b, got["y"])) == _bits(b - a)
    assert _bits(difference(a.to(torch.float32), got["z"])) == _bits(a.to(torch.float32) - b)


def _bits(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().numpy().tobytes()
