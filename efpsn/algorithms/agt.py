"""Accelerated gradient tracking: gradient tracking with Nesterov's extrapolation, on the lazy
mixing matrix W' = (I + W) / 2."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

from efpsn.algorithms.base import (
    AgentState,
    Message,
    Received,
    StepContext,
    check_inbox,
    float64_arrays,
    mix,
)


def lazy(ctx: StepContext) -> StepContext:
    """The same context on W' = (I + W) / 2: w'_ii = (1 + w_ii) / 2, w'_ij = w_ij / 2 (exact
    float operations, the same at every agent and in the simulator)."""
    weights = {j: (w + 1.0) / 2 if j == ctx.agent else w / 2 for j, w in ctx.weights.items()}
    return StepContext(agent=ctx.agent, weights=weights, lr=ctx.lr, oracle=ctx.oracle)


class AcceleratedTracking:
    """Nesterov gradient tracking (one exchange per round; send z and y):

        x^{t+1} = sum_j w'_ij z_j^t - alpha y^t
        z^{t+1} = x^{t+1} + beta (x^{t+1} - x^t)
        y^{t+1} = sum_j w'_ij y_j^t + g(z^{t+1}) - g(z^t),   z^0 = x^0, y^0 = g(z^0).

    As in gradient tracking, sum_i y_i^t = sum_i g_i(z_i^t) for every t (W' is doubly
    stochastic), so at the fixed point every agent sits at a zero of sum_i grad f_hat_i =
    sum_i grad f_i: the zero-sum perturbation cancels exactly, at any gamma. With
    beta = (1 - q) / (1 + q), q = sqrt(alpha mu) (mu the strong convexity, the L2 weight), the
    average converges at rate 1 - q instead of gradient tracking's 1 - alpha mu
    (efpsn/params/step_rule.py derives alpha, beta and the rounds from public quantities only).
    beta = 0 is gradient tracking on W'.
    """

    name = "agt"
    state_keys = ("x", "z", "y", "g")
    message_keys = ("y", "z")

    def __init__(self, momentum: float = 0.0) -> None:
        if not (math.isfinite(momentum) and 0.0 <= momentum < 1.0):
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        self.momentum = momentum
        # lazy(ctx) of the contexts seen last (a RoundDriver passes one object while its
        # context and step size hold), by identity: id -> (ctx, lazy(ctx)); a few agents share
        # one algorithm in the simulator
        self._lazy: dict[int, tuple[StepContext, StepContext]] = {}

    def mixing(self, ctx: StepContext) -> StepContext:
        """The weights the step mixes with (lazy(ctx), built once per context object: a
        context's weights are never changed in place, a new context is made instead)."""
        held = self._lazy.get(id(ctx))
        if held is None or held[0] is not ctx:
            if len(self._lazy) >= 256:
                self._lazy.clear()
            held = (ctx, lazy(ctx))
            self._lazy[id(ctx)] = held
        return held[1]

    def init(self, x0: torch.Tensor, ctx: StepContext, *, t: int = 0
             ) -> tuple[AgentState, Message]:
        x = x0.clone()
        g = ctx.oracle(x, t)
        state = AgentState(t=t, tensors={"x": x, "z": x, "y": g.clone(), "g": g})
        return state, {"y": state["y"], "z": x}

    def step(
        self, state: AgentState, inbox: Mapping[int, Received], ctx: StepContext
    ) -> tuple[AgentState, Message]:
        check_inbox(inbox, ctx, self.message_keys)
        w = self.mixing(ctx)
        own = {"z": state["z"], "y": state["y"]}
        x_next = mix("z", own, inbox, w)
        arrays = float64_arrays([x_next, state["x"], state["y"], state["g"]])
        if arrays is None:  # torch's operations (not float64 vectors)
            x_next = x_next - ctx.lr * state["y"]
            z_next = x_next + self.momentum * (x_next - state["x"])
            g_next = ctx.oracle(z_next, state.t + 1)
            y_next = mix("y", own, inbox, w) + (g_next - state["g"])
        else:  # the same operations in place, numpy (base.float64_arrays: the same bits)
            xn, x, y, g = arrays
            scratch = np.multiply(y, ctx.lr)
            np.subtract(xn, scratch, out=xn)  # x' = mix(z) - lr y
            zn = np.subtract(xn, x)
            zn *= self.momentum
            np.add(xn, zn, out=zn)  # z' = x' + beta (x' - x)
            z_next = torch.from_numpy(zn)
            g_next = ctx.oracle(z_next, state.t + 1)
            y_next = mix("y", own, inbox, w)
            fresh = float64_arrays([y_next, g_next, state["g"]])
            if fresh is None:  # an oracle that gives something else: torch's operations
                y_next = y_next + (g_next - state["g"])
            else:
                np.subtract(fresh[1], g, out=scratch)
                np.add(fresh[0], scratch, out=fresh[0])  # y' = mix(y) + (g' - g)
        nxt = AgentState(t=state.t + 1, tensors={"x": x_next, "z": z_next, "y": y_next,
                                                 "g": g_next})
        return nxt, {"y": y_next, "z": z_next}

    def tail_step(self, kind: str, state: AgentState, inbox: Mapping[int, Received],
                  ctx: StepContext, *, lazy_mixing: bool) -> tuple[AgentState, Message]:
        """One step of a consensus tail (efpsn/params/tail.py), mixing with W (W' when
        `lazy_mixing`); every kind keeps sum_i y_i = sum_i g_i:

            mix:      z' = sum_j w_ij z_j, x' = x + (z' - z), y' = sum_j w_ij y_j
            gradient: y' = sum_j w_ij y_j + g(z) - g, g' = g(z)     (x, z unchanged)
            track:    y' = sum_j w_ij y_j                           (x, z, g unchanged)

        the gradient at the mixed points z with round t + 1's mask, as agt's step. x moves
        with z, so z - x keeps the momentum beta (x^a - x^{a-1}) of the round before the
        tail: after a tail that certified nothing agt resumes with its velocity (a restart
        from zero cost more rounds than the tails saved). The tail's model is z
        (RoundDriver ends a certified tail with x = z)."""
        check_inbox(inbox, ctx, self.message_keys)
        w = self.mixing(ctx) if lazy_mixing else ctx
        own = {"z": state["z"], "y": state["y"]}
        x, z, g = state["x"], state["z"], state["g"]
        y = mix("y", own, inbox, w)
        if kind == "mix":
            mixed = mix("z", own, inbox, w)
            x, z = x + (mixed - z), mixed
        elif kind == "gradient":
            g_next = ctx.oracle(z, state.t + 1)
            y, g = y + (g_next - g), g_next
        elif kind != "track":
            raise ValueError(f"a tail step is mix, gradient or track, got {kind!r}")
        nxt = AgentState(t=state.t + 1, tensors={"x": x, "z": z, "y": y, "g": g})
        return nxt, {"y": y, "z": z}
