"""The convex run at gamma = 1e3 through real gRPC agents, compared with the simulator."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from efpsn.experiments import accuracy_convex
from efpsn.experiments.common import Column, finish, format_table, log, output_dir, stopwatch
from efpsn.launch.network import launch_local_network
from efpsn.launch.summary import load_agent_results
from efpsn.problem import build_problem
from efpsn.simulator import run_simulation
from efpsn.tasks.optimum import centralized_optimum

NAME = "network-check"


@dataclass(frozen=True, kw_only=True)
class NetworkCheckSettings:
    """Which accuracy-convex profile's run to repeat over the network, and the key size.

    The run is that profile's main series (DSGD, batch 64, paper schedule) with the zero-sum
    masks at `gamma` and the sweep's noise seed, so the networked agents must reproduce the
    sweep's row bit for bit.
    """

    profile: str
    convex_profile: str
    gamma: float = 1e3
    key_bits: int = 3072
    iterations: int | None = None  # None: the convex profile's
    noise_seed: int | None = None  # None: the convex profile's


PROFILES: dict[str, NetworkCheckSettings] = {
    "full": NetworkCheckSettings(profile="full", convex_profile="full", key_bits=3072),
    "quick": NetworkCheckSettings(profile="quick", convex_profile="quick", key_bits=2048),
}


def settings_for(profile: str, **overrides: Any) -> NetworkCheckSettings:
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}: expected one of {sorted(PROFILES)}")
    changes = {k: v for k, v in overrides.items() if v is not None}
    s = dataclasses.replace(PROFILES[profile], **changes)
    return dataclasses.replace(s, profile=profile if not changes else f"{profile} (modified)")


def run(settings: NetworkCheckSettings, *, out: str | Path | None = None,
        figures_to: str | Path | None = None) -> dict[str, Any]:
    """Launch coordinator + agents locally, then rerun the same config in the simulator."""
    del figures_to  # no figures: this check is a table
    folder = output_dir(out, NAME)
    convex = accuracy_convex.settings_for(settings.convex_profile,
                                          iterations=settings.iterations,
                                          noise_seed=settings.noise_seed)
    config = accuracy_convex.network_config(convex, gamma=settings.gamma).replace(
        key_bits=settings.key_bits)
    noise_seed = convex.noise_seed
    with stopwatch() as elapsed:
        log(f"{NAME} ({settings.profile}): {config.agents} gRPC agents on a {config.topology}, "
            f"{config.task}, {config.algorithm}, batch {config.batch_size}, mask {config.mask}, "
            f"gamma {config.gamma:g}, {config.iterations.total} rounds, {config.key_bits}-bit Paillier")
        with stopwatch() as t_net:
            summary = launch_local_network(config, results=folder / "network", quiet=True,
                                           insecure_noise_seed=noise_seed)
        network_seconds = t_net()
        names = [f"agent{i + 1}" for i in range(config.agents)]
        _, xs_net = load_agent_results(folder / "network", names)
        problem = build_problem(config)
        x_star = centralized_optimum(problem.task, problem.shards).x
        with stopwatch() as t_sim:
            sim = run_simulation(config, protocol="fast", noise_seed=noise_seed, problem=problem,
                                 x_star=x_star)
        simulator_seconds = t_sim()
        rows: list[dict[str, Any]] = []
        for name, a, b in zip(names, xs_net, sim.xs, strict=True):
            diff = float((a - b).abs().max())
            rows.append({"agent": name, "max_abs_diff": diff, "bitwise_equal": bool(
                a.dtype == b.dtype and a.shape == b.shape and a.numpy().tobytes() ==
                b.numpy().tobytes())})
        metrics = ("accuracy", "loss", "deviation", "consensus", "grad_norm2")
        comparison = [{"metric": k, "network": summary["final"][k], "simulator": sim.final[k],
                       "abs_diff": abs(summary["final"][k] - sim.final[k])} for k in metrics]
        max_diff = max(r["max_abs_diff"] for r in rows)
        all_equal = all(r["bitwise_equal"] for r in rows)
        table = "\n".join([
            format_table(rows, [Column("agent", "agent"),
                                Column("max_abs_diff", "max abs(x_net − x_sim)", ".3g"),
                                Column("bitwise_equal", "bitwise equal")]),
            "",
            format_table(comparison, [Column("metric", "final metric"),
                                      Column("network", "gRPC network", ".6g"),
                                      Column("simulator", "simulator (fast)", ".6g"),
                                      Column("abs_diff", "abs diff", ".3g")]),
            "",
            (f"max abs diff of the final parameters over all agents: {max_diff:.3g} "
             f"({'bitwise equal' if all_equal else 'NOT bitwise equal'})"),
            (f"network {network_seconds:.0f} s (phase I with real {config.key_bits}-bit Paillier), "
             f"simulator {simulator_seconds:.0f} s"),
        ])
        payload = {
            "profile": settings.profile, "config": config.to_dict(), "noise_seed": noise_seed,
            "max_abs_diff": max_diff, "bitwise_equal": all_equal,
            "comparison": comparison, "network_seconds": network_seconds,
            "simulator_seconds": simulator_seconds,
            "agent_timings": {n: a["timings"] for n, a in summary["agents"].items()},
            "network_summary": str(folder / "network" / "summary.json"),
        }
        wall = elapsed()
    return finish(folder, NAME, payload=payload, rows=rows, table=table, figures=[],
                  wall_seconds=wall)
