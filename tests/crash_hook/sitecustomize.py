"""Tests only: make an agent SIGKILL itself on reaching a round, like a power cut.

A process started with this folder on PYTHONPATH and CRASH_AT_ROUND=T (or NAME:T, for agent
NAME only; NAME1,NAME2:T for each of them; several such specs joined by ";", e.g.
"agent3:600!;agent4:1482!", each agent its own round) dies when it is about to exchange its
round-T message, before it sends anything for
that round (T = keys or shares: in phase I, before it sends its public key or its shares;
shares1: after its shares reached its first neighbour, before any other got them; adopt: after
phase I and its departures were saved, before phase II adopts them; stats:
before its round-1 message of the secure sum's flood; rejoin-keys, rejoin-shares: in a new
edge's seed exchange after a departure, before it sends its key or its shares for the edge),
so a test knows its newest checkpoint exactly (no race between a kill from outside
and a checkpoint write). The agent's code knows nothing of it: this module wraps
agent.exchange.RoundLink.exchange as that module is imported (the fork server's children
inherit the wrapped class). tests/localnet.py's crash_at() gives the environment.

T~ (a round followed by "~"): instead of dying, it sends itself SIGTERM there, as an operator
who withdraws the party on purpose does (its own signal handling stops it, exit 130), and
sends nothing more.

T! (a round followed by "!"): it dies only once every neighbour's round-T message has come
(each of them then holds its round T-1 message, without which it could not have computed
round T): the departure round is T whatever the timing, where plain T leaves T-1 when a
message of round T-1 written to a stream had not reached a neighbour yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.abc
import importlib.util
import os
import signal
import sys
from typing import Any

_SPEC = os.environ.get("CRASH_AT_ROUND", "")
_MODULE = "agent.exchange"
# this process's agent name (`adopt` has no object that knows it); a forked agent (efpsn up's
# fork server) has the server's command line: give that hook to `efpsn agent` processes only
_NAME = next((b for a, b in zip(sys.argv, sys.argv[1:]) if a == "--name"), "")


def _wrap_stats(module: Any, who: str) -> None:
    """`stats`: die before sending round 1 of the secure sum's flood (scale standard: its
    round-0 message, its masked statistics, went out)."""
    send = module.Peers.send

    async def crashing(self: Any, name: str, method: str, request: Any, **kwargs: Any) -> Any:
        if method == "PutStats" and request.header.round == 1 and (
                not who or self.options.name in who.split(",")):
            os.kill(os.getpid(), signal.SIGKILL)
        return await send(self, name, method, request, **kwargs)

    module.Peers.send = crashing


def _wrap_shares_to_one(module: Any, who: str) -> None:
    """`shares1`: deliver the phase I shares to the first neighbour (by name) only, then die
    before sending them to any other: it dies while sending its shares."""
    send = module.Peers.send
    first: list[Any] = []  # the future of the one delivery let through

    async def crashing(self: Any, name: str, method: str, request: Any, **kwargs: Any) -> Any:
        if method != "PutShares" or (who and self.options.name not in who.split(",")):
            return await send(self, name, method, request, **kwargs)
        if name == min(self._session().addresses) and not first:
            first.append(asyncio.get_running_loop().create_future())
            try:
                return await send(self, name, method, request, **kwargs)
            finally:
                first[0].set_result(None)
        while not first:  # the first neighbour's send has not started yet
            await asyncio.sleep(0.01)
        await first[0]
        os.kill(os.getpid(), signal.SIGKILL)

    module.Peers.send = crashing


def _wrap_rejoin(module: Any, who: str, at: str) -> None:
    """`rejoin-keys` / `rejoin-shares`: die before sending a new edge's key / shares (a
    phase I message with the re-base round in its header, agent/departure/new_edges.py)."""
    send = module.Peers.send
    method = {"rejoin-keys": "PutPublicKey", "rejoin-shares": "PutShares"}[at]

    async def crashing(self: Any, name: str, called: str, request: Any, **kwargs: Any) -> Any:
        if called == method and request.header.round > 0 and (
                not who or self.options.name in who.split(",")):
            os.kill(os.getpid(), signal.SIGKILL)
        return await send(self, name, called, request, **kwargs)

    module.Peers.send = crashing


def _wrap_adopt(module: Any, who: str) -> None:
    """`adopt`: die when phase II is about to save the departures decided in phase I as
    adopted (agent/departure/silence.py's Silence.adopt): after phase I's result and its decisions
    were saved, before its first round."""
    save = module.save

    def crashing(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("adopted", True) and (not who or _NAME in who.split(",")):
            os.kill(os.getpid(), signal.SIGKILL)
        return save(*args, **kwargs)

    module.save = crashing


def _wrap_phase_one(module: Any, who: str, at: str) -> None:
    """`keys`: die before sending the phase I public key; `shares`: before sending the
    shares (its key went out, so the neighbours wait for its shares)."""
    if at == "stats":
        _wrap_stats(module, who)
        return
    if at == "shares1":
        _wrap_shares_to_one(module, who)
        return
    if at == "adopt":
        _wrap_adopt(module, who)
        return
    if at.startswith("rejoin-"):
        _wrap_rejoin(module, who, at)
        return
    method = {"keys": "send_public_key", "shares": "send_shares"}[at]
    send = getattr(module.Peers, method)

    async def crashing(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not who or self.options.name in who.split(","):
            os.kill(os.getpid(), signal.SIGKILL)
        return await send(self, *args, **kwargs)

    setattr(module.Peers, method, crashing)


def _wrap(module: Any, who: str, at: int | str) -> None:
    if isinstance(at, str) and not at.endswith(("!", "~")):
        _wrap_phase_one(module, who, at)
        return
    settled = isinstance(at, str) and at.endswith("!")  # after the neighbours' round-T messages
    stopped = isinstance(at, str) and at.endswith("~")  # SIGTERM: the operator stops it
    round_ = int(str(at).rstrip("!~"))
    exchange = module.RoundLink.exchange

    async def crashing(self: Any, t: int, message: Any, *, final: bool = False) -> Any:
        if not final and t == round_ and (not who or self.name in who.split(",")):
            if stopped:  # the agent's own handler stops it; nothing of round t is sent
                os.kill(os.getpid(), signal.SIGTERM)
                await asyncio.sleep(3600)
            if settled:
                with contextlib.suppress(Exception):  # it dies all the same
                    await self.delivered()
                    await self.peers.collect("round", t, timeout=self.timeout)
            os.kill(os.getpid(), signal.SIGKILL)  # no handler runs, nothing is flushed
        return await exchange(self, t, message, final=final)

    module.RoundLink.exchange = crashing


class _Wrapper(importlib.abc.MetaPathFinder):
    """Finds agent.exchange (agent.peers) as usual, then wraps it right after it is executed."""

    def __init__(self, specs: list[tuple[str, int | str]]) -> None:
        self.specs = specs

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)  # the ordinary finders, once
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            for who, at in self.specs:
                _wrap(module, who, at)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _parse(text: str) -> tuple[str, int | str]:
    who, _, at = text.rpartition(":")
    return who, int(at) if at.isdigit() else at


if _SPEC:
    _specs = [_parse(part) for part in _SPEC.split(";")]
    if any(at == "adopt" for _, at in _specs):  # phase I's departures saved
        _MODULE = "agent.departure.records"
    elif any(isinstance(at, str) and not at.endswith(("!", "~")) for _, at in _specs):
        _MODULE = "agent.peers"  # a phase I step (keys, shares): the client side's method
    if _MODULE in sys.modules:
        for _who, _at in _specs:
            _wrap(sys.modules[_MODULE], _who, _at)
    else:
        sys.meta_path.insert(0, _Wrapper(_specs))
