"""What `efpsn up` makes of the agents' results: network metrics, timings, and checks that the
run is whole (every agent finished the same run)."""

from __future__ import annotations

import math
import statistics
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from efpsn.jsonfile import read_json
from efpsn.params.config import RunConfig
from efpsn.params.schema import parse_shape


def network_timings(agents: dict[str, Any], *, started_at: float) -> dict[str, float]:
    """Start-up (from launch to the last agent's first round), phase I and phase II (slowest
    agent) from what the agents recorded."""
    timings = [a["timings"] for a in agents.values()]
    out = {
        "phase1_seconds": max(t.get("phase1_seconds", 0.0) for t in timings),
        "phase2_seconds": max(t.get("phase2_seconds", 0.0) for t in timings),
    }
    if all("cpu_seconds_per_round" in t for t in timings):
        out["agents_cpu_seconds_per_round"] = sum(t["cpu_seconds_per_round"] for t in timings)
    if all("max_rss_mb" in t for t in timings):
        out["agent_peak_rss_mb"] = max(t["max_rss_mb"] for t in timings)
    if all("pss_mb" in t for t in timings):  # memory actually used per agent (shared pages split)
        out["agent_pss_mb_median"] = statistics.median(t["pss_mb"] for t in timings)
        out["agents_pss_mb_total"] = sum(t["pss_mb"] for t in timings)
    if all("phase2_started_at" in t for t in timings):
        out["startup_seconds"] = max(t["phase2_started_at"] for t in timings) - started_at
    return out


def load_agent_results(folder: Path, names: list[str]) -> tuple[list[dict], list[Any]]:
    """Each agent's result.json and final iterate (model.npy, read without pickle) as tensors."""
    import numpy as np
    import torch

    results, xs = [], []
    for name in names:
        sub = folder / name
        results.append(read_json(sub / "result.json"))  # "nan" back to a float
        xs.append(torch.from_numpy(np.load(sub / "model.npy", allow_pickle=False)))
    return results, xs


def check_results(results: list[dict], *, iterations: int, early: bool = False,
                  ends: set[int] | None = None) -> list[str]:
    """What is wrong with the agents' results as one run (empty: nothing): every agent must
    report the same run and have finished its last round: `iterations`, or with the stop rule
    (`early`, efpsn/optimize/stopping.py) the same round at every agent, at most `iterations`;
    `ends`: the stop round and the check round of a departure's last window, or the cap and the
    rounds the waiting agents ended at after a departure too late to re-base
    (efpsn/departure/last_window.py)."""
    problems = []
    runs = sorted({str(r.get("run_id")) for r in results})
    if len(runs) != 1:
        problems.append(f"the agents report different runs: {', '.join(runs)}")
    rounds = [r.get("final", {}).get("round") for r in results]
    if ends is not None:
        return problems + [f"{r.get('name')} stopped at round {t}, neither of {sorted(ends)}"
                           for r, t in zip(results, rounds, strict=True) if t not in ends]
    last = rounds[0] if early and results else iterations
    if early and not (isinstance(last, int) and 1 <= last <= iterations):
        last = iterations
    for r, done in zip(results, rounds, strict=True):
        if done != last:
            problems.append(f"{r.get('name')} stopped at round {done} of {last}")
    return problems


def summarize(problem: Any, folder: Path, names: list[str], *, x_star: Any = None
              ) -> dict[str, Any]:
    """Network-level metrics of the agents' final iterates (same function as the simulator);
    x_star: the centralized optimum, for the deviation ||x_bar - x*|| (None: not reported)."""
    from efpsn.metrics import evaluate
    from efpsn.problem import average

    results, xs = load_agent_results(folder, names)
    x_bar = average(xs)
    save_average(problem, folder, x_bar)
    final = evaluate(problem, xs, x_star=x_star)
    return _summary(problem, results, final, x_bar)


