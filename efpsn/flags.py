"""The run parameters as command-line flags, built from their declarations in efpsn/config.py.

Every command that takes run parameters (simulate, up, coordinator, privacy, the experiments)
gets its flags here, with the same names, types, defaults and help. A config goes to another
process as one RunParameters message (run_parameters_args), never as flags rebuilt from it.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from efpsn.config import (
    LOCAL_DATA,
    PRESETS,
    Declaration,
    RunConfig,
    declarations,
    parse_shape,
    value_types,
)
from efpsn.schema import STANDARD, check_standard_masks

if TYPE_CHECKING:
    from efpsn.datadir import DataDirLayout

__all__ = ["add_run_arguments", "apply_environment", "check_flags_against_folder",
           "config_from_args", "environment_variable", "flag_of", "network_config",
           "network_resolved", "run_parameter_variables", "run_parameters_args"]

_PARSERS: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str}


def flag_of(name: str, declared: Declaration) -> str:
    """The command-line flag of a run parameter: --NAME with dashes, unless declared."""
    return declared.flag or "--" + name.replace("_", "-")


def environment_variable(flag: str) -> str:
    """The environment variable of a run parameter's flag: --key-bits -> EFPSN_KEY_BITS."""
    return "EFPSN_" + flag.lstrip("-").replace("-", "_").upper()


def run_parameter_variables() -> tuple[str, ...]:
    """Every run parameter's environment variable (and EFPSN_PRESET's), in declaration order:
    what docker-compose.yml and the Swarm stack pass to the coordinator (`--from-environment`)."""
    return ("EFPSN_PRESET", *(environment_variable(flag_of(f.name, declared))
                              for f, declared in declarations()))


class _Refused(Exception):
    pass


class _EnvironmentParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _Refused(message)


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def apply_environment(args: argparse.Namespace, environ: Mapping[str, str]) -> list[str]:
    """Give every run parameter that no flag gave its value from its environment variable
    (run_parameter_variables; unset or empty: not given). Flags given win. Returns the variables
    used; ValueError names a variable whose value its flag would refuse."""
    parser = _EnvironmentParser(add_help=False)
    add_run_arguments(parser)
    flags = {"preset": "--preset", **{f.name: flag_of(f.name, d) for f, d in declarations()}}
    used = []
    for dest, flag in flags.items():
        variable = environment_variable(flag)
        text = environ.get(variable, "").strip()
        if not text or dest in vars(args):
            continue
        action = next(a for a in parser._actions if a.dest == dest)
        argv = [flag, text]
        if isinstance(action, argparse.BooleanOptionalAction):
            if text.lower() not in _TRUE + _FALSE:
                raise ValueError(f"{variable}={text!r}: expected true or false")
            argv = [flag if text.lower() in _TRUE else "--no-" + flag[2:]]
        try:
            parsed = parser.parse_args(argv)
        except _Refused as exc:
            raise ValueError(f"{variable}={text!r}: {exc}") from None
        setattr(args, dest, getattr(parsed, dest))
        used.append(variable)
    return used


