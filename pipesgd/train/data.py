"""Data sets held as tensors in memory, and the per-rank shard of each epoch.

Shipped by a package (digits), generated from a seed (synthetic, MNIST-1D-style), read from local files (MNIST
IDX, CIFAR-10) or made from the Python standard library (pysrc: ``text``); nothing is downloaded. ``DATASETS`` is
the registry by ``--dataset`` name. ``shard_batches`` gives each worker an equal, disjoint slice of one seeded
permutation per epoch, so all workers run the same number of steps."""
from __future__ import annotations

import gzip
import importlib.util
import os
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from . import text



class DataSource(Protocol):
    """What a loader reads of the run's settings (``TrainConfig`` has it; the config imports this module, so this
    module names the settings it needs instead of importing the config)."""

    seed: int
    dataset_name: str
    dataset_dir: str
    synthetic_samples: int
    synthetic_features: int
    synthetic_classes: int


class DataError(ValueError):
    """A data set cannot be built or read; the message is the one line shown to the user."""


@dataclass(slots=True)
class Dataset:
    """A train/test split in memory. Inputs are float32 ``(N, *input_shape)``, labels int64 ``(N,)``; for the
    data sets in ``TOKEN_DATASETS`` inputs are int64 token windows ``(N, T)`` and labels the next token of each
    position, int64 ``(N, T)`` (``num_classes`` is then the vocabulary size)."""

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    source: dict = field(default_factory=dict)  # what a data set made on this machine was built from (for records)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])


def _split(name, x: np.ndarray, y: np.ndarray, num_classes: int, seed: int, test_fraction: float) -> Dataset:
    """A fixed seeded train/test split, standardised with the training statistics."""
    perm = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(len(x) * test_fraction))
    test, train = perm[:n_test], perm[n_test:]
    x = x.astype(np.float32)
    mean, std = x[train].mean(), x[train].std() + 1e-8
    x = (x - mean) / std
    return Dataset(name, torch.from_numpy(x[train]), torch.from_numpy(y[train].astype(np.int64)),
                   torch.from_numpy(x[test]), torch.from_numpy(y[test].astype(np.int64)), num_classes)


def load_digits(seed: int = 0) -> Dataset:
    """scikit-learn's 8x8 handwritten digits (1797 images, 10 classes); a fifth held out with a fixed split."""
    # Read scikit-learn's shipped CSV directly: importing sklearn takes seconds per process, which every
    # rank of every run pays. Fall back to the public loader if the file is not where sklearn keeps it.
    spec = importlib.util.find_spec("sklearn")
    csv = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz") if spec else ""
    if csv and os.path.exists(csv):
        table = np.loadtxt(csv, delimiter=",")
        images, target = table[:, :-1], table[:, -1].astype(np.int64)
    else:
        from sklearn.datasets import load_digits as sk_digits

        bunch = sk_digits()
        images, target = bunch.data, bunch.target
    x = images.reshape(-1, 1, 8, 8)
    # The split is fixed (seed 0) whatever the run's seed, so accuracies of different runs compare.
    return _split("digits", x, target, 10, seed=0, test_fraction=0.2)


def make_synthetic(samples: int, features: int, classes: int, seed: int) -> Dataset:
    """Seeded Gaussian classes: a learnable task of any size, for throughput work."""
    rng = np.random.default_rng(seed + 1_000_003)
    # Centres about 3.5 noise standard deviations apart whatever the dimension: learnable, not trivial.
    centers = rng.normal(0.0, 1.0, size=(classes, features)) * (2.5 / np.sqrt(features))
    y = rng.integers(0, classes, size=samples)
    x = centers[y] + rng.normal(0.0, 1.0, size=(samples, features))
    return _split("synthetic", x, y, classes, seed=seed, test_fraction=0.2)