def summarize_reports(problem: Any, folder: Path, names: list[str], *,
                      test_path: Path | None, label_column: str = "label") -> dict[str, Any]:
    """Agent-local data: what the agents reported (their own loss and accuracies), averaged,
    and the consensus and public-test accuracy of x_bar; never any private data. The network
    average x_bar is written as FOLDER/model.safetensors (the model to use)."""
    import numpy as np
    import torch

    from efpsn.data.local import check_arrays, read_data
    from efpsn.problem import average

    results, xs = load_agent_results(folder, names)
    finals = [r["final"] for r in results]
    x_bar = average(xs)
    problem, standardisation = _standardised_problem(problem, folder, names, results)
    save_average(problem, folder, x_bar, standardisation=standardisation)
    final: dict[str, float] = {
        "consensus": float(sum(torch.sum((x - x_bar) ** 2) for x in xs) / len(xs)),
        "mean_agent_loss": float(np.mean([f["loss"] for f in finals])),
        "mean_agent_accuracy": float(np.mean([f["accuracy"] for f in finals])),
    }
    held = [f["holdout_accuracy"] for f in finals if "holdout_accuracy" in f]
    if held:
        final["mean_holdout_accuracy"] = float(np.mean(held))
    if test_path is not None:  # public: the same file every agent was given
        c = problem.config
        raw = read_data(test_path, who="efpsn up", label_column=label_column,
                        classes=c.classes, table=c.table, regression=c.task.regression)
        test = check_arrays(raw.features, raw.labels, path=test_path, who="efpsn up",
                            shape=parse_shape(c.input_shape), classes=c.classes,
                            divisor=c.divisor, cells=raw.cells, regression=c.task.regression,
                            missing=raw.missing, fills=c.scale.standard)
        if standardisation is not None:  # as every agent standardised its copy
            from efpsn.stats.standardise import standardise_dataset

            test = standardise_dataset(test, *standardisation)
        final["accuracy"] = float(problem.task.accuracy(x_bar, test))
        if c.task.regression:
            final["r2"] = final["accuracy"]
        elif c.table.class_names:  # the classes by name: each one's share recognised
            final["accuracy_by_class"] = per_class_accuracy(problem.task, x_bar, test,
                                                            c.table.class_names)
    else:
        final["accuracy"] = final.get("mean_holdout_accuracy", math.nan)
    return _summary(problem, results, final, x_bar)


def per_class_accuracy(task: Any, x: Any, data: Any, names: tuple[str, ...]
                       ) -> dict[str, float | None]:
    """Each class's share of its test samples the model predicts right, by class name (None:
    the class has no sample in the set)."""
    predicted = task.predict(x, data.images).numpy()
    labels = data.labels.numpy()
    out: dict[str, float | None] = {}
    for k, name in enumerate(names):
        mine = labels == k
        out[name] = float((predicted[mine] == k).mean()) if mine.any() else None
    return out


def save_average(problem: Any, folder: Path, x_bar: Any, *,
                 standardisation: tuple[Any, Any] | None = None) -> Path:
    """The network's model, the average of the agents' final iterates, as
    FOLDER/model.safetensors (efpsn/tasks/model_io.py): usually better than any one agent's; with
    scale standard it carries the run's (mean, std) per feature."""
    from efpsn.tasks.model_io import MODEL_FILE, save_model

    return save_model(folder / MODEL_FILE, task=problem.task, x=x_bar,
                      scale=problem.config.scale, standardisation=standardisation,
                      table=problem.config.table)


def _standardised_problem(problem: Any, folder: Path, names: list[str], results: list[dict]
                          ) -> tuple[Any, tuple[Any, Any] | None]:
    """A scale standard run: the public problem of the run the agents resolved after the
    secure sum (their settings: l2 from the total count, the step rule's numbers) and the
    standardisation their models carry; otherwise `problem` as it is and None."""
    if not problem.config.scale.standard or not results:
        return problem, None
    import numpy as np

    from efpsn.problem import build_problem
    from efpsn.tasks.model_io import MODEL_FILE, read_model

    mean, std = read_model(folder / names[0] / MODEL_FILE).metadata.standardisation or ((), ())
    config = RunConfig.from_dict(results[0]["settings"])
    return (build_problem(config, local={}),
            (np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64)))


