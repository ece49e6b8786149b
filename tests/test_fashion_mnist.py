"""`efpsn data split --data fashion-mnist`: Debian's dataset-fashion-mnist read from its gzipped
IDX files into private folders, on a few rows (of the installed files, else of small IDX files
written here in the package's layout, so the reader is tested either way), and the one-line
error that names the command installing the package."""

from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from efpsn.cli.main import main
from efpsn.data import images
from efpsn.data.images import read_idx

ROWS = 12


def write_idx(path: Path, array: np.ndarray) -> None:
    """One gzipped IDX file of uint8 (type code 0x08), as the Debian package ships them."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(
        f">{array.ndim}I", *array.shape)
    path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


@pytest.fixture
def fashion_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The installed package's folder, or (not installed) a small one in its layout."""
    if images.FASHION_MNIST_DIR.is_dir():
        return images.FASHION_MNIST_DIR
    folder = tmp_path / "fashion-mnist"
    folder.mkdir()
    rng = np.random.default_rng(3)
    for split, n in (("train", 30), ("t10k", 20)):
        write_idx(folder / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        write_idx(folder / f"{split}-labels-idx1-ubyte.gz", rng.integers(0, 10, n))
    monkeypatch.setattr(images, "FASHION_MNIST_DIR", folder)
    return folder


def test_split_reads_the_packages_idx_files_into_private_folders(
        fashion_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # prepare: the first ROWS training and test images, as the IDX reader gives them
    train_x = read_idx(fashion_folder / "train-images-idx3-ubyte.gz")[:ROWS]
    train_y = read_idx(fashion_folder / "train-labels-idx1-ubyte.gz")[:ROWS]
    test_x = read_idx(fashion_folder / "t10k-images-idx3-ubyte.gz")[:ROWS]
    out = tmp_path / "D"
    # execute
    code = main(["data", "split", "--data", "fashion-mnist", "--agents", "3", "--rows",
                 str(ROWS), "--out", str(out)])
    # assert: three private folders of ROWS / 3 rows each, the public test file, the schema
    assert code == 0 and "wrote 3 private folders" in capsys.readouterr().out
    shards = [np.load(out / f"agent{k}" / "train.npz") for k in (1, 2, 3)]
    assert [s["X"].shape for s in shards] == [(ROWS // 3, 1, 28, 28)] * 3
    assert all(s["X"].dtype == np.uint8 for s in shards)
    # every training row is one of the first ROWS, with its label (an iid shuffle of them)
    pooled = np.concatenate([s["X"] for s in shards]).reshape(ROWS, -1)
    labels = np.concatenate([s["y"] for s in shards])
    order = [next(i for i in range(ROWS) if np.array_equal(row, train_x[i].ravel()))
             for row in pooled]
    assert sorted(order) == list(range(ROWS)) and list(labels) == list(train_y[order])
    test = np.load(out / "test.npz")
    assert np.array_equal(test["X"].reshape(ROWS, 28, 28), test_x)
    assert json.loads((out / "schema.json").read_text()) == {
        "input_shape": "1x28x28", "classes": 10, "scale": "unit"}


def test_without_the_package_the_error_names_the_install_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(images, "FASHION_MNIST_DIR", tmp_path / "absent")
    code = main(["data", "split", "--data", "fashion-mnist", "--agents", "5", "--out",
                 str(tmp_path / "D")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "bash scripts/setup.sh --fashion-mnist" in err and str(tmp_path / "absent") in err
    assert not (tmp_path / "D").exists()


def test_rows_must_leave_every_agent_a_row(fashion_folder: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["data", "split", "--data", "fashion-mnist", "--agents", "5", "--rows", "3",
                 "--out", str(tmp_path / "D")])
    assert code == 2
    assert "rows must be at least the 5 agents" in capsys.readouterr().err
