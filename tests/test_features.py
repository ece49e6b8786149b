"""A full batch's features prepared once (efpsn/tasks/features.py): the logistic task's
fixed-batch gradient agrees with its per-call gradient up to rounding, gives the same bits at
every call and with any number of threads, and the round oracle (LocalObjective) uses it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from efpsn.tasks.catalog import make_task
from efpsn.tasks.features import SPARSE_DENSITY, Features
from efpsn.tasks.objective import LeNetTask


def batch(density: float, *, n: int = 120, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """n images of 784 pixels in [0, 1], about `density` of them non-zero, labels 0..9."""
    rng = np.random.default_rng(seed)
    pixels = rng.random((n, 1, 28, 28))
    pixels[rng.random(pixels.shape) >= density] = 0.0
    return torch.from_numpy(pixels), torch.from_numpy(rng.integers(0, 10, n))


def point(num_params: int, seed: int = 1) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).normal(0, 0.05, num_params))


@pytest.mark.parametrize(("density", "sparse"), [(0.19, True), (0.9, False)])
@pytest.mark.parametrize("clip", [0.0, 0.5])
def test_fixed_batch_equals_the_per_call_gradient_up_to_rounding(density, sparse, clip):
    task = make_task("logreg", l2=1e-2)
    images, labels = batch(density)
    x = point(task.num_params)
    saved = images.clone(), labels.clone(), x.clone()
    fixed = task.fixed_batch(images, labels, clip=clip)
    value, grad = fixed(x)
    if clip:
        ref_value, ref_grad = task.clipped_loss_and_grad(x, images, labels, clip=clip)
    else:
        ref_value, ref_grad = task.loss_and_grad(x, images, labels)
    assert value == pytest.approx(ref_value, rel=1e-14)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-15)
    assert grad.dtype == torch.float64 and grad.shape == (7850,)
    again = fixed(x)[1]
    assert again is not grad and torch.equal(again, grad)  # the same bits at every call
    assert all(torch.equal(a, b) for a, b in zip((images, labels, x), saved, strict=True))
    flat = images.reshape(len(labels), -1).numpy()
    assert Features(flat, prepared=True).sparse is sparse
    assert bool(np.count_nonzero(flat) / flat.size <= SPARSE_DENSITY) is sparse


@pytest.mark.parametrize("density", [0.19, 0.9])
def test_fixed_batch_bits_do_not_depend_on_the_thread_count(density):
    task = make_task("logreg")
    images, labels = batch(density, n=300, seed=3)
    x = point(task.num_params, seed=4)
    fixed = task.fixed_batch(images, labels)
    before = torch.get_num_threads()
    try:
        grads = []
        for threads in (1, 2, 1):
            torch.set_num_threads(threads)
            grads.append(fixed(x)[1])
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(grads[0], g) for g in grads[1:])


def test_prepared_products_match_numpy():
    rng = np.random.default_rng(5)
    flat = rng.random((50, 30))
    flat[flat < 0.8] = 0.0
    weight, residual = rng.normal(size=(4, 30)), rng.normal(size=(4, 50))
    for features in (Features(flat), Features(flat, prepared=True),
                     Features(np.ascontiguousarray(rng.random((50, 30))), prepared=True)):
        np.testing.assert_allclose(features.scores(weight), weight @ features.dense.T,
                                   rtol=1e-13)
        out = np.empty((4, 30))
        features.weigh(residual, out=out)
        np.testing.assert_allclose(out, residual @ features.dense, rtol=1e-13)
        assert features.scores(weight).flags.c_contiguous


def test_features_must_be_a_float64_matrix():
    with pytest.raises(ValueError, match="2-D float64"):
        Features(np.zeros((3, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="2-D float64"):
        Features(np.zeros(12))


def test_the_default_fixed_batch_is_the_tasks_gradient():
    task = LeNetTask()
    images, labels = batch(0.5, n=6)
    x = point(task.num_params)
    value, grad = task.fixed_batch(images, labels)(x)
    ref_value, ref_grad = task.loss_and_grad(x, images, labels)
    assert value == ref_value and torch.equal(grad, ref_grad)


@pytest.mark.parametrize("density", [0.19, 0.9])
@pytest.mark.parametrize("clip", [0.0, 0.5])
def test_fixed_gradient_is_fixed_batchs_gradient_bit_for_bit(density, clip):
    task = make_task("logreg", l2=1e-2)
    images, labels = batch(density, n=90, seed=6)
    x = point(task.num_params, seed=7)
    grad = task.fixed_gradient(images, labels, clip=clip)(x)
    value, ref = task.fixed_batch(images, labels, clip=clip)(x)
    assert torch.equal(grad, ref) and np.isfinite(value)
    lenet, few = LeNetTask(), batch(0.5, n=4)  # the default: fixed_batch's second item
    at = point(lenet.num_params)
    assert torch.equal(lenet.fixed_gradient(*few)(at), lenet.fixed_batch(*few)(at)[1])


def test_sparse_features_use_int32_indices_and_the_int64_products_bits():
    images, _ = batch(0.19, n=200, seed=8)
    flat = images.reshape(200, -1).numpy()
    features = Features(flat, prepared=True)
    assert features.sparse
    for csr in (features._rows, features._cols):
        assert csr.crow_indices().dtype == torch.int32 and csr.col_indices().dtype == torch.int32
    rng = np.random.default_rng(9)
    weight, residual = rng.normal(size=(10, 784)), rng.normal(size=(10, 200))
    wide = torch.from_numpy(flat).to_sparse_csr()  # int64 indices, as before
    assert wide.crow_indices().dtype == torch.int64
    expected = torch.sparse.mm(wide, torch.from_numpy(np.ascontiguousarray(weight.T))).numpy().T
    assert np.array_equal(features.scores(weight), expected)
    out = np.empty((10, 784))
    features.weigh(residual, out=out)
    cols = torch.from_numpy(np.ascontiguousarray(flat.T)).to_sparse_csr()
    expected = torch.sparse.mm(cols, torch.from_numpy(np.ascontiguousarray(residual.T))).numpy().T
    assert np.array_equal(out, expected)
