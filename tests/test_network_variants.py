"""Run options over the real network, each compared bit for bit with the simulator: --mask none
and --task lenet, --mask independent with --data idx:FOLDER. (--no-packed: test_launcher.py.)

Short runs with 512-bit test keys (hidden --allow-insecure-keys) and a fixed insecure noise seed,
so that the simulator can draw the same noise.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from efpsn.launch.network import launch_local_network
from efpsn.launch.summary import load_agent_results
from efpsn.params.config import RunConfig
from efpsn.simulator import run_simulation

pytestmark = [pytest.mark.process, pytest.mark.timeout(600)]

NAMES = [f"agent{i}" for i in range(1, 6)]
NOISE_SEED = 21


def run_and_compare(config: RunConfig, folder: Path) -> tuple[dict, list[dict]]:
    summary = launch_local_network(config, results=folder, quiet=True, insecure=True,
                                   insecure_noise_seed=NOISE_SEED, allow_insecure_keys=True)
    results, xs = load_agent_results(folder, NAMES)
    sim = run_simulation(config, noise_seed=NOISE_SEED, allow_insecure_keys=True)
    assert [x.numpy().tobytes() for x in xs] == [x.numpy().tobytes() for x in sim.xs]
    assert summary["ok"] and summary["final"]["accuracy"] == sim.final["accuracy"]
    assert [r["final"]["round"] for r in results] == [config.iterations.total] * len(NAMES)
    return summary, results


def test_lenet_without_masks_over_the_network(tmp_path: Path) -> None:
    config = RunConfig(task="lenet", mask="none", iterations=3, eval_every=3, key_bits=512,
                       round_timeout_seconds=120.0)
    summary, results = run_and_compare(config, tmp_path)
    assert summary["settings"]["task"] == "lenet"
    assert json.loads((tmp_path / "agent1" / "result.json").read_text())["settings"]["mask"] \
        == "none"
    # LeNet as in DLG: 13,426 parameters
    assert np.load(tmp_path / "agent1" / "model.npy").shape == (13426,)
    # no mask: phase I sent no ciphertext at all
    assert all(r["timings"].get("encryptions", 0) == 0 for r in results)


def idx(array: np.ndarray) -> bytes:
    """IDX encoding (unsigned bytes): 0 0 0x08 ndim, big-endian uint32 dims, the data."""
    return bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I",
                                                        *array.shape) + array.tobytes()


def test_independent_masks_on_idx_data_over_the_network(tmp_path: Path) -> None:
    # prepare: an IDX folder (MNIST's format) with 120 training and 30 test images
    rng = np.random.default_rng(0)
    data = tmp_path / "idx"
    data.mkdir()
    for split, n in (("train", 120), ("t10k", 30)):
        (data / f"{split}-images-idx3-ubyte").write_bytes(
            idx(rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)))
        (data / f"{split}-labels-idx1-ubyte").write_bytes(
            idx(rng.integers(0, 10, n, dtype=np.uint8)))
    config = RunConfig(data=f"idx:{data}", mask="independent", gamma=10.0, iterations=4,
                       eval_every=2, batch_size=8, key_bits=512, round_timeout_seconds=120.0)
    # execute and compare
    summary, results = run_and_compare(config, tmp_path / "run")
    # assert: the agents read the IDX folder, and the independent masks really perturbed
    assert summary["settings"]["data"] == f"idx:{data}"
    clean = run_simulation(config.replace(mask="none"), noise_seed=NOISE_SEED)
    assert summary["final"]["loss"] != clean.final["loss"]
    assert all(r["timings"].get("encryptions", 0) == 0 for r in results)
