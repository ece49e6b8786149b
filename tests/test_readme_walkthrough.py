"""The README's own-data walk-through, run as written: a folder of raw csv tables (scikit-learn's
breast cancer in its own units, 4 agents of unequal sizes, a public test.csv, no schema.json),
the README's `efpsn` lines and its Python block, nothing else. `efpsn up --data-dir D` alone
converges and lands within 0.01 of StandardScaler + LogisticRegression() on the pooled rows; the
saved model, `efpsn evaluate` and the Python block give the accuracy it printed, from raw rows."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.process, pytest.mark.timeout(900)]

README = Path(__file__).resolve().parents[1] / "README.md"


def block(kind: str) -> str:
    """The fenced block right after the README's `<!-- walkthrough: KIND -->` marker."""
    text = README.read_text()
    found = re.search(rf"<!-- walkthrough: {kind} -->\n```{kind}\n(.*?)```", text, re.DOTALL)
    assert found, f"README has no walkthrough {kind} block"
    return found.group(1)


def raw_tables(root: Path) -> tuple[np.ndarray, ...]:
    """The user's own data: raw breast-cancer rows, 4 unequal agents, a public test.csv."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    x, y = load_breast_cancer(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.2, stratify=y, random_state=0)
    header = ",".join([f"x{k}" for k in range(x.shape[1])] + ["label"])
    cuts = np.cumsum([round(f * len(ytr)) for f in (0.1, 0.2, 0.3)])
    for k, rows in enumerate(np.split(np.arange(len(ytr)), cuts), start=1):
        (root / f"agent{k}").mkdir(parents=True)
        np.savetxt(root / f"agent{k}" / "train.csv", np.column_stack([xtr[rows], ytr[rows]]),
                   delimiter=",", header=header, comments="", fmt="%.17g")
    np.savetxt(root / "test.csv", np.column_stack([xte, yte]), delimiter=",", header=header,
               comments="", fmt="%.17g")
    return xtr, ytr, xte, yte


def test_the_readme_walkthrough_runs_as_written(tmp_path: Path) -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    # prepare: the user's folder D; the reference fitted on every training row pooled
    xtr, ytr, xte, yte = raw_tables(tmp_path / "D")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sklearn = make_pipeline(StandardScaler(), LogisticRegression()).fit(xtr, ytr)
    reference = sklearn.score(xte, yte)
    # execute: the README's command lines, as written
    outputs = []
    for line in block("bash").splitlines():
        argv = shlex.split(line, comments=True)
        assert argv[0] == "efpsn"
        done = subprocess.run([sys.executable, "-m", "efpsn", *argv[1:]], cwd=tmp_path,
                              capture_output=True, text=True, timeout=700, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        outputs.append(done.stdout.strip().splitlines())
    up, evaluated = outputs
    # assert: converged, scale standard by default, within 0.01 of scikit-learn
    assert up[-1].startswith("converged"), up
    printed = re.search(r"^final: test accuracy ([0-9.]+)", up[1])
    assert printed, up
    accuracy = float(printed.group(1))
    assert accuracy >= reference - 0.01, (accuracy, reference)
    summary = json.loads((tmp_path / "R" / "summary.json").read_text())
    assert summary["settings"]["scale"] == "standard"
    count = round(1 / summary["settings"]["l2"])  # l2 = 1 / N_total (the training parts)
    assert summary["settings"]["l2"] == 1.0 / count and 0.7 * len(ytr) < count <= len(ytr)
    assert evaluated[0].startswith(f"accuracy {printed.group(1)}, loss "), evaluated
    # the README's Python block, in the same folder: it prints the same accuracy
    out = io.StringIO()
    with contextlib.chdir(tmp_path), contextlib.redirect_stdout(out):
        exec(compile(block("python"), "README walkthrough", "exec"), {})  # noqa: S102
    assert f"{float(out.getvalue().splitlines()[0]):.4f}" == printed.group(1)
    again = json.loads((tmp_path / "R2" / "summary.json").read_text())
    assert again["ok"] and again["settings"]["scale"] == "standard"
