"""Transport limits and gRPC channel/server options shared by the coordinator and the agents."""

from __future__ import annotations

# Largest gRPC message either end sends or accepts: 64 MiB.
#
# Why this is enough, with room to spare:
# * Phase II, largest payload: LeNet (13,426 parameters) under gradient tracking sends two float64
#   vectors per round, 2 * 13,426 * 8 B = 214,816 B (~215 kB); logistic regression (7,850
#   parameters) sends ~126 kB. Both are far below gRPC's 4 MiB default already.
# * Phase I, largest payload: one ciphertext per noise coefficient when slot packing is off. A
#   ciphertext lives mod n^2, i.e. 2 * key_bits bits: 768 B at 3072 bits, 2,048 B at 8192 bits.
#   Perturbing every LeNet parameter (N = 13,426) unpacked at 8192 bits is 13,426 * 2,048 B
#   ~ 27.5 MB (+ a few bytes of framing per ciphertext); 10.3 MB at 3072 bits. Packing divides
#   this by the number of slots per plaintext. gRPC's 4 MiB default would reject the unpacked case.
# 64 MiB covers the worst case above more than twice over. It is what a client may send or
# receive; servers take less (below).
MAX_MESSAGE_BYTES: int = 64 * 1024 * 1024

# What a server reads at most, before anything else is known: gRPC refuses a longer body from its
# length prefix (and a compressed one by its decompressed size) without buffering it. Servers
# read a body only after the caller's certificate is admitted (efpsn.wire.guard.add_service), and
# each method has its own, smaller cap derived from the run (agent.router.AgentService.admit).
# 16 MiB holds every phase II message (215 kB for LeNet under GT) and phase I unpacked at 3072
# bits for 13,426 coefficients (10.3 MB); larger phase I payloads need packing (the default).
AGENT_RECEIVE_BYTES: int = 16 * 1024 * 1024
COORDINATOR_RECEIVE_BYTES: int = 256 * 1024
# Requests that carry only a header or a name (GetRound, GetStatus, health checks).
SMALL_REQUEST_BYTES: int = 16 * 1024
# Calls one certificate name may have in flight at an agent (a neighbour needs two or three:
# a push, a pull after a restart, a status query); more wait their turn as UNAVAILABLE.
CALLS_IN_FLIGHT_PER_CALLER: int = 4

# Per-tensor caps, checked by serde before anything is allocated.
MAX_TENSOR_DIMS: int = 32
MAX_TENSOR_ELEMENTS: int = MAX_MESSAGE_BYTES // 4  # any tensor that fits in a message (float32)

# Big-integer caps: Paillier keys up to 16384 bits, ciphertexts (mod n^2) up to twice that.
MAX_KEY_BITS: int = 16384
MAX_CIPHERTEXT_BYTES: int = 2 * MAX_KEY_BITS // 8

# Keepalive: phase I key generation (seconds to minutes at large key sizes) and slow neighbours
# leave connections idle; client pings keep NATs and load balancers from dropping them.
KEEPALIVE_TIME_MS: int = 30_000  # client pings after 30 s without activity
KEEPALIVE_TIMEOUT_MS: int = 10_000  # and gives the connection up 10 s after an unanswered ping
# The server must tolerate the client's ping rate, else it answers GOAWAY "too_many_pings".
SERVER_MIN_PING_INTERVAL_MS: int = 10_000

GrpcOptions = list[tuple[str, int]]  # pragma: no mutate (a type alias, not behaviour)


def channel_options(*, max_message_bytes: int = MAX_MESSAGE_BYTES) -> GrpcOptions:
    """Options for grpc.aio.insecure_channel / secure_channel: message caps and keepalive."""
    _check_limit(max_message_bytes)
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),  # 0 = no cap on pings between data frames
    ]


def server_options(*, max_message_bytes: int = MAX_MESSAGE_BYTES) -> GrpcOptions:
    """Options for grpc.aio.server: message caps and a keepalive policy matching the channels."""
    _check_limit(max_message_bytes)
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 2 * KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", SERVER_MIN_PING_INTERVAL_MS),
        ("grpc.http2.max_pings_without_data", 0),
        # No SO_REUSEPORT: a second process (another user's, or a stale agent) must not be able to
        # bind our port next to us and receive half of our neighbours' connections.
        ("grpc.so_reuseport", 0),
    ]


def _check_limit(max_message_bytes: int) -> None:
    if isinstance(max_message_bytes, bool) or not isinstance(max_message_bytes, int):
        raise TypeError(f"max_message_bytes must be an int, got {type(max_message_bytes).__name__}")
    if not 0 < max_message_bytes < 2**31:
        raise ValueError(f"max_message_bytes must be in (0, 2^31), got {max_message_bytes}")


CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = tuple(channel_options())
SERVER_OPTIONS: tuple[tuple[str, int], ...] = tuple(server_options())
