"""What a run protects, in one line: its mode, against whom, the worst attack measured on that mode
and the accountant's epsilon where one exists (`efpsn simulate`, `efpsn up` and every agent print
it before the convergence line; summary.json and --json carry it under `privacy`).

A mode is what the run parameters make of the masks: the default (every parameter perturbed,
`--refresh fading`), differential privacy (`--preset dp`: DSGD, fresh masks every round,
per-sample clipping), the paper's fixed mask (`--preset paper`, or `--refresh never`), masks
refreshed every R > 1 rounds, a selection that leaves parameters unperturbed, and no mask. The
numbers are measurements (efpsn/experiments/attack.py, docs/RESULTS.md names the commands, the
machine's load and the images): PSNR in dB of the best reconstruction of a neighbour's private
training image by the strongest attacker measured on the mode, logistic regression and LeNet,
at the largest measured gamma not above the run's; for a ridge run (a numeric target) instead
the relative error of one private table row reconstructed by the best of the tabular
many-round attackers on diabetes (efpsn/experiments/attack_rounds.py), against the mean guess,
and the output's floor. "any gamma": the attacker removes the mask
exactly, so gamma does not matter.

Against whom. One curious neighbour of agent i sees x_i every round and i's messages; it holds
the seeds of its own edge with i but not those of i's other edges. All of i's neighbours
together hold every seed of i's mask: they remove it exactly, in every mode (the accountant's
"neighbours" attacker). So does the only neighbour of an agent with one neighbour; the line
names such agents.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from efpsn.params.schema import STANDARD_DISCLOSURE

if TYPE_CHECKING:
    from efpsn.params.config import RunConfig
    from efpsn.topology import Graph

__all__ = ["MEASURED", "Measured", "PrivacyStatement", "basis_counts", "mode_of",
           "privacy_statement", "refreshed_arguments"]

ANY_GAMMA = 0.0  # a measured worst that holds at every gamma (the attacker removes the mask)


@dataclass(frozen=True)
class Measured:
    """The worst measured PSNR (dB) per model, by gamma (ANY_GAMMA: every gamma), the attackers
    that were run, and where the measurement is written up."""

    name: str
    attackers: tuple[str, ...]
    logreg: dict[float, float]
    lenet: dict[float, float]
    source: str
    broken: str = ""  # why a neighbour recovers images whatever gamma (empty: not broken)
    caveat: str = ""  # a measured attack the mode does not stop, short of BROKEN
    # ridge (a numeric target), by gamma: (the best many-round attacker's mean relative error
    # ||x_hat - x|| / ||x|| of one private sample, the others' mean guess's); RIDGE_SOURCE
    ridge: dict[float, tuple[float, float]] = field(default_factory=dict)
    ridge_note: str = ""  # why nothing was measured on ridge in this mode

    def worst_ridge(self, gamma: float) -> tuple[float, float, float] | None:
        """(error, guess's error, at gamma) at the largest measured gamma <= `gamma`; None
        where nothing was measured at or below it."""
        if ANY_GAMMA in self.ridge:
            return (*self.ridge[ANY_GAMMA], ANY_GAMMA)
        below = [g for g in self.ridge if g <= gamma * (1 + 1e-9)]
        return (*self.ridge[max(below)], max(below)) if below else None

    def worst(self, gamma: float) -> dict[str, tuple[float, float] | None]:
        """{model: (dB, at gamma)} at the largest measured gamma <= `gamma` (ANY_GAMMA first);
        None where nothing was measured at or below it."""
        out: dict[str, tuple[float, float] | None] = {}
        for model, table in (("logreg", self.logreg), ("lenet", self.lenet)):
            if ANY_GAMMA in table:
                out[model] = (table[ANY_GAMMA], ANY_GAMMA)
                continue
            below = [g for g in table if g <= gamma * (1 + 1e-9)]
            out[model] = (table[max(below)], max(below)) if below else None
        return out


_DIFFERENCING = ("plain iDLG", "2 rounds", "3 rounds", "mean of rounds")
MEASURED: dict[str, Measured] = {
    "fading": Measured(
        name="every parameter perturbed, masks fading at the algorithm's rate",
        attackers=_DIFFERENCING + ("late", "all rounds", "regression"),
        # LeNet: its mini-batch default (the fresh part floored), at rounds 50, 700 and 1,900
        logreg={1e3: 12.8, 1e6: 13.0}, lenet={1e3: 5.4},
        source="docs/RESULTS.md section 7, 'Attackers that use many or late rounds', and "
               "'Neural networks on mini-batches'",
        ridge={1e3: (0.16, 1.0), 1e6: (0.45, 1.0)},
        caveat="on tabular data a model-aware regression reconstructs one private sample "
               "better than guessing (wine: 0.17 against 0.265), as the exact model alone "
               "does (0.17: no exact method prevents it)"),
    "fixed": Measured(
        name="the paper's fixed mask",
        attackers=_DIFFERENCING[:2] + ("drops the perturbed coordinates",),
        logreg={ANY_GAMMA: 124.0}, lenet={ANY_GAMMA: 46.8},
        ridge={1e3: (6.5e-7, 1.0), 1e6: (4.9e-7, 1.0)},
        source="docs/RESULTS.md section 7, 'The attack, with every parameter perturbed'",
        broken="the mask is the same every round, so two rounds' difference cancels it (K = 1)"),
    "fixed-k2": Measured(
        name="a fixed mask with K >= 2",
        attackers=_DIFFERENCING[:3],
        logreg={ANY_GAMMA: 40.6}, lenet={10.0: 3.4, 1e4: 3.3},
        ridge_note="ridge not measured in this mode: its runs diverge on ridge (diabetes, "
                   "gamma 1e3: NaN before the cap), so there was nothing to attack",
        source="docs/RESULTS.md section 7, 'The attack, with every parameter perturbed'",
        broken="the mask is the same every round: three rounds cancel a K = 2 perturbation"),
    "every:R": Measured(
        name="masks refreshed every R > 1 rounds",
        attackers=("2 rounds in a period", "mean of rounds"),
        logreg={ANY_GAMMA: 124.8}, lenet={ANY_GAMMA: 53.3},
        ridge={1e3: (1.5e-12, 1.0), 1e6: (1.3e-12, 1.0)},
        source="docs/RESULTS.md section 7, 'Masks refreshed every R rounds'",
        broken="two rounds of one period cancel the period's mask (K = 1)"),
    "partial": Measured(
        name="a selection that leaves parameters unperturbed",
        attackers=("drops the perturbed coordinates",),
        logreg={ANY_GAMMA: 101.5}, lenet={ANY_GAMMA: 51.9},
        ridge={1e3: (3.5e-7, 1.0), 1e6: (1.1e-8, 1.0)},
        source="docs/RESULTS.md section 7, 'The attack, with every parameter perturbed' "
               "(mean over 6 images; up to 119.7 dB)",
        broken="the unperturbed parameters' gradient is exact, and it alone recovers the image"),
    "every:1": Measured(
        name="fresh masks every round",
        attackers=_DIFFERENCING,
        logreg={1.0: 60.5, 100.0: 40.8, 1e4: 21.0, 2e4: 18.1, 3e4: 16.2, 3.5e4: 11.2,
                4e4: 10.5, 5e4: 10.5, 1e5: 10.5, 1e6: 10.5},
        lenet={1.0: 23.3, 100.0: 5.3, 1e4: 5.3, 3.5e4: 5.3, 4e4: 5.3, 1e5: 5.3, 1e6: 5.3},
        ridge={1e3: (0.31, 1.0), 1e6: (0.34, 1.0)},
        source="docs/RESULTS.md section 7, 'Masks refreshed every R rounds' and 'The frontier'"),
    "none": Measured(
        name="no mask",
        attackers=("plain iDLG",),
        logreg={ANY_GAMMA: 124.1}, lenet={ANY_GAMMA: 52.6},
        ridge={ANY_GAMMA: (6.3e-7, 1.0)},
        source="docs/RESULTS.md section 4",
        broken="nothing is masked: the gradients travel as they are"),
}


def mode_of(config: RunConfig) -> str:
    """The MEASURED key of a run's masks."""
    if config.mask == "none":
        return "none"
    refresh = config.refresh
    partial = config.selection.kind != "all"
    if not refresh.refreshed:
        return "fixed" if config.K <= 1 or partial else "fixed-k2"
    if refresh.accumulates and refresh.every != 1:
        return "every:R"
    if partial:
        return "partial"
    return "fading" if refresh.fading else "every:1"


@dataclass(frozen=True)
class PrivacyStatement:
    """One run's privacy: its mode, the measured worst attack, epsilon, and warnings."""

    mode: str
    name: str
    against: str
    worst: dict[str, tuple[float, float] | None]
    attackers: tuple[str, ...]
    source: str
    epsilon: float | None
    epsilon_note: str
    warnings: tuple[str, ...] = field(default_factory=tuple)
    task: str = "logreg"  # ridge: the line gives the ridge measurements
    ridge: tuple[float, float, float] | None = None  # (error, the guess's, at gamma)
    ridge_note: str = ""  # nothing measured on ridge in this mode, and why

    def line(self) -> str:
        """The one line a run ends with (before its convergence line)."""
        def shown(model: str) -> str:
            value = self.worst.get(model)
            if value is None:
                return f"{model} not measured at this gamma"
            db, gamma = value
            return f"{model} {db:.1f} dB" + (" (any gamma)" if gamma == ANY_GAMMA
                                              else f" (gamma {gamma:g})")
        eps = (f"epsilon {self.epsilon:.3g} per sample ({self.epsilon_note})"
               if self.epsilon is not None and math.isfinite(self.epsilon)
               else f"no epsilon ({self.epsilon_note})")
        head = "privacy: BROKEN: " if any(w.startswith("BROKEN") for w in self.warnings) \
            else "privacy: "
        warn = "".join(f"; {w.removeprefix('BROKEN: ')}" for w in self.warnings)
        if self.task == "ridge":
            if self.ridge is None:
                worst = self.ridge_note or "ridge not measured at this gamma in this mode"
            else:
                err, guess, gamma = self.ridge
                at = "any gamma" if gamma == ANY_GAMMA else f"gamma {gamma:g}"
                worst = (f"ridge: one private sample recovered to a relative error of "
                         f"{err:.2g} ({at}), the mean guess's {guess:.2g}")
            return (f"{head}{self.name}; against {self.against}: worst measured attack "
                    f"{worst}; {eps}{warn}; see {self.source} and {RIDGE_SOURCE}")
        return (f"{head}{self.name}; against {self.against}: worst measured attack "
                f"{shown('logreg')}, {shown('lenet')} PSNR; {eps}{warn}; see {self.source}")

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "name": self.name, "against": self.against,
                "worst_psnr_db": {m: None if v is None else {"psnr_db": v[0],
                                                             "gamma": v[1] or "any"}
                                  for m, v in self.worst.items()},
                **({} if self.task != "ridge" else {"worst_ridge": None if self.ridge is None
                    else {"relative_error": self.ridge[0], "guess": self.ridge[1],
                          "gamma": self.ridge[2] or "any"}}),
                "attackers": list(self.attackers), "source": self.source,
                "epsilon": self.epsilon, "epsilon_note": self.epsilon_note,
                "warnings": list(self.warnings), "line": self.line()}


