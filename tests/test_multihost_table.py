"""A table on separate hosts, as docs/own-data.md shows it: every process on its own loopback
address (127.0.0.2 the coordinator, 127.0.0.3.. the agents; Linux routes all of 127.0.0.0/8 to
the loopback device, so each binds and is dialled at its own address as separate machines are),
each agent with only its own table and the public test.csv, mutual TLS with each host's address
in its certificate. The coordinator gets the public table schema `efpsn data schema` made from
the public test file and the listed sets (schema.json), and nothing else of the data: the input
shape, the classes and scale standard follow from it. The run ends at scikit-learn's pipeline;
the coordinator's --help names every scale."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from commands import efpsn
from own_tables import cellar, reference_classifier

pytestmark = [pytest.mark.process, pytest.mark.timeout(900)]

HOSTS = {"coordinator": "127.0.0.2", **{f"agent{k}": f"127.0.0.{k + 2}" for k in range(1, 5)}}


def test_the_coordinator_help_names_every_scale(tmp_path: Path) -> None:
    out = efpsn("coordinator", "--help", cwd=tmp_path).stdout
    words = " ".join(out.split())
    for scale in ("none", "unit (/255)", "div:C", "div:C1,...,Cd", "standard"):
        assert scale in words, words
    assert "--table-schema" in words


def test_a_table_on_separate_hosts(tmp_path: Path) -> None:
    # prepare: the cellar's four tables, each on its own host with the public test.csv; the
    # public lists (class names, categories, dropped columns) in a schema.json of their own
    data = cellar(tmp_path / "D")
    for k in range(1, 5):
        host = tmp_path / f"host{k}"
        host.mkdir()
        shutil.copy(data / f"agent{k}" / "train.csv", host / "train.csv")
        shutil.copy(data / "test.csv", host / "test.csv")
    (tmp_path / "public.json").write_text(json.dumps({
        "label_column": "cultivar", "classes": ["Barbera", "Barolo", "Grignolino"],
        "categories": {"region": ["Lombardy", "Piedmont", "Veneto"], "cask": ["oak", "steel"]}}))
    made = efpsn("data", "schema", "--data", "D/test.csv", "--schema", "public.json", "--out",
                 "table.json", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert "its sets are the listed ones, nothing learnt from a table" in made.stdout
    certs = efpsn("certs", "--out", "tls", "--names", ",".join(HOSTS),
                  *[f"--ip={n}={a}" for n, a in HOSTS.items()], cwd=tmp_path)
    assert certs.returncode == 0, certs.stderr
    logs = {}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        # execute: the coordinator with the table schema alone, then each agent on its host
        logs["coordinator"] = open(tmp_path / "coordinator.log", "wb")  # noqa: SIM115
        procs["coordinator"] = subprocess.Popen(
            [sys.executable, "-m", "efpsn", "coordinator", "--listen",
             f"{HOSTS['coordinator']}:0", "--port-file", "coordinator.port", "--tls-dir", "tls",
             "--agents", "4", "--data", "local", "--table-schema", "table.json",
             "--key-bits", "2048"], cwd=tmp_path, stdout=logs["coordinator"],
            stderr=subprocess.STDOUT)
        port_file = tmp_path / "coordinator.port"
        deadline = time.monotonic() + 120
        while not port_file.exists() or not port_file.read_text().strip():
            assert time.monotonic() < deadline and procs["coordinator"].poll() is None
            time.sleep(0.2)
        coordinator = f"{HOSTS['coordinator']}:{int(port_file.read_text())}"
        for k in range(1, 5):
            name = f"agent{k}"
            logs[name] = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "efpsn", "agent", "--name", name, "--listen",
                 f"{HOSTS[name]}:0", "--tls-dir", "tls", "--coordinator", coordinator,
                 "--data", f"host{k}/train.csv", "--test-data", f"host{k}/test.csv",
                 "--results", f"host{k}/results"], cwd=tmp_path, stdout=logs[name],
                stderr=subprocess.STDOUT)
        codes = {n: p.wait(timeout=600) for n, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        for fh in logs.values():
            fh.close()
    texts = {n: (tmp_path / f"{n}.log").read_text() for n in procs}
    assert codes == {n: 0 for n in procs}, {n: t[-2000:] for n, t in texts.items()}
    # assert: each host ran the table its own way, with the agreed encoding, at scikit-learn's
    from efpsn.params.table import TableSchema

    reference = reference_classifier(data, "cultivar")
    for k in range(1, 5):
        result = json.loads((tmp_path / f"host{k}" / "results" / f"agent{k}" /
                             "result.json").read_text())
        settings = result["settings"]
        assert settings["scale"] == "standard" and settings["input_shape"] == "18"
        table = TableSchema.parse(settings["table"])
        assert settings["classes"] == 3 and table == TableSchema.read(str(tmp_path /
                                                                          "table.json"))
        assert table.agreed == () and table.disclosure() is None  # the lists were public
        assert result["final"]["accuracy"] >= reference - 0.02, result["final"]
        assert "the class names that occur" not in result["privacy"]["line"]
