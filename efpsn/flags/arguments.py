"""The run parameters as command-line flags, built from their declarations in
efpsn/params/config.py.

Every command that takes run parameters (simulate, up, coordinator, privacy, the experiments)
gets its flags here, with the same names, types, defaults and help. The flags' names, the folder
checks and the config's crossing to another process (one RunParameters message, never flags
rebuilt from it) are argparse-free: efpsn/flags/names.py.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from efpsn.flags.names import (
    config_from_values,
    environment_variable,
    flag_of,
    network_resolved,
)
from efpsn.params.config import PRESETS, Declaration, RunConfig, declarations, value_types

if TYPE_CHECKING:
    from efpsn.data.inspection import DataFolder

__all__ = ["add_run_arguments", "apply_environment", "config_from_args", "folder_of",
           "given_values", "network_config"]

_PARSERS: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str}


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


def given_values(args: argparse.Namespace) -> dict[str, Any]:
    """The run parameters the flags (or their environment variables) gave, by name."""
    names = {f.name for f in dataclasses.fields(RunConfig)}
    return {k: v for k, v in vars(args).items() if k in names}


def folder_of(args: argparse.Namespace) -> DataFolder | None:
    """The command's --data-dir folder inspected once (efpsn/data/inspection.py), with the
    flags that decide how (--label-column, --drop, and the run values given: task, classes,
    scale); None without --data-dir."""
    data_dir = getattr(args, "data_dir", None)
    if not data_dir:
        return None
    from efpsn.data.inspection import inspect_folder
    from efpsn.flags.names import check_flags_against_folder

    given, column = given_values(args), getattr(args, "label_column", None)
    return inspect_folder(data_dir, label_column=column,
                          drop=[c for text in getattr(args, "drop", None) or []
                                for c in text.split(",") if c.strip()], given=given,
                          before=lambda layout: check_flags_against_folder(
                              given, layout, label_column=column))


def config_from_args(args: argparse.Namespace, *, derived: dict[str, Any] | None = None,
                     resolve: bool = True, folder: DataFolder | None = None) -> RunConfig:
    """The RunConfig of the run flags given (efpsn.flags.names.config_from_values: flags, then
    the --data-dir folder, then `derived`, the preset and the defaults), with every seat of a
    --join late (the run parameter `late`). `folder`: the command's folder as inspected once
    (folder_of); inspected here when the parser has --data-dir and none is given."""
    if folder is None:
        folder = folder_of(args)
    config = config_from_values(given_values(args), folder=folder,
                                preset=getattr(args, "preset", None), derived=derived,
                                label_column=getattr(args, "label_column", None),
                                resolve=False)
    joins = getattr(args, "join", None)  # --join agentK@R (simulate, up): K's seat starts empty
    if joins:
        from efpsn.departure.joins import late_for

        config = config.replace(late=late_for(joins, config))
    return config.resolved() if resolve else config


def network_config(args: argparse.Namespace, *, folder: DataFolder | None = None) -> RunConfig:
    """The run as a network starts it (efpsn up, the coordinator): resolved by the step rule,
    except a scale standard run, whose l2 and hence step rule wait for the network's totals
    (every agent resolves it after the secure sum: agent/phases/secure_sum.py, as the simulator
    does); that one is checked by a trial resolution with the task's default l2 and sent as
    given."""
    return network_resolved(config_from_args(args, resolve=False, folder=folder))