def _epsilon(config: RunConfig) -> tuple[float | None, str]:
    """The per-sample accountant's epsilon where the run has one (DSGD with masks fresh every
    round, every parameter, clipped, a batch size), else None and why not."""
    refresh = config.refresh
    if config.mask != "zero-sum":
        return None, "the masks are not zero-sum"
    if refresh.fading:
        return None, "the fresh noise fades; protection measured by attacks"
    if not refresh.accumulates or refresh.every != 1:
        return None, "the mask repeats across rounds"
    if config.clip <= 0:
        return None, "per-sample gradients are not clipped"
    if config.batch.full:
        return None, ("full batch: the accountant needs the agent's own sample count "
                      "(efpsn privacy --samples N, on that agent's machine)")
    from efpsn.privacy.accounting import account_refreshed
    result = account_refreshed(gamma=config.gamma,
                               **refreshed_arguments(config, delta=1e-5))
    return (result.epsilon if math.isfinite(result.epsilon) else None,
            "delta 1e-5, one curious neighbour, dp-accounting" if math.isfinite(result.epsilon)
            else result.reason)


def privacy_statement(config: RunConfig, graph: Graph, *, with_epsilon: bool = True,
                      messages: str = "clear") -> PrivacyStatement:
    """The statement of a (resolved) run on its graph (`messages`: "aggregate" for secure
    neighbourhood aggregation, efpsn/masks/aggregation.py). Seats that are empty (late ones
    not joined yet) are isolated vertices of `graph`: the statement is of its members' graph;
    a run with seats that join later says what a join changes."""
    mode = mode_of(config)
    members = [i for i in range(graph.n) if graph.degree(i) > 0] or list(range(graph.n))
    warnings: list[str] = []
    measured = MEASURED[mode]
    ridge = config.task.regression
    if measured.broken:
        warnings.append(f"BROKEN: {measured.broken}")
    if ridge:
        warnings.append(RIDGE_FLOOR)
    elif measured.caveat:
        warnings.append(measured.caveat)
    lonely = [i + 1 for i in range(graph.n) if graph.degree(i) == 1]
    if lonely and mode != "none":
        warnings.append(f"agent{'s' if len(lonely) > 1 else ''} "
                        f"{', '.join(f'agent{i}' for i in lonely)} "
                        f"{'have' if len(lonely) > 1 else 'has'} a single neighbour, which "
                        "holds every seed of its mask and removes it")
    if config.scale.standard:  # the named disclosure of features in any units
        warnings.append(STANDARD_DISCLOSURE)
    agreed = config.table.disclosure()
    if agreed is not None:  # the class names and categories agreed from the parties' tables
        warnings.append(agreed)
    if messages == "aggregate":
        warnings.append(_aggregate_warning(graph))
    if mode != "none" and _has_tails(config, graph.induced(members)):
        warnings.append(TAIL_WARNING)
    if config.late and mode != "none":
        warnings.append(JOIN_NOTE)
    epsilon, note = _epsilon(config) if with_epsilon else (None, "not computed")
    return PrivacyStatement(
        mode=mode, name=measured.name,
        against=("one curious neighbour (not all of an agent's neighbours together: they hold "
                 "every seed of its mask)" if mode != "none" else "nobody"),
        worst=measured.worst(config.gamma), attackers=measured.attackers,
        source=measured.source, epsilon=epsilon, epsilon_note=note,
        warnings=tuple(warnings), task="ridge" if ridge else "logreg",
        ridge=measured.worst_ridge(config.gamma) if ridge else None,
        ridge_note=measured.ridge_note)


