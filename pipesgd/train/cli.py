"""``pipesgd-train``: parse and validate, join the process group (torchrun's env, or alone), train, summarise.

Exit codes: 0 done; 2 bad input (reported before any process group exists); 1 a failure during the run
(a dead or hung peer, an unusable checkpoint, diverging replicas, a non-finite loss). Expected failures
print one line ``pipesgd-train: error: ...``; ``--debug`` shows the traceback as well.
"""
from __future__ import annotations

import logging
import os
import random
import sys
import threading
import traceback
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from pipesgd.runlog import trace
from timing_model.cli_conventions import EXIT_FAILURE, EXIT_USAGE, join_negative_values, print_error
from pipesgd.launch import exit_process, gpu_sharing_problem, rank_gpu
from pipesgd.grads.replica_check import ReplicaDivergenceError
from pipesgd.comm.uneven import UnevenInputsError

from . import checkpoint, faults
from .checkpoint import CheckpointError, Position, RunIdentity
from .config import ConfigError, TrainConfig
from .flags import resolve
from .data import DataError, build_dataset, shard_size
from .loop import train
from .metrics import MetricsWriter, pipe_staleness, write_config_files
from .models import build_model, count_params, grad_bytes
from .outputs import check_outputs
from .report import format_summary
from .modes import num_workers_for
from .strategy import build_strategy

PROG = "pipesgd-train"


def _error(message: str) -> None:
    print_error(PROG, message)


def _launch_env() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment; (0, 1, 0) when launched alone."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    return 0, 1, 0


def check_shapes(cfg: TrainConfig, n_train: int, world_size: int) -> None:
    """Checks that need the data set and the world size (or this torch), before the process group exists."""
    workers = num_workers_for(cfg.mode, cfg.servers, world_size)
    if workers < 1:
        raise ConfigError(f"--servers {cfg.servers} leaves no training worker among {world_size} processes")
    shard = shard_size(n_train, workers)
    if cfg.batch_size > shard:
        raise ConfigError(f"--batch-size {cfg.batch_size} is larger than a worker's shard "
                          f"({shard} of {n_train} training samples over {workers} workers)")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda but no CUDA device is available")
    if cfg.optimizer == "muon" and not hasattr(torch.optim, "Muon"):
        raise ConfigError(f"--optimizer muon needs torch.optim.Muon, which this torch ({torch.__version__}) lacks")


def check_gpus(cfg: TrainConfig, local_world_size: int, gpu_count: int) -> None:
    """NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), and ranks map to GPUs by local rank."""
    problem = gpu_sharing_problem(cfg.resolved_backend, local_world_size, gpu_count) if cfg.device == "cuda" else None
    if problem:
        raise ConfigError(problem)


def init_process_group(cfg: TrainConfig, rank: int, world_size: int) -> None:
    """One code path for 1 and N ranks: torchrun's env:// rendezvous, or an in-memory store when alone."""
    timeout = timedelta(seconds=cfg.timeout)
    if world_size == 1 and "MASTER_ADDR" not in os.environ:
        dist.init_process_group(cfg.resolved_backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    else:
        # Our own client of the rendezvous store (torchrun's agent hosts it; rank 0 when started by hand),
        # with a prefix per torchrun attempt: after a restart, the default env:// path hands gloo the dead
        # ranks' stale addresses ("connectFullMesh failed ... Connection refused"), so --max-restarts with
        # --resume could never recover.
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                              is_master=not agent_store and rank == 0, timeout=timeout)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.PrefixStore(f"pipesgd/attempt_{attempt}/", store)
        dist.init_process_group(cfg.resolved_backend, store=store, rank=rank, world_size=world_size, timeout=timeout)


