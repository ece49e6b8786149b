"""CPU of the step alone at the main job's shape: every agent's RoundDriver in one process.

    python benchmarks/bench_step.py --data-dir D [--rounds 600] [--skip 100] [--json OUT]
        [--params OUT.bin]

The defaults on D's private folders, as `efpsn up --data-dir D` runs them (agt, full batch,
the fading mask, the stop rule with its check windows and consensus tails), minus phase I's
cryptography (the masks come from efpsn.simulator.make_mask_providers with noise seed 0) and
minus the messages' transport: the agents step in lockstep and each takes its neighbours'
outboxes as its inbox (what efpsn/simulator.py does with clear messages). After `--skip`
rounds of warm-up, `--rounds` rounds are timed with time.process_time, one thread; the figure
is CPU ms per agent per round: the gradient, the mask and its perturbation, the mixing,
momentum and tracking updates, the stop rule's measures and every per-round Python object,
nothing else. `--params` writes every agent's final x (float64 bytes, agent order), so two
trees can be compared bit for bit (sha256 of the file); the sha256 is printed too.

Run it on two trees alternately with PYTHONPATH (the same venv):
    PYTHONPATH=/work/main python benchmarks/bench_step.py --data-dir D
    PYTHONPATH=. python benchmarks/bench_step.py --data-dir D
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

from efpsn.algorithms import make_algorithm
from efpsn.algorithms.base import StepContext
from efpsn.data.folders import load_data_dir
from efpsn.flags.arguments import add_run_arguments, config_from_args
from efpsn.flags.parser import add_data_dir_arguments
from efpsn.optimize.driver import RoundDriver
from efpsn.optimize.stopping import StopRule
from efpsn.params.schedules import make_schedule
from efpsn.problem import build_problem
from efpsn.process.runtime import configure_threads, machine_load
from efpsn.simulator import make_mask_providers


def drivers_for(data_dir: Path, agents: int, *, flags: Sequence[str] = (),
                only: int | None = None) -> list[RoundDriver]:
    """Every agent's RoundDriver of `efpsn up --data-dir D [flags]` (the defaults, resolved);
    with `only`, that agent's alone (benchmarks/bench_ring_floor.py: one per process)."""
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    add_data_dir_arguments(parser)
    args = parser.parse_args(["--data-dir", str(data_dir), "--agents", str(agents), *flags])
    config = config_from_args(args, resolve=False)
    local = load_data_dir(config, data_dir)
    config = config.resolved()
    problem = build_problem(config, local=local)
    providers = make_mask_providers(problem, noise_seed=0)
    algorithm = make_algorithm(config.algorithm, momentum=config.momentum.value)
    schedule = make_schedule(config.schedule, iterations=config.iterations.total)
    stop = StopRule.for_run(config, problem.weights)
    return [RoundDriver(algorithm=algorithm, schedule=schedule,
                        iterations=config.iterations.total, eval_every=config.eval_every,
                        x0=problem.initial_params(), stop=stop,
                        context=StepContext(agent=i, weights=problem.agent_weights(i),
                                            lr=schedule(0),
                                            oracle=problem.objective(i, providers[i])))
            for i in (range(problem.n) if only is None else [only])]


def lockstep(drivers: list[RoundDriver], rounds: int) -> int:
    """`rounds` synchronous rounds (fewer when the stop rule ends the run); the rounds run."""
    done = 0
    for _ in range(rounds):
        if any(d.done for d in drivers):
            break
        outboxes = [d.outbox for d in drivers]
        for i, d in enumerate(drivers):
            d.step({j: outboxes[j] for j in d.context.neighbours})
        done += 1
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--agents", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=600)
    parser.add_argument("--skip", type=int, default=100)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--params", type=Path)
    args = parser.parse_args()
    configure_threads()
    drivers = drivers_for(args.data_dir, args.agents)
    lockstep(drivers, args.skip)
    load_before = machine_load()
    start = time.process_time()
    rounds = lockstep(drivers, args.rounds)
    seconds = time.process_time() - start
    blob = b"".join(d.state["x"].numpy().tobytes() for d in drivers)
    if args.params is not None:
        args.params.write_bytes(blob)
    out = {"tree": os.environ.get("PYTHONPATH", ""), "rounds": rounds, "agents": len(drivers),
           "step_ms": seconds * 1e3 / (rounds * len(drivers)),
           "params_sha256": hashlib.sha256(blob).hexdigest(),
           "load": [load_before, machine_load()]}
    print(json.dumps(out))
    if args.json is not None:
        args.json.write_text(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