RIDGE_SOURCE = "docs/RESULTS.md, 'Ridge: the tabular attackers'"
RIDGE_FLOOR = ("on ridge the exact model alone gives one private sample away, to 1e-14, to "
               "anyone who knows the other parties' data or only their pooled rows (diabetes; "
               "no exact method prevents it)")


JOIN_NOTE = ("a party that joins (--late-seats): from the round it joins its new neighbours see "
             "its masked iterates, as neighbours see every party's; its mask is its new edges' "
             "seeds (exchanged under Paillier then), whose fresh part fades from the join's "
             "round as phase I's does from round 0; measured with one private row and every "
             "round of the joiner granted (joins at rounds 200 and 500), the best many-round "
             "attacker reaches 0.11-0.12 relative error on wine (0.18 for a party there from "
             "the start; the others' mean 0.265) and 0.18-0.22 on breast cancer (0.24; mean "
             "0.286); no statistic is recomputed (the run's feature scales are public; "
             "docs/RESULTS.md, 'A party that joins')")

TAIL_WARNING = ("consensus tails (efpsn/params/tail.py): in a tail's mixing rounds a neighbour also "
                "learns the tracker of each agent two hops away, as that agent's own neighbours "
                "do every round; measured on wine, the many-round regressions gain nothing at "
                "gamma 1e3 over the same rounds without tails, but reach 0.16 against 0.19-0.24 at "
                "gamma 1e6 (docs/RESULTS.md, 'The consensus tail in the protocol'; --tail off)")