def _seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def run(cfg: TrainConfig, ds, rank: int, world_size: int, local_rank: int, debug: bool = False) -> None:
    """Everything after the process group exists (the code the failure handling in ``main`` wraps)."""
    if cfg.device == "cuda":
        device = rank_gpu(local_rank, cfg.resolved_backend, int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    _seed(cfg.seed)  # identical initial weights on every rank
    model = build_model(cfg.model, ds.input_shape, ds.num_classes, hidden=cfg.hidden).to(device)
    _seed(cfg.seed * 1009 + rank + 1)  # per-rank randomness from here on (dropout)
    if cfg.trace:  # before the wrappers exist: some register trace hooks only while tracing (DDP's comm hook)
        trace.enable(rank, cfg.trace_window)
    strategy = build_strategy(cfg, model, device)
    metrics, watchdog = None, None
    try:
        resumed_at = None
        if cfg.resume:
            run_id = RunIdentity(world_size, cfg.model, cfg.mode)
            resumed_at = checkpoint.restore(cfg.checkpoint, rank, run_id, model, strategy.opt, device)
        start = resumed_at or Position()
        if strategy.serve is not None:
            trace.name_thread("server")
            strategy.serve()  # a dedicated parameter server: its own waits carry the timeout
            if cfg.trace:
                trace.write(cfg.trace, rank, world_size)
            return
        metrics = MetricsWriter(cfg.metrics, rank, world_size)
        # Some waits (gloo point-to-point) have no deadline of their own: no progress for --timeout s fails.
        stalled = TimeoutError(f"no progress for {cfg.timeout:g} s")
        watchdog = faults.Watchdog(cfg.timeout, lambda: fail(stalled, cfg, rank, world_size, debug))
        if strategy.is_leader:
            n_params, n_bytes = count_params(model), grad_bytes(model)
            spe = len(ds.x_train) // strategy.num_workers // cfg.batch_size
            width = f" width {cfg.effective_width}{pipe_staleness(cfg)}" if cfg.mode == "pipe" else ""
            source = "".join(f", {key} {value}" for key, value in ds.source.items())  # a corpus made here
            print(f"{PROG}: {cfg.model} with {n_params:,} parameters ({n_bytes / 2**20:.2f} MiB of gradients) "
                  f"on {cfg.dataset_name} ({len(ds.x_train)} train / {len(ds.x_test)} test, {spe} steps/epoch "
                  f"per worker{source}); mode {cfg.mode}{width}, {world_size} ranks, batch {cfg.batch_size} per worker",
                  flush=True)
            if resumed_at is not None:
                print(f"{PROG}: resumed from {cfg.checkpoint} at step {start.step} (epoch {start.epoch})", flush=True)
            elif cfg.resume:
                print(f"{PROG}: --resume: no checkpoint in {cfg.checkpoint} yet; starting from step 0", flush=True)
            metrics.write_config(cfg, world_size=world_size, num_workers=strategy.num_workers, params=n_params,
                                 grad_bytes=n_bytes, steps_per_epoch=spe, input_shape=list(ds.input_shape),
                                 num_classes=ds.num_classes, dataset_source=ds.source,
                                 resumed_at_step=start.step if resumed_at is not None else None,
                                 allreduce=getattr(strategy.opt, "allreduce", None))
            write_config_files(cfg)
        summary = train(cfg, ds, model, strategy, device, metrics, rank, world_size, start, watchdog)
        if summary is not None:  # before the trace: a trace that cannot be written must not cost the summary
            choice = getattr(strategy.opt, "auto_choice", None)
            if choice is not None:  # --width/--compression auto: the last choice, and the all-reduce it runs in
                summary["auto_choice"] = {**{k: choice.get(k) for k in ("width", "compression", "error_feedback",
                                                                         "reason", "step")},
                                          "allreduce": strategy.opt.allreduce}
            metrics.write_summary(summary)
            print(format_summary(cfg, summary), flush=True)
        if cfg.trace:
            trace.write(cfg.trace, rank, world_size)
    finally:
        if watchdog is not None:
            watchdog.stop()
        if metrics is not None:
            metrics.close()
        strategy.opt.close()


def _show_library_log() -> None:
    """pipesgd's INFO lines on stdout, unless the caller configured that logger already."""
    logger = logging.getLogger("pipesgd")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def main(argv: list[str] | None = None) -> int:
    # Step 1: everything that can be checked without peers, so bad input never leaves ranks waiting.
    argv = join_negative_values(sys.argv[1:] if argv is None else list(argv))  # --lr -1 reaches its check
    debug = "--debug" in argv
    try:
        cfg = resolve(argv)
        rank, world_size, local_rank = _launch_env()
        check_outputs(cfg, rank, world_size)
        torch.set_num_threads(cfg.threads)
        ds = build_dataset(cfg)
        check_shapes(cfg, len(ds.x_train), world_size)
        check_gpus(cfg, int(os.environ.get("LOCAL_WORLD_SIZE", world_size)), torch.cuda.device_count())
    except (ConfigError, DataError) as exc:
        if debug:
            traceback.print_exc()
        _error(str(exc))
        return EXIT_USAGE
    # Step 2: join the others; from here a failure may be a peer's.
    try:
        init_process_group(cfg, rank, world_size)
    except Exception as exc:  # noqa: BLE001 - rendezvous failures come in many types
        if debug:
            traceback.print_exc()
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        _error(f"rank {rank}: could not join the process group within {cfg.timeout:g} s: {first}")
        return EXIT_FAILURE
    # Step 3: train (the library's one-time lines, e.g. what --compression auto chose, on stdout).
    _show_library_log()
    try:
        run(cfg, ds, rank, world_size, local_rank, debug)
    except BaseException as exc:  # noqa: BLE001 - classified in fail(); bugs keep their traceback
        fail(exc, cfg, rank, world_size, debug)
    # Step 4: leave together, so no rank tears its connections down while a peer is still evaluating or flushing.
    # (The console entry then ends without interpreter teardown: see entry().)
    try:
        dist.barrier()
    except Exception as exc:  # noqa: BLE001 - a peer that vanished after finishing its work
        _error(f"rank {rank}: finished, but a peer did not reach the final barrier: {str(exc).splitlines()[0][:200]}")
        os._exit(EXIT_FAILURE)
    dist.destroy_process_group()
    return 0


def entry() -> None:
    """The ``pipesgd-train`` / ``python -m pipesgd.train`` entry: ``main()``, then the process ends without the
    interpreter's teardown, which can abort after a DDP run (``pipesgd.launch.exit_process`` says why)."""
    exit_process(main())


_fail_lock = threading.Lock()


def fail(exc: BaseException, cfg: TrainConfig, rank: int, world_size: int, debug: bool) -> None:
    """Report a failure during the run in one line (plus a traceback for bugs or --debug) and exit 1.

    Called from the main thread or the watchdog's; the first caller reports, a second one just waits.
    """
    if not _fail_lock.acquire(blocking=True, timeout=30):
        os._exit(EXIT_FAILURE)
    peer = faults.is_peer_failure(exc)
    # Failures with a message meant for the user: one line, no traceback (unless --debug).
    # (OSError: a result that could not be written, e.g. a full disk; the paths were checked before the run)
    expected = peer or isinstance(exc, (CheckpointError, FloatingPointError, OSError, ReplicaDivergenceError,
                                        UnevenInputsError))
    if isinstance(exc, KeyboardInterrupt):
        _error(f"rank {rank}: interrupted")
    else:
        if not expected or debug:
            traceback.print_exception(exc)
        if peer:
            _error(faults.describe_failure(exc, rank, world_size, cfg.timeout))
        else:
            _error(f"rank {rank}: {(str(exc).strip().splitlines() or [type(exc).__name__])[0]}")
    # Peers may be gone and background threads blocked on them: leave without waiting for either.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_FAILURE)