def format_reports(final: dict[str, float], *, public_test: bool,
                   score: str = "accuracy") -> str:
    """The final line of agent-local data; `score`: what "accuracy" measures (the task's
    score_name: accuracy, or R^2 for ridge)."""
    if public_test:
        parts = [f"test {score} {final['accuracy']:.4f} (x_bar, public test set)"]
    else:
        own = "the agents' own, on their held-out parts; no public test set"
        parts = [f"{score} {final['accuracy']:.4f} ({own})" if not math.isnan(final["accuracy"])
                 else f"{score} n/a (no test set, no held-out part)"]
    if public_test and "mean_holdout_accuracy" in final:
        parts.append(f"mean local holdout {score} {final['mean_holdout_accuracy']:.4f}")
    parts += [f"mean local loss {final['mean_agent_loss']:.4g}",
              f"consensus {final['consensus']:.3g}"]
    return ", ".join(parts)


def _edges(edges: list[list[int]]) -> tuple[tuple[int, int], ...]:
    """A graph's edges as result.json has them (`final_edges`), as Graph takes them."""
    return tuple(sorted((min(a, b), max(a, b)) for a, b in edges))


def _summary(problem: Any, results: list[dict], final: dict[str, float],
             x_bar: Any) -> dict[str, Any]:
    """summary.json: the network's final metrics, each agent's own, whether the run is whole,
    and whether it converged (efpsn/optimize/certificate.py, from the agents' own last-round
    measures)."""
    import numpy as np
    import torch

    from efpsn.optimize.certificate import Certifier
    from efpsn.optimize.driver import worst

    config = problem.config
    # a departure's re-base may have extended the cap (StopRule.rebased): the agents say so
    cap = max([config.iterations.total] + [int(e.get("cap", 0)) for r in results
                                           for e in [*r.get("departures", []),
                                                     *r.get("joins", [])]])
    window = next((e for r in results for e in r.get("departures", []) if "stopped" in e),
                  None)  # a departure in the stop's last window (efpsn/departure/last_window.py)
    capped = next((e for r in results for e in r.get("departures", []) if "capped" in e),
                  None)  # a departure too late to re-base: each agent ended where it waited
    ends = ({window["stopped"], window["check_round"]} if window is not None else
            {capped["capped"], *capped.get("ended", {}).values()} if capped is not None else None)
    problems = check_results(results, iterations=cap, early=not config.resolved().stop_every.never,
                             ends=ends)
    rounds = results[0]["final"].get("round") if results else None
    weights = problem.member_weights
    kept = sorted(int(r["index"]) for r in results)
    edges = {_edges(r["final_edges"]) for r in results if "final_edges" in r}
    if len(edges) > 1:
        problems.append("the agents ran their last rounds on different graphs")
    if any("joins" in r or "joined" in r for r in results):  # the members' last graph
        from efpsn.topology import Graph, metropolis_weights

        graph = Graph(problem.n, max(edges), name=problem.graph.name)
        weights = metropolis_weights(graph)[np.ix_(kept, kept)]
    elif any("departures" in r for r in results):  # the remaining agents' graph, re-based
        from efpsn.departure.membership import reconfigure

        weights = reconfigure(problem.graph, set(range(problem.n)) - set(kept)
                              ).remaining_weights()
    convergence = Certifier.for_run(config, weights)(
        worst([r["final"] for r in results]), x_bar_norm=float(torch.linalg.vector_norm(x_bar)),
        rounds=int(rounds) if isinstance(rounds, int | float) else None)
    bounds = [r["final"]["stop_certificate"] for r in results
              if "stop_certificate" in r["final"]]
    if window is not None and bounds:  # the window's certificate, which the finished hold
        from efpsn.departure.last_window import certified_line
        from efpsn.optimize.certificate import TARGET, Certificate

        convergence = Certificate(max(bounds), max(bounds) <= TARGET,
                                  certified_line(max(bounds), window["check_round"]))
    if capped is not None:  # no certificate of any round: say so, whatever the measures
        from efpsn.departure.last_window import capped_line
        from efpsn.optimize.certificate import Certificate

        convergence = Certificate(None, False, capped_line(int(capped["capped"])))
    from efpsn.optimize.stopping import StopRule
    from efpsn.params.tail import record
    from efpsn.privacy.modes import privacy_statement

    # the starting members' graph's (efpsn/params/tail.py)
    rule = StopRule.for_run(config, problem.member_weights)
    tail = record(rule.tail, mode=config.tail, algorithm=config.algorithm, gamma=config.gamma,
                  active=rule.active)
    return {
        "convergence": convergence.to_json(),
        **({} if tail is None else {"tails": tail}),
        "privacy": privacy_statement(problem.config, problem.graph).to_json(),
        "ok": not problems,
        "problems": problems,
        "settings": problem.config.to_dict(),
        "run_id": results[0]["run_id"],
        "final": final,
        "agents": {r["name"]: {"final": r["final"], "timings": r["timings"],
                               "cpus": r.get("cpus")} for r in results},
    }


