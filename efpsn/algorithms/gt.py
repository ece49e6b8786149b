"""Gradient tracking (DIGing): exact convergence with a constant step size."""

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


class GradientTracking:
    """DIGing (Nedic, Olshevsky, Shi 2017):

        x_i^{t+1} = sum_j w_ij x_j^t - alpha y_i^t
        y_i^{t+1} = sum_j w_ij y_j^t + g_i(x_i^{t+1}) - g_i(x_i^t),   y_i^0 = g_i(x_i^0).

    Because W is doubly stochastic, sum_i y_i^t = sum_i g_i(x_i^t) for every t, so at the fixed
    point every agent sits at a zero of sum_i grad f_hat_i = sum_i grad f_i: the zero-sum
    perturbation cancels exactly and accuracy no longer depends on gamma.
    """

    name = "gt"
    state_keys = ("x", "y", "g")
    message_keys = ("x", "y")

    def mixing(self, ctx: StepContext) -> StepContext:
        """The weights the step mixes with."""
        return ctx

    def init(self, x0: torch.Tensor, ctx: StepContext, *, t: int = 0
             ) -> tuple[AgentState, Message]:
        x = x0.clone()
        g = ctx.oracle(x, t)
        state = AgentState(t=t, tensors={"x": x, "y": g.clone(), "g": g})
        return state, {"x": x, "y": state["y"]}

    def step(
        self, state: AgentState, inbox: Mapping[int, Received], ctx: StepContext
    ) -> tuple[AgentState, Message]:
        check_inbox(inbox, ctx, self.message_keys)
        own = {"x": state["x"], "y": state["y"]}
        x_next = mix("x", own, inbox, ctx) - ctx.lr * state["y"]
        g_next = ctx.oracle(x_next, state.t + 1)
        y_next = mix("y", own, inbox, ctx) + (g_next - state["g"])
        nxt = AgentState(t=state.t + 1, tensors={"x": x_next, "y": y_next, "g": g_next})
        return nxt, {"x": x_next, "y": y_next}
