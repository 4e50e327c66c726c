"""Data sets of the trainer: shapes, determinism, local file formats, and the per-rank shards."""
from __future__ import annotations

import gzip
import pickle

import numpy as np
import pytest
import torch

from pipesgd.train.flags import resolve
from pipesgd.train.data import (
    DataError, build_dataset, load_cifar10, load_mnist, make_mnist1d, make_synthetic, shard_batches, shard_indices,
    steps_per_epoch,
)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shards_are_disjoint_equal_and_shared_permutation(world):
    n, epoch = 1438, 3
    shards = [shard_indices(n, epoch, seed=7, worker=r, num_workers=world) for r in range(world)]
    assert len({len(s) for s in shards}) == 1 and len(shards[0]) == n // world
    union = torch.cat(shards)
    assert len(set(union.tolist())) == len(union)  # disjoint
    assert not torch.equal(shards[0], shard_indices(n, epoch + 1, seed=7, worker=0, num_workers=world))
    assert torch.equal(shards[0], shard_indices(n, epoch, seed=7, worker=0, num_workers=world))


def test_shard_batches_resume_mid_epoch():
    ds = make_synthetic(200, 8, 3, seed=0)
    full = list(shard_batches(ds, epoch=1, seed=0, worker=1, num_workers=2, batch_size=16))
    assert len(full) == steps_per_epoch(len(ds.x_train), 2, 16) == 5
    tail = list(shard_batches(ds, epoch=1, seed=0, worker=1, num_workers=2, batch_size=16, start_step=3))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(full[3:], tail)) and len(tail) == 2


def test_builtin_datasets_shapes_and_determinism():
    digits = build_dataset(resolve([]))
    assert digits.input_shape == (1, 8, 8) and digits.num_classes == 10
    assert len(digits.x_train) + len(digits.x_test) == 1797
    assert abs(float(digits.x_train.mean())) < 1e-3  # standardised with the training statistics
    syn = build_dataset(resolve(["--dataset", "synthetic", "--synthetic-samples", "500",
                                 "--synthetic-features", "12", "--synthetic-classes", "4"]))
    assert syn.input_shape == (12,) and syn.num_classes == 4 and len(syn.x_train) == 400
    a, b = make_mnist1d(seed=3, samples=300), make_mnist1d(seed=3, samples=300)
    assert a.input_shape == (40,) and torch.equal(a.x_train, b.x_train)
    assert set(a.y_train.tolist()) == set(range(10))


def _write_idx(path, array, gz):
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    opener = gzip.open if gz else open
    with opener(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_idx(tmp_path, gz):
    rng = np.random.default_rng(0)
    suffix = ".gz" if gz else ""
    _write_idx(tmp_path / f"train-images-idx3-ubyte{suffix}", rng.integers(0, 255, (20, 28, 28)), gz)
    _write_idx(tmp_path / f"train-labels-idx1-ubyte{suffix}", rng.integers(0, 10, (20,)), gz)
    _write_idx(tmp_path / f"t10k-images-idx3-ubyte{suffix}", rng.integers(0, 255, (6, 28, 28)), gz)
    _write_idx(tmp_path / f"t10k-labels-idx1-ubyte{suffix}", rng.integers(0, 10, (6,)), gz)
    ds = load_mnist(str(tmp_path))
    assert ds.x_train.shape == (20, 1, 28, 28) and ds.x_test.shape == (6, 1, 28, 28) and ds.y_train.dtype == torch.int64


def test_mnist_missing_files(tmp_path):
    with pytest.raises(DataError, match="train-images-idx3-ubyte"):
        load_mnist(str(tmp_path))


def test_cifar10_batches(tmp_path):
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(tmp_path / name, "wb") as f:
            pickle.dump({b"data": rng.integers(0, 255, (4, 3072), dtype=np.uint8),
                         b"labels": list(rng.integers(0, 10, 4))}, f)
    ds = load_cifar10(str(tmp_path))
    assert ds.x_train.shape == (20, 3, 32, 32) and ds.x_test.shape == (4, 3, 32, 32)
    (tmp_path / "test_batch").unlink()
    with pytest.raises(DataError, match="test_batch not found"):
        load_cifar10(str(tmp_path))