def _public_problem(config: RunConfig, *, local: bool) -> tuple[Any, Any]:
    """The public problem and, for logistic regression on public data, x* (for the summary).
    With agent-local data only the public part (schema, model, basis) exists here."""
    from efpsn.problem import build_problem
    from efpsn.process.runtime import configure_threads

    configure_threads()
    problem = build_problem(config, local={} if local else None)
    if local or not problem.config.task.linear:
        return problem, None
    from efpsn.tasks.optimum import centralized_optimum

    return problem, centralized_optimum(problem.task, problem.shards).x


class ProblemBuild:
    """The public problem and x* for the summary, built in a thread of the launcher once the
    agents are in phase II (start()), or when first needed.

    Not earlier: on a small machine the build (torch, the data set, x*) would take CPU from the
    agents' start-up, which is the network's critical path, and nice cannot lower a thread
    below the agents when the kernel groups CPU time by session (autogroup; the agents run in
    sessions of their own)."""

    def __init__(self, config: RunConfig, *, local: bool) -> None:
        self._config, self._local = config, local
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="efpsn-up-problem")
        self._future: Future[tuple[Any, Any]] | None = None

    def start(self) -> Future[tuple[Any, Any]]:
        if self._future is None:
            self._future = self._pool.submit(_public_problem, self._config, local=self._local)
        return self._future

    def result(self) -> tuple[Any, Any]:
        return self.start().result()

    def raise_error(self) -> None:
        """Called when a child failed: if the public problem cannot be built (a bad run
        parameter, which every agent fails on too), raise that error, the one to report."""
        error = self.start().exception()  # waits for the build
        if error is not None:
            raise error

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def format_metrics(metrics: dict[str, float], *, score: str = "accuracy") -> str:
    """One line of a metrics record for a person: accuracy (`score`: R^2 for ridge), loss,
    optimality, consensus."""
    accuracy = metrics["accuracy"]
    parts = [f"{score} {accuracy:.4f}" if not math.isnan(accuracy)
             else f"{score} n/a (no test set, no held-out part)", f"loss {metrics['loss']:.4g}"]
    if "deviation" in metrics:
        parts.append(f"||x_bar - x*|| {metrics['deviation']:.3g}"
                     f" (relative {metrics['relative_deviation']:.3g})")
    parts.append(f"consensus {metrics['consensus']:.3g}")
    parts.append(f"||avg grad||^2 {metrics['grad_norm2']:.3g}")
    return ", ".join(parts)
