"""One EFPSN agent from start to results: serve, run the pipeline, close.

The rooms are wired once (agent/assembly.py); the pipeline (agent/pipeline.py) runs the phases
in order. This module only decides where the agent is reached: a restart rebinds the port its
neighbours know and is checked before anything is served (agent/resume.py).
"""

from __future__ import annotations

import logging
from typing import Any

from agent.assembly import assemble, serve
from agent.concurrency import to_completion
from agent.options import AgentFailure, AgentOptions
from agent.pipeline import Pipeline
from agent.resume import check_resumable
from agent.state import StateError
from efpsn.wire.net import Server, split_address, write_port_file

__all__ = ["AgentFailure", "AgentNode", "AgentOptions"]

log = logging.getLogger("efpsn.agent")


class AgentNode:
    """Drives one agent from registration to results. Transport at the edges; math in the core."""

    def __init__(self, options: AgentOptions) -> None:
        self.options = options
        self.parts = parts = assemble(options)  # agent/assembly.py: the one wiring
        self.pipeline = Pipeline(
            options=options, life=parts.status.life, store=parts.store, peers=parts.peers,
            outbox=parts.outbox, rejections=parts.rejections, phase_one=parts.phase_one,
            secure_sum=parts.secure_sum, phase_two=parts.phase_two,
            membership=parts.membership)
        self.server: Server | None = None

    @property
    def timings(self) -> dict[str, float]:
        return self.pipeline.timings

    async def run(self) -> dict[str, Any]:
        """Serve, register (or resume), mask, optimise, write results. Returns the result."""
        opts, store = self.options, self.parts.store
        try:
            saved = store.load_assignment()
        except StateError as exc:
            raise AgentFailure(str(exc)) from None
        listen = opts.listen
        if saved is not None:
            check_resumable(saved, name=opts.name, store=store)
            host, port = split_address(listen)
            if port == 0:  # rebind the port neighbours know
                listen = f"{host}:{saved.port}"
        self.server = await serve(self.parts, listen)
        write_port_file(opts.port_file, self.server.port)
        try:
            return await self.pipeline.run(saved, address=self._advertised,
                                           port=self.server.port)
        finally:
            await to_completion(self._close())

    async def _close(self) -> None:
        """Close my streams and channels, stop the server (its grace period lets in-flight
        calls end; the neighbours' round streams end with it)."""
        try:
            await self.parts.peers.close()
        finally:
            assert self.server is not None
            await self.server.stop(grace=0.5)

    def _advertised(self) -> str:
        if self.options.advertise:
            return self.options.advertise
        host, _, _ = self.options.listen.rpartition(":")
        if host in ("0.0.0.0", "[::]", ""):
            raise ValueError(
                f"--listen {self.options.listen} binds every interface: give --advertise HOST:PORT"
            )
        assert self.server is not None
        return f"{host}:{self.server.port}"