# MNIST-1D-style templates (after Greydanus 2020): one 12-point 1-D pattern per digit.
_MNIST1D_TEMPLATES = np.array([
    [5, 6, 6.5, 6.75, 7, 7, 7, 7, 6.75, 6.5, 6, 5],
    [5, 3, 3, 3.4, 3.8, 4.2, 4.6, 5, 5.4, 5.8, 5, 5],
    [5, 6, 6.5, 6.5, 6, 5.25, 4.75, 4, 3.5, 3.5, 4, 5],
    [5, 6, 6.5, 6.5, 6, 5, 5, 6, 6.5, 6.5, 6, 5],
    [5, 4.4, 3.8, 3.2, 2.6, 2.6, 5, 5, 5, 5, 5, 5],
    [5, 3, 3, 3, 3, 5, 6, 6.5, 6.5, 6, 4.5, 5],
    [5, 4, 3.5, 3.25, 3, 3, 3, 3, 3.25, 3.5, 4, 5],
    [5, 7, 7, 6.6, 6.2, 5.8, 5.4, 5, 4.6, 4.2, 5, 5],
    [5, 4, 3.5, 3.5, 4, 5, 5, 4, 3.5, 3.5, 4, 5],
    [5, 4, 3.5, 3.5, 4, 5, 5, 5, 5, 4.7, 4.3, 5],
]) - 5.0


def make_mnist1d(seed: int, samples: int = 5000, features: int = 40) -> Dataset:
    """Generate an MNIST-1D-style set locally. Step 1: pad each 12-point template to 36 points. Step 2: scale it
    randomly (0.8-1.2) and shift it circularly (up to 12 points). Step 3: add white and smooth noise. Step 4: resample
    to ``features`` points by linear interpolation."""
    rng = np.random.default_rng(seed + 2_000_003)
    y = rng.integers(0, 10, size=samples)
    # Step 1
    padded = np.concatenate([_MNIST1D_TEMPLATES, np.zeros((10, 24))], axis=1)[y]
    # Step 2
    padded = padded * rng.uniform(0.8, 1.2, size=(samples, 1))
    shifts = rng.integers(0, 13, size=samples)
    cols = (np.arange(36)[None, :] - shifts[:, None]) % 36
    x = np.take_along_axis(padded, cols, axis=1)
    # Step 3
    white = rng.normal(0.0, 0.25, size=x.shape)
    smooth = np.cumsum(rng.normal(0.0, 0.08, size=x.shape), axis=1)
    x = x + white + smooth - smooth.mean(axis=1, keepdims=True)
    # Step 4
    grid = np.linspace(0, 35, features)
    x = np.stack([np.interp(grid, np.arange(36), row) for row in x])
    return _split("mnist1d", x, y, 10, seed=0, test_fraction=0.2)


def _read_idx(path: str) -> np.ndarray:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise DataError(f"{path} is not an IDX file")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _find(directory: str, stem: str) -> str:
    for candidate in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        path = os.path.join(directory, candidate)
        if os.path.exists(path):
            return path
    raise DataError(f"MNIST file {stem}[.gz] not found in {directory}")


def load_mnist(directory: str) -> Dataset:
    """MNIST from the four IDX files (gzipped or not) in ``directory``; the official test split."""
    parts = [_read_idx(_find(directory, stem)) for stem in (
        "train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")]
    x_train, y_train, x_test, y_test = parts
    mean, std = x_train.mean() / 255.0, x_train.std() / 255.0

    def prep(x):
        return torch.from_numpy(((x.astype(np.float32) / 255.0 - mean) / std)[:, None])

    return Dataset("mnist", prep(x_train), torch.from_numpy(y_train.astype(np.int64)),
                   prep(x_test), torch.from_numpy(y_test.astype(np.int64)), 10)


def load_cifar10(directory: str) -> Dataset:
    """CIFAR-10 from the python batches (data_batch_1..5, test_batch) in ``directory``."""
    def read(name):
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            raise DataError(f"CIFAR-10 batch {name} not found in {directory}")
        try:
            with open(path, "rb") as f:
                batch = pickle.load(f, encoding="bytes")
        except Exception as exc:  # noqa: BLE001 - any unpickling failure is the same user error
            raise DataError(f"CIFAR-10 batch {path} is unreadable: {exc}") from None
        return np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32), np.asarray(batch[b"labels"])

    train = [read(f"data_batch_{i}") for i in range(1, 6)]
    x_train, y_train = np.concatenate([b[0] for b in train]), np.concatenate([b[1] for b in train])
    x_test, y_test = read("test_batch")
    x_train = x_train.astype(np.float32) / 255.0
    mean = x_train.mean(axis=(0, 2, 3), keepdims=True)
    std = x_train.std(axis=(0, 2, 3), keepdims=True)
    return Dataset("cifar10", torch.from_numpy((x_train - mean) / std), torch.from_numpy(y_train.astype(np.int64)),
                   torch.from_numpy((x_test.astype(np.float32) / 255.0 - mean) / std),
                   torch.from_numpy(y_test.astype(np.int64)), 10)


