"""docs/own-data.md runs as written: every bash and python block, in order, in one empty folder,
each ending 0; what the page says a block prints, it prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.process, pytest.mark.timeout(1800)]

PAGE = Path(__file__).resolve().parents[1] / "docs" / "own-data.md"


def blocks() -> list[tuple[str, str]]:
    """(language, body) of every bash and python block, in page order."""
    return re.findall(r"```(bash|python)\n(.*?)```", PAGE.read_text(), re.DOTALL)


def test_the_page_s_blocks_run_in_order(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    printed = []
    for kind, body in blocks():
        argv = ["bash", "-euo", "pipefail", "-c", body] if kind == "bash" else [
            sys.executable, "-c", body]
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=900, check=False)
        assert done.returncode == 0, (body, done.stdout[-2000:], done.stderr[-3000:])
        printed.append(done.stdout)
    assert len(printed) == 6
    table, ridge, images, own, notebook, hosts = printed
    assert table.strip().splitlines()[-1].startswith("accuracy ")  # efpsn evaluate's line
    assert "by class: setosa " in table and "\nconverged:" in table
    assert "final: test R^2 " in ridge and ridge.strip().splitlines()[-1].startswith("R^2 ")
    assert "simulated 3 agents" in images and "simulated 3 agents" in own
    assert "('setosa', 'versicolor', 'virginica')" in notebook
    for k in (1, 2, 3):
        assert (tmp_path / f"host{k}" / "results" / f"agent{k}" / "model.safetensors").is_file()
    assert "wrote table.json" in hosts
