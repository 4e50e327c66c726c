"""The 4-node comparison grid's configuration (issue 12): workloads x bandwidths x variants, read from a TOML file
(``experiments/configs/comparison.toml``) with command-line selections over it. A cell is one workload at one
bandwidth: one emulated cluster, one calibration, one run per variant.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace

from experiments.harness.variants import TRAINER_FLAGS, trainer_flags
from experiments.harness.loopback_cluster import LOOPBACK
from pipesgd.cluster.units import parse_link, parse_size
from timing_model.units import parse_size_range

__all__ = ["Workload", "GridConfig", "load_config", "select", "cell_name", "split_cell"]


@dataclass(frozen=True, slots=True)
class Workload:
    """One training job of the grid, on data made or embedded on the machine (no download)."""

    name: str  # the grid's label (lenet, resnet20, alexnet, charlm)
    model: str  # pipesgd-train --model
    dataset: str = "digits"  # pipesgd-train --dataset
    flags: tuple[str, ...] = ()  # more pipesgd-train flags every variant shares (optimizer, schedule)
    target_loss: float = 0.0  # > 0: time to target is to this validation loss, not to the grid's target accuracy
    target_accuracy: float = 0.0  # > 0: time to target is to this accuracy, not to the grid's
    epochs: int = 10  # train to completion: every epoch evaluated
    steps: dict[str, int] = field(default_factory=dict)  # per bandwidth: a step budget instead of epochs
    lr: float = 0.02  # pipesgd-train --lr
    calib_sizes: str = "256KB:4MB"  # calibration message sizes (pipesgd-timing calibrate --sizes)
    calib_repeats: int = 0  # timed calls per calibration point for this workload (0: the grid's calib_repeats)

    def __post_init__(self) -> None:
        if not self.name or not self.model:
            raise ValueError("a workload needs a name and a model")
        if self.epochs < 1 or any(not isinstance(n, int) or n < 1 for n in self.steps.values()):
            raise ValueError(f"workload {self.name}: epochs and step budgets must be integers >= 1")
        if self.lr <= 0:
            raise ValueError(f"workload {self.name}: lr must be > 0")
        if self.target_loss < 0:
            raise ValueError(f"workload {self.name}: target_loss must be >= 0 (0: the grid's target accuracy)")
        if not 0 <= self.target_accuracy <= 1 or (self.target_accuracy and self.target_loss):
            raise ValueError(f"workload {self.name}: target_accuracy must be in (0, 1] (0: the grid's), and not "
                             "beside a target_loss")
        if not all(isinstance(f, str) for f in self.flags):
            raise ValueError(f"workload {self.name}: flags must be a list of strings")
        if not isinstance(self.calib_repeats, int) or self.calib_repeats < 0:
            raise ValueError(f"workload {self.name}: calib_repeats must be an integer >= 0 (0: the grid's)")
        try:
            parse_size_range(self.calib_sizes)
        except ValueError as error:
            raise ValueError(f"workload {self.name}: calib_sizes: {error}") from None


@dataclass(frozen=True, slots=True)
class GridConfig:
    """The whole grid and how each run is made."""

    # What runs
    workloads: tuple[Workload, ...]
    bandwidths: tuple[str, ...] = ("100mbit", "1gbit", "unshaped")  # tc rates, or unshaped (no tbf)
    variants: tuple[str, ...] = ()  # names of experiments.harness.variants.TRAINER_FLAGS
    nodes: int = 4  # one process per node, one thread each
    cores_per_node: int = 0  # > 0: each emulated node pinned to this many cores of its own; 0: nodes share the cores
    # The links' tbf bucket (pipesgd-cluster up --burst: "6kb", "65536"); "" keeps the cluster's default. A small one
    # is a link without credit, as a real NIC: the default lets what follows idle time leave at veth speed
    burst: str = ""
    # How each run trains
    batch_size: int = 32  # per worker
    threads: int = 1
    warmup_steps: int = 3  # every mode: pipe's synchronous warm-up, PowerSGD's uncompressed start
    target_accuracy: float = 0.90  # time to target: the first evaluation at or above it
    # Evaluation points: 0 = at every epoch's end, during the run; N = the weights every N steps, evaluated after
    # the run at the wall clock of their copy (pipesgd-train --eval-steps N --eval-deferred): finer, and free
    eval_steps: int = 0
    timeout_s: float = 900.0  # per trainer run
    # Steps traced after the skipped ones in every run of Pipe-SGD or synchronous AllReduce (0: none), for the
    # report's breakdown of where an iteration goes (experiments.harness.breakdown); a few, so the median step
    # does not carry the tracer's own cost
    trace_steps: int = 10
    seed: int = 0
    # The timing model (one calibration per cell)
    calib_repeats: int = 5
    calib_warmup: int = 1
    calib_timeout_s: float = 900.0
    calib_compressions: str = "none,bf16,q8,sign"
    # Where things go
    cluster_name: str = "psgd-cmp"
    only_cells: tuple[str, ...] = ()  # when set, only these cells of workloads x bandwidths (--cells)
    out: str = "results/comparison"  # raw per-rank metrics, logs and calibrations, per cell
    result: str = "experiments/results/comparison/runs.json"  # the committed tidy result

    @property
    def burst_bytes(self) -> int | None:
        """The links' tbf bucket in bytes, None for the cluster's default."""
        return parse_size(self.burst) if self.burst else None

    def __post_init__(self) -> None:
        if not self.workloads or not self.bandwidths or not self.variants:
            raise ValueError("the grid needs at least one workload, bandwidth and variant")
        names = [w.name for w in self.workloads]
        if len(set(names)) != len(names):
            raise ValueError(f"workload names repeat: {names}")
        unknown = [v for v in self.variants if v not in TRAINER_FLAGS]
        if unknown:
            raise ValueError(f"unknown variants {unknown}; valid: {', '.join(TRAINER_FLAGS)}")
        for bandwidth in self.bandwidths:
            if bandwidth != LOOPBACK:  # the quick profile's local ranks (experiments.harness.loopback_cluster)
                parse_link(bandwidth)
        if self.nodes < 2:
            raise ValueError("nodes must be >= 2 (a comparison of communication needs peers)")
        if self.cores_per_node < 0:
            raise ValueError(f"cores_per_node must be >= 0, got {self.cores_per_node}")
        if not isinstance(self.burst, str):
            raise ValueError(f"burst must be a size in quotes, e.g. \"6kb\", got {self.burst!r}")
        self.burst_bytes  # a bad size raises here, before any run
        if self.batch_size < 1 or self.threads < 1 or self.warmup_steps < 0:
            raise ValueError("batch_size and threads must be >= 1 and warmup_steps >= 0")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        if not isinstance(self.eval_steps, int) or self.eval_steps < 0:
            raise ValueError(f"eval_steps must be an integer >= 0 (0: every epoch), got {self.eval_steps!r}")
        if not 0 < self.target_accuracy <= 1:
            raise ValueError("target_accuracy must be in (0, 1]")
        if not isinstance(self.trace_steps, int) or self.trace_steps < 0:
            raise ValueError(f"trace_steps must be an integer >= 0 (0: no trace), got {self.trace_steps!r}")
        if self.timeout_s <= 0 or self.calib_timeout_s <= 0 or self.calib_repeats < 1 or self.calib_warmup < 0:
            raise ValueError("timeouts must be > 0, calib_repeats >= 1 and calib_warmup >= 0")

    @property
    def skip(self) -> int:
        """Steps dropped before the medians: the warm-up and two more (the pipeline filling, first allocations)."""
        return self.warmup_steps + 2

    def target_of(self, workload: Workload) -> tuple[float, str]:
        """Time to target's (value, metric) for ``workload``: its validation loss target, else its own accuracy
        target, else the grid's."""
        if workload.target_loss:
            return workload.target_loss, "loss"
        return workload.target_accuracy or self.target_accuracy, "accuracy"

    def targets(self) -> dict[str, tuple[float, str]]:
        """``target_of`` of every workload, by name."""
        return {w.name: self.target_of(w) for w in self.workloads}

    def workload(self, name: str) -> Workload:
        for w in self.workloads:
            if w.name == name:
                return w
        raise ValueError(f"unknown workload {name!r}; valid: {', '.join(w.name for w in self.workloads)}")

    def cells(self) -> list[tuple[Workload, str]]:
        """(workload, bandwidth) in grid order: workloads outer, bandwidths inner."""
        return [(w, b) for w in self.workloads for b in self.bandwidths
                if not self.only_cells or cell_name(w.name, b) in self.only_cells]

    def eval_flags(self) -> list[str]:
        """Where a run is evaluated (``eval_steps``)."""
        if self.eval_steps:
            return ["--eval-every", "0", "--eval-steps", str(self.eval_steps), "--eval-deferred"]
        return ["--eval-every", "1"]

    def train_flags(self, workload: Workload, bandwidth: str) -> list[str]:
        """The ``pipesgd-train`` flags every variant of the cell shares."""
        length = (["--steps", str(workload.steps[bandwidth])] if bandwidth in workload.steps
                  else ["--epochs", str(workload.epochs)])
        return ["--model", workload.model, "--dataset", workload.dataset, "--batch-size", str(self.batch_size),
                *length, *self.eval_flags(), "--lr", f"{workload.lr:g}", "--threads", str(self.threads),
                "--warmup-steps", str(self.warmup_steps), "--seed", str(self.seed), "--timeout", "300", *workload.flags]

    def run_flags(self, workload: Workload, bandwidth: str, variant: str) -> list[str]:
        """One run's ``pipesgd-train`` flags: the cell's shared ones, then the variant's. The variant's come last
        because the trainer's parser keeps a flag's last value: a variant that names its own optimizer or warm-up
        (``pipe+q8+muon``, ``localsgd``) wins over the workload's ``--optimizer adamw`` and the grid's warm-up."""
        return [*self.train_flags(workload, bandwidth), *trainer_flags(variant)]