def _has_tails(config: RunConfig, graph: Graph) -> bool:
    """Whether the run tries consensus tails (agt under the stop rule, on a graph with room)."""
    from efpsn.optimize.stopping import StopRule
    from efpsn.topology import metropolis_weights

    tail = StopRule.for_run(config, metropolis_weights(graph)).tail
    return tail is not None and bool(tail.starts)


def _aggregate_warning(graph: Graph) -> str:
    """What secure aggregation adds: who still sees whose message (receivers of degree 1)."""
    from efpsn.masks.aggregation import unprotected

    bare = unprotected({i: graph.neighbours(i) for i in range(graph.n)})
    named = ", ".join(f"agent{i + 1} to agent{j + 1}" for i, j in bare)
    return ("messages aggregated per receiver (each neighbour learns only its neighbourhood's "
            "weighted sum; a receiver with its other neighbours recovers one neighbour's message); "
            + (f"sent unmasked to a receiver with one neighbour: {named}; " if bare else "")
            + "the tabular regression still beats guessing (wine: 0.20 against 0.265)")


def basis_counts(config: RunConfig) -> tuple[int, int]:
    """(m, N) as the run would derive them; a user's model is built to count its parameters."""
    m, n_functions = config.basis_counts()
    if m is not None and n_functions is not None:
        return m, n_functions
    from efpsn.problem import build_task

    task = build_task(config)
    m, n_functions = config.basis_counts(num_params=task.num_params,
                                         last_bias=len(task.last_bias_indices()))
    if m is None or n_functions is None:
        raise ValueError(f"selection {str(config.selection)!r} needs m (the number of parameters to "
                         "perturb)")
    return m, n_functions


