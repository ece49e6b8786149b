"""The run parameters as the outside names them, and what is checked before a network starts.

Torch-free and argparse-free, so the launcher, the coordinator, the compose file and the
notebook use it as the command line does (efpsn/flags/arguments.py builds the flags): a
parameter's flag and environment variable, the run's config from the values given and a
--data-dir folder inspected once (config_from_values), the rule a network resolves a run by, a
folder's agreement with the values given, the networked key policy, and the config's one
crossing to the coordinator (a RunParameters file).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from efpsn.params.checks import LOCAL_DATA
from efpsn.params.config import Declaration, RunConfig, declarations
from efpsn.params.schema import STANDARD, check_standard_masks, parse_shape
from efpsn.params.table import TableSchema

if TYPE_CHECKING:
    from efpsn.data.folders import DataDirLayout
    from efpsn.data.inspection import DataFolder

__all__ = ["check_flags_against_folder", "check_key_policy", "config_from_values",
           "environment_variable", "flag_of", "network_resolved", "run_parameter_variables",
           "run_parameters_args", "run_values_by_name"]


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


def network_resolved(config: RunConfig) -> RunConfig:
    """network_config's rule on a config already built (the coordinator's --run-parameters)."""
    if not config.scale.standard:
        return config.resolved()
    check_standard_masks(config.scale, mask=config.mask, refresh=config.refresh)
    config.resolved()  # the step rule's own checks fail here, in one line, not in the agents
    return config


def check_key_policy(config: RunConfig, *, allow_insecure_keys: bool) -> None:
    """Networked runs refuse Paillier keys below 2048 bits unless a test explicitly allows it."""
    from efpsn.crypto.paillier import MIN_KEY_BITS

    if config.key_bits < MIN_KEY_BITS and not allow_insecure_keys:
        raise ValueError(
            f"key_bits must be >= {MIN_KEY_BITS} for a networked run, got {config.key_bits}"
        )


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


def run_values_by_name(values: Mapping[str, Any]) -> dict[str, Any]:
    """Run parameters given by name (efpsn.notebook.train's keywords) as the command line would
    give them: a text parsed as its flag parses it (iterations="auto", l2="default",
    gamma="1e3"), any other value as it is (RunConfig checks it). ValueError for a name that is
    not a run parameter."""
    declared = {f.name: (f, d) for f, d in declarations()}
    out = {}
    for name, value in values.items():
        if name not in declared:
            raise ValueError(f"{name!r} is not a run parameter; expected one of "
                             f"{', '.join(sorted(declared))}")
        f, d = declared[name]
        if isinstance(value, str) and d.parse is not None:
            value = d.parse(value)
        elif isinstance(value, str) and f.type in ("int", "float", int, float):
            kind = int if f.type in ("int", int) else float
            try:
                value = kind(value)
            except ValueError:
                raise ValueError(f"{name} must be {'an int' if kind is int else 'a number'}, "
                                 f"got {value!r}") from None
        if d.choices and value not in d.choices:  # as the flag's choices would, at once
            raise ValueError(f"{name} must be one of {', '.join(d.choices)}, got {value!r}")
        out[name] = value
    return out


def config_from_values(given: Mapping[str, Any], *, folder: DataFolder | None = None,
                       preset: str | None = None, derived: Mapping[str, Any] | None = None,
                       label_column: str | None = None, resolve: bool = True) -> RunConfig:
    """The RunConfig of the run values given (by flags or by name: efpsn.notebook.train).
    Precedence: the values given, then a --data-dir folder as inspected once (`folder`: data
    "local", its agent count, what its schema.json and files imply, the table schema), or a
    table schema given (its input shape and classes, scale standard), then `derived`, then the
    preset, then RunConfig's defaults; then the step rule where it was asked for
    (RunConfig.resolved) unless `resolve` is False (a run whose l2 waits for the network's
    sample count: efpsn/stats/standardise.py). A value the folder contradicts is refused in
    one line first (check_flags_against_folder)."""
    from efpsn.params.config import PRESETS

    if preset is not None and preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}: expected one of {sorted(PRESETS)}")
    values: dict[str, Any] = dict(PRESETS.get(preset or "", {}))
    values.update(derived or {})
    table = given.get("table")
    if folder is not None:
        check_flags_against_folder(dict(given), folder.layout, label_column=label_column)
        values.update(folder.values)
    elif table is not None and TableSchema.of(table).given:
        values.update(_table_values(TableSchema.of(table)))
    elif ("input_shape" in given or "classes" in given) and "data" not in given:
        values["data"] = LOCAL_DATA  # a schema of one's own and no data set named: local data
    values.update(given)
    config = RunConfig(**values)
    return config.resolved() if resolve else config


def _table_values(table: TableSchema) -> dict[str, Any]:
    """What a table schema implies: agent-local data, its features, its classes (when it
    fixes them: class names, or 1 for a number), scale standard (a table's columns come in
    any units) and, for a number, task ridge."""
    out: dict[str, Any] = {"data": LOCAL_DATA, "input_shape": str(table.features),
                           "scale": STANDARD}
    if table.classes is not None:
        out["classes"] = table.classes
    if table.label == "number":
        out["task"] = "ridge"
    return out


def run_parameters_args(config: RunConfig, folder: Path) -> list[str]:
    """The coordinator's flags for `config`: `--run-parameters FILE` with the run written to
    folder/run-parameters.pb as one efpsn.v1.RunParameters message, the form the coordinator
    hands on to the agents (the config crosses each process boundary once, not as flags)."""
    from efpsn.wire.records import encode_run_parameters

    Path(folder).mkdir(parents=True, exist_ok=True)
    path = Path(folder) / "run-parameters.pb"
    path.write_bytes(encode_run_parameters(config.to_dict()))
    return ["--run-parameters", str(path)]
