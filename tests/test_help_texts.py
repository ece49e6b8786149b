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
    assert len(examples) == 6
    for example in examples:
        args = parser.parse_args(shlex.split(example)[1:])
        assert callable(args.handler), example


def test_the_version_is_the_installed_packages() -> None:
    assert version_text() == f"efpsn {version('efpsn')}"