def refreshed_arguments(config: RunConfig, *, delta: float, attacker: str = "neighbour",
                        samples: int | None = None) -> dict[str, Any]:
    """The keyword arguments of efpsn.privacy.accounting.account_refreshed (all but gamma) for a
    run: its graph, noise decay, basis, model size, refresh, rounds, clip and batch."""
    from efpsn.problem import build_task
    from efpsn.topology import build_graph

    m, n_functions = basis_counts(config)
    if config.batch.full and samples is None:
        raise ValueError("the run takes the full local batch (the default): the per-sample "
                         "accountant needs --samples N (an agent's own sample count; it stays "
                         "on this machine) or the run's --batch-size B")
    return {
        "graph": build_graph(config.topology, config.agents, seed=config.seed), "p": config.p,
        "K": config.K, "m": m, "N": n_functions,
        "num_params": _num_params(config, build_task),
        "measure": config.selection.measure,
        "refresh": config.refresh, "iterations": config.iterations.total,
        "clip": config.clip or None, "batch_size": config.batch.size,
        "delta": delta, "attacker": attacker, "samples": samples}


def _num_params(config: RunConfig, build_task: Any) -> int:
    from efpsn.params.model_sizes import parameter_count
    from efpsn.params.schema import parse_shape

    counted = parameter_count(config.task, shape=parse_shape(config.input_shape),
                              classes=config.classes)
    return counted if counted is not None else build_task(config).num_params