def _argument_type(name: str, declared: Declaration, kind: Any) -> Callable[[str], Any]:
    # a value without a declared parse stays text here: RunConfig parses it, once
    convert = declared.parse or (_PARSERS[kind] if isinstance(kind, str) else str)

    def parse(text: str) -> Any:
        try:
            return convert(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None  # argparse names the flag

    parse.__name__ = name  # argparse names the parameter in its messages
    return parse


def add_run_arguments(parser: argparse.ArgumentParser, *,
                      only: Iterable[str] | None = None,
                      title: str = "run parameters (public, identical at every agent)",
                      show_defaults: bool = True) -> None:
    """Add the run parameters (all, or the `only` ones) as flags with their declared help; a
    flag not given stays absent from the namespace, so config_from_args can tell a default
    from a choice. Also --preset (PRESETS). show_defaults=False: the caller's defaults are not
    RunConfig's (e.g. an experiment's profile)."""
    wanted = None if only is None else set(only)
    group = parser.add_argument_group(title)
    if wanted is None:
        group.add_argument("--preset", choices=sorted(PRESETS), default=argparse.SUPPRESS,
                           help="a named set of run parameters (flags given explicitly win): "
                                + "; ".join(f"{name}: " + ", ".join(f"{k} {v}" for k, v in
                                                                    values.items())
                                            for name, values in PRESETS.items()))
    for f, declared in declarations():
        if wanted is not None and f.name not in wanted:
            continue
        kind = value_types().get(f.name) or (f.type if isinstance(f.type, str)
                                             else f.type.__name__)
        shown = declared.show(f.default) if declared.show else f.default
        options: dict[str, Any] = {"default": argparse.SUPPRESS, "dest": f.name,
                                   "help": f"{declared.help} (default {shown})"
                                   if show_defaults else declared.help}
        if kind == "bool":
            options["action"] = argparse.BooleanOptionalAction
        else:
            options["type"] = _argument_type(f.name, declared, kind)
            if declared.choices:
                options["choices"] = declared.choices
                options["type"] = str
            options["metavar"] = f.name.upper() if not declared.choices else None
        group.add_argument(flag_of(f.name, declared), **options)


def config_from_args(args: argparse.Namespace, *, derived: dict[str, Any] | None = None,
                     resolve: bool = True) -> RunConfig:
    """The RunConfig of the run flags given. Precedence: flags given, then a --data-dir folder
    (when the parser has it: data "local", its agent count, DIR/schema.json's schema), then
    `derived`, then the preset, then RunConfig's defaults; then the step rule where it was asked for
    (RunConfig.resolved: --schedule auto, iterations 0, a negative momentum) unless `resolve`
    is False (a run whose l2 waits for the network's sample count: efpsn/standardise.py)."""
    names = {f.name for f in dataclasses.fields(RunConfig)}
    given = {k: v for k, v in vars(args).items() if k in names}
    values: dict[str, Any] = dict(PRESETS.get(getattr(args, "preset", ""), {}))
    values.update(derived or {})
    data_dir = getattr(args, "data_dir", None)
    if data_dir:
        from efpsn.datadir import inspect_data_dir

        # the folder implies data "local", the agent count, its schema.json's fields, and
        # what its files agree on for the schema's fields neither flags nor schema.json give
        layout = inspect_data_dir(data_dir)
        label_column = getattr(args, "label_column", None)
        check_flags_against_folder(given, layout, label_column=label_column)
        values.update(_folder_values(layout, given, label_column))
    elif ("input_shape" in given or "classes" in given) and "data" not in given:
        values["data"] = LOCAL_DATA  # a schema of one's own and no data set named: local data
    values.update(given)
    config = RunConfig(**values)
    return config.resolved() if resolve else config


def network_config(args: argparse.Namespace) -> RunConfig:
    """The run as a network starts it (efpsn up, the coordinator): resolved by the step rule,
    except a scale standard run, whose l2 and hence step rule wait for the network's totals
    (every agent resolves it after the secure sum: agent/secure_sum.py, as the simulator does);
    that one is checked by a trial resolution with the task's default l2 and sent as given."""
    return network_resolved(config_from_args(args, resolve=False))


def network_resolved(config: RunConfig) -> RunConfig:
    """network_config's rule on a config already built (the coordinator's --run-parameters)."""
    if config.scale != STANDARD:
        return config.resolved()
    check_standard_masks(config.scale, mask=config.mask, refresh=config.refresh)
    config.resolved()  # the step rule's own checks fail here, in one line, not in the agents
    return config


def check_flags_against_folder(given: dict[str, Any], layout: DataDirLayout, *,
                               label_column: str | None = None) -> None:
    """ValueError, one line naming the flag, the folder and the fix, for a flag given with
    --data-dir that the folder contradicts (a run that would fail, or leave a party out: the
    agent count, the data, the schema, a graph of another size) or
    makes meaningless (a flag that would be silently ignored). --scale may differ from
    schema.json's: a public preprocessing of one's choice (with a step size of one's own)."""
    root, count = layout.root, layout.agents
    if "agents" in given and given["agents"] != count:
        raise ValueError(
            f"--agents {given['agents']} disagrees with --data-dir {root}: it holds {count} "
            f"agent folders (agent1..agent{count}), one per party; drop --agents (the folder "
            f"sets the count), or add or remove agent folders")
    if "data" in given and given["data"] != LOCAL_DATA:
        raise ValueError(
            f"--data {given['data']} disagrees with --data-dir {root}: with --data-dir every "
            f"agent reads its own folder; drop --data, or drop --data-dir to use "
            f"{given['data']}")
    if "topology" in given:
        from efpsn.topology import build_graph

        try:
            build_graph(given["topology"], count, seed=given.get("seed", 0))
        except ValueError as exc:
            raise ValueError(f"--topology {given['topology']} on the {count} agent folders of "
                             f"--data-dir {root}: {exc}") from None
    schema = layout.schema
    if ("input_shape" in given and schema.input_shape is not None
            and parse_shape(given["input_shape"]) != parse_shape(schema.input_shape)):
        raise ValueError(
            f"--input-shape {given['input_shape']} disagrees with {root}/schema.json "
            f"(input_shape {schema.input_shape}); drop --input-shape (the folder's schema "
            f"applies), or correct schema.json")
    if "classes" in given and schema.classes is not None and given["classes"] != schema.classes:
        raise ValueError(
            f"--classes {given['classes']} disagrees with {root}/schema.json (classes "
            f"{schema.classes}); drop --classes (the folder's schema applies), or correct "
            f"schema.json")
    for name, instead in (("partition", "each agent's folder is its part"),
                          ("test_fraction", ("the public test set is the folder's test "
                                             "file, and --holdout sets each agent's held-out "
                                             "part"))):
        if name in given:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} cuts one data set by index; with --data-dir {root} "
                             f"{instead}: drop {flag}")
    if label_column is not None and layout.format != "csv":
        raise ValueError(f"--label-column {label_column} names a column of .csv files, but "
                         f"--data-dir {root} holds train.{layout.format} (labels in y): drop "
                         f"--label-column")


def _folder_values(layout: DataDirLayout, given: dict[str, Any],
                   label_column: str | None) -> dict[str, Any]:
    from efpsn.folder_schema import folder_run_values

    values: dict[str, Any] = layout.run_values()
    shape = (("--input-shape", given["input_shape"]) if "input_shape" in given else
             ("schema.json's input_shape", layout.schema.input_shape)
             if layout.schema.input_shape else None)
    values.update(folder_run_values(
        layout.root, layout.files, layout.test, label_column=layout.label_column(label_column),
        input_shape=None if shape is None else (shape[1], shape[0]),
        classes=given.get("classes", layout.schema.classes),
        scale=given.get("scale", layout.schema.scale)))
    return values


def run_parameters_args(config: RunConfig, folder: Path) -> list[str]:
    """The coordinator's flags for `config`: `--run-parameters FILE` with the run written to
    folder/run-parameters.pb as one efpsn.v1.RunParameters message, the form the coordinator
    hands on to the agents (the config crosses each process boundary once, not as flags)."""
    from efpsn.wire.records import encode_run_parameters

    Path(folder).mkdir(parents=True, exist_ok=True)
    path = Path(folder) / "run-parameters.pb"
    path.write_bytes(encode_run_parameters(config.to_dict()))
    return ["--run-parameters", str(path)]