def cell_name(workload: str, bandwidth: str) -> str:
    """A cell's name (its results folder): ``lenet-1gbit``."""
    return f"{workload}-{bandwidth}"


def split_cell(name: str) -> tuple[str, str]:
    """``cell_name`` inverted; raises ``ValueError`` on a name without a bandwidth."""
    workload, sep, bandwidth = name.rpartition("-")
    if not sep or not workload:
        raise ValueError(f"bad cell {name!r}: expected WORKLOAD-BANDWIDTH, e.g. lenet-1gbit")
    return workload, bandwidth


_TOP_KEYS = set(GridConfig.__dataclass_fields__) - {"workloads", "only_cells"}
_WORKLOAD_KEYS = set(Workload.__dataclass_fields__) - {"name"}


def load_config(path: str) -> GridConfig:
    """The grid of a TOML file: top-level GridConfig fields and one ``[workload.NAME]`` table per workload, in
    file order; an unknown key or a bad value raises ``ValueError`` naming it."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except OSError as error:
        raise ValueError(f"cannot read config {path!r}: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path}: not valid TOML ({error})") from None
    tables = data.pop("workload", {})
    unknown = set(data) - _TOP_KEYS
    if unknown:
        valid = ", ".join(sorted(_TOP_KEYS | {"workload"}))
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}; valid: {valid}")
    if not isinstance(tables, dict) or not tables:
        raise ValueError(f"{path}: no [workload.NAME] tables")
    workloads = []
    for name, table in tables.items():
        bad = set(table) - _WORKLOAD_KEYS if isinstance(table, dict) else {"(not a table)"}
        if bad:
            valid = ", ".join(sorted(_WORKLOAD_KEYS))
            raise ValueError(f"{path}: workload {name}: unknown keys {sorted(bad)}; valid: {valid}")
        if isinstance(table.get("flags"), list):
            table = {**table, "flags": tuple(table["flags"])}
        try:
            workloads.append(Workload(name=name, **table))
        except TypeError as error:
            raise ValueError(f"{path}: workload {name}: {error}") from None
    for key in ("bandwidths", "variants"):
        if key in data:
            data[key] = tuple(data[key])
    try:
        cfg = GridConfig(workloads=tuple(workloads), **data)
    except TypeError as error:
        raise ValueError(f"{path}: {error}") from None
    for w in cfg.workloads:
        extra = set(w.steps) - set(cfg.bandwidths)
        if extra:
            raise ValueError(f"{path}: workload {w.name}: step budgets for bandwidths not in the grid {sorted(extra)}")
    return cfg


def select(cfg: GridConfig, *, workloads: list[str] | None = None, bandwidths: list[str] | None = None,
           variants: list[str] | None = None, cells: list[str] | None = None, nodes: int | None = None) -> GridConfig:
    """``cfg`` narrowed to the named subsets (each must exist in it; ``cells`` also narrows workloads and
    bandwidths); an unknown name raises ``ValueError`` with the valid list."""
    chosen = cfg
    if cells:
        pairs = [split_cell(c) for c in cells]
        valid = [cell_name(w.name, b) for w, b in cfg.cells()]
        bad = [c for c in cells if c not in valid]
        if bad:
            raise ValueError(f"unknown cells {bad}; valid: {', '.join(valid)}")
        workloads = [w for w in dict.fromkeys(p[0] for p in pairs) if not workloads or w in workloads]
        bandwidths = [b for b in dict.fromkeys(p[1] for p in pairs) if not bandwidths or b in bandwidths]
        chosen = replace(chosen, only_cells=tuple(cells))
    if workloads:
        picked = tuple(cfg.workload(name) for name in workloads)
        chosen = replace(chosen, workloads=picked)
    if bandwidths:
        bad = [b for b in bandwidths if b not in cfg.bandwidths]
        if bad:
            raise ValueError(f"unknown bandwidths {bad}; valid: {', '.join(cfg.bandwidths)}")
        chosen = replace(chosen, bandwidths=tuple(bandwidths))
    if variants:
        bad = [v for v in variants if v not in cfg.variants]
        if bad:
            raise ValueError(f"variants {bad} are not in the grid; valid: {', '.join(cfg.variants)}")
        chosen = replace(chosen, variants=tuple(variants))
    if nodes is not None:
        chosen = replace(chosen, nodes=nodes)
    return chosen