# pysrc: windows of 64 characters (a line or two of code) and the corpus's last 50,000 characters held out,
# enough for a steady loss while an evaluation costs about as much as 10 training steps.
PYSRC_CONTEXT = 64
PYSRC_TEST_CHARS = 50_000


def load_pysrc(root: str = "", context: int = PYSRC_CONTEXT, max_chars: int = text.CORPUS_CHARS,
               test_chars: int = PYSRC_TEST_CHARS) -> Dataset:
    """Next-character windows of the standard library's sources (``text``): the corpus's last ``test_chars``
    characters are the held-out split, so no test window overlaps a training one. Fixed whatever the seed."""
    corpus, source = text.read_corpus(root or text.stdlib_root(), max_chars)
    if len(corpus) < 2 * test_chars:
        raise DataError(f"only {len(corpus)} characters of Python sources under {source.root} (need {2 * test_chars})")
    codes = text.encode(corpus)
    split = len(codes) - test_chars
    x_train, y_train = text.window(codes[:split], context)
    x_test, y_test = text.window(codes[split:], context)
    return Dataset("pysrc", x_train, y_train, x_test, y_test, text.VOCAB_SIZE, source.as_dict())


# The data-set registry, by --dataset name (the config validates against it). Each loader gets the
# resolved config; the names in DATASETS_WITH_DIR read local files and are given as NAME:DIR.
DATASETS: dict[str, Callable[[DataSource], Dataset]] = {
    "digits": lambda cfg: load_digits(cfg.seed),
    "synthetic": lambda cfg: make_synthetic(cfg.synthetic_samples, cfg.synthetic_features, cfg.synthetic_classes,
                                            cfg.seed),
    "mnist1d": lambda cfg: make_mnist1d(cfg.seed),
    "mnist": lambda cfg: load_mnist(cfg.dataset_dir),
    "cifar10": lambda cfg: load_cifar10(cfg.dataset_dir),
    "pysrc": lambda cfg: load_pysrc(),
}
DATASETS_WITH_DIR = ("mnist", "cifar10")
# Data sets of token windows with a target per position: they train the models in models.TOKEN_MODELS only.
TOKEN_DATASETS = ("pysrc",)


def build_dataset(cfg: DataSource) -> Dataset:
    """The data set named by ``cfg.dataset`` (identical on every rank: same files, same seeds)."""
    loader = DATASETS.get(cfg.dataset_name)
    if loader is None:
        raise DataError(f"unknown dataset {cfg.dataset_name!r}")
    return loader(cfg)


def shard_size(n_samples: int, num_workers: int) -> int:
    """Samples per worker per epoch: equal for all workers, the remainder of the permutation is dropped."""
    return n_samples // num_workers


def steps_per_epoch(n_samples: int, num_workers: int, batch_size: int) -> int:
    return shard_size(n_samples, num_workers) // batch_size


def shard_indices(n_samples: int, epoch: int, seed: int, worker: int, num_workers: int) -> torch.Tensor:
    """This worker's slice of the epoch's permutation (the same permutation on every worker)."""
    gen = torch.Generator().manual_seed(seed * 100_003 + epoch)
    perm = torch.randperm(n_samples, generator=gen)
    size = shard_size(n_samples, num_workers)
    return perm[worker * size:(worker + 1) * size]


def shard_batches(ds: Dataset, epoch: int, seed: int, worker: int, num_workers: int, batch_size: int,
                  start_step: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield this worker's batches of one epoch, from ``start_step`` on (for resuming mid-epoch)."""
    idx = shard_indices(len(ds.x_train), epoch, seed, worker, num_workers)
    for step in range(start_step, len(idx) // batch_size):
        sel = idx[step * batch_size:(step + 1) * batch_size]
        yield ds.x_train[sel], ds.y_train[sel]
