"""Just enough of grpc.aio.ServicerContext to call a servicer's method in process: its peer,
auth context, deadline and metadata, and an abort that records the code and details."""

from __future__ import annotations

from typing import Any

import grpc


class FakeContext:
    """A caller on loopback: `auth` its TLS auth context ({}: none, an insecure channel),
    `remaining` the seconds its deadline leaves."""

    def __init__(self, auth: dict[str, list[bytes]] | None = None, *,
                 remaining: float = 5.0) -> None:
        self._auth = {} if auth is None else auth
        self._remaining = remaining
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self.trailing: tuple = ()

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth

    async def abort(self, code: grpc.StatusCode, details: str = "",
                    trailing_metadata: tuple = ()) -> None:
        self.code, self.details = code, details
        raise grpc.aio.AbortError(details)

    def time_remaining(self) -> float:
        return self._remaining

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def invocation_metadata(self) -> tuple:
        return ()

    def set_trailing_metadata(self, metadata: tuple) -> None:
        self.trailing = tuple(metadata)


def assigned_coordinator(config: Any, *, run_id: str = "r1") -> Any:
    """A coordinator service (no server) whose run `config` has every agent registered
    (agent1..agentN at 127.0.0.1:5001..), so its methods can be called with a FakeContext."""
    from coordinator.registry import Registry
    from coordinator.service import CoordinatorService

    registry = Registry(config, run_id=run_id)
    for i in range(config.agents):
        registry.register(f"agent{i + 1}", f"127.0.0.1:{5001 + i}")
    return CoordinatorService(registry, register_timeout=5.0)
