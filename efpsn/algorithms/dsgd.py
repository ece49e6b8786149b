"""Decentralized SGD (the paper's phase II): x_i <- sum_j w_ij x_j - alpha_t g_i(x_i)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from efpsn.algorithms.base import (
    AgentState,
    Message,
    Received,
    StepContext,
    check_inbox,
    mix,
)


class DSGD:
    """Adapt-then-combine-free DSGD: combine neighbours' iterates, then take a local gradient step.

    With a decaying step size the iterates reach consensus; with any finite step the local
    iterates differ slightly, which is where EFPSN's residual error at large gamma comes from.
    """

    name = "dsgd"
    state_keys = ("x",)
    message_keys = ("x",)

    def mixing(self, ctx: StepContext) -> StepContext:
        """The weights the step mixes with."""
        return ctx

    def init(self, x0: torch.Tensor, ctx: StepContext, *, t: int = 0
             ) -> tuple[AgentState, Message]:
        x = x0.clone()
        return AgentState(t=t, tensors={"x": x}), {"x": x}

    def step(
        self, state: AgentState, inbox: Mapping[int, Received], ctx: StepContext
    ) -> tuple[AgentState, Message]:
        check_inbox(inbox, ctx, self.message_keys)
        x = state["x"]
        g = ctx.oracle(x, state.t)
        x_next = mix("x", {"x": x}, inbox, ctx) - ctx.lr * g
        return AgentState(t=state.t + 1, tensors={"x": x_next}), {"x": x_next}
