"""Parameter-server baselines, the paper's "conventional approaches": synchronous PS and Downpour SGD.

``servers=0``: rank 0 serves and trains; ``servers=N``: ranks 0..N-1 serve shards, the others are workers. The
worker's half is ``ps_worker``, the server's ``ps_server``, the messages ``ps_protocol`` (docs/architecture.md,
"Parameter-server baselines"). Every worker ends with ``flush()``, every dedicated server with ``serve()``, both
with a broadcast of the final weights; a dead peer is a RuntimeError naming what was awaited, after the timeout."""
from __future__ import annotations

import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from pipesgd.accounting import StepStats
from pipesgd.baselines.ps_protocol import DONE, HEADER_FIXED, TAG_REQUEST, HyperSchema, assign_shards, wait_all
from pipesgd.baselines.ps_worker import WorkerSteps
from pipesgd.baselines.ps_server import ShardServer
from pipesgd.baselines.ps_setup import NullLock, check_params, default_timeout, repoint, share_weights

MODES = ("sync", "async")


class ParameterServer(WorkerSteps):
    """Optimizer-like wrapper: ``loss.backward(); ps.step(); ps.zero_grad()`` on workers, ``serve()`` on servers."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        model: torch.nn.Module,
        mode: str = "sync",
        servers: int = 0,
        push_every: int = 1,
        pull_every: int = 1,
        process_group=None,
        timeout_s: float | None = None,
    ) -> None:
        # Step 1: arguments.
        if mode not in MODES:
            raise ValueError(f"unknown parameter-server mode {mode!r}; valid modes: {', '.join(MODES)}")
        if push_every < 1 or pull_every < 1:
            raise ValueError(f"push_every and pull_every must be >= 1, got {push_every} and {pull_every}")
        if mode == "sync" and (push_every != 1 or pull_every != 1):
            raise ValueError("mode 'sync' pushes and pulls every step; push_every/pull_every apply to 'async' only")
        distributed = dist.is_available() and dist.is_initialized()
        self.world_size = dist.get_world_size() if distributed else 1
        self.rank = dist.get_rank() if distributed else 0
        if servers < 0 or servers >= self.world_size:
            raise ValueError(
                f"servers={servers} must be in [0, world size {self.world_size}): at least one rank must be a worker"
            )
        self.params = check_params(optimizer, model)
        self.optimizer, self.model, self.mode = optimizer, model, mode
        self.push_every, self.pull_every = push_every, pull_every
        self.server_ranks = [0] if servers == 0 else list(range(servers))
        self.worker_ranks = list(range(servers, self.world_size))
        self.is_worker = self.rank in self.worker_ranks
        self.is_server_only = not self.is_worker
        self.worker_rank = self.worker_ranks.index(self.rank) if self.is_worker else None
        self.num_workers = len(self.worker_ranks)
        self.hyper = HyperSchema(optimizer)
        self.layouts = assign_shards(self.params, self.server_ranks)

        # Step 2: a dedicated gloo group, so the trainer's collectives never interleave with ours.
        self.group = None
        if self.world_size > 1:
            timeout = timedelta(seconds=timeout_s) if timeout_s else default_timeout()
            self.group = process_group or dist.new_group(backend="gloo", timeout=timeout)
            sig = (mode, servers, push_every, pull_every, [(tuple(p.shape), str(p.dtype)) for p in self.params], self.hyper.length)
            sigs = [None] * self.world_size
            dist.all_gather_object(sigs, sig, group=self.group)
            if any(s != sig for s in sigs):
                raise ValueError(f"ranks disagree on the parameter-server setup (mode, servers, push/pull, parameters, hyperparameters): {sigs}")

            # Like DDP: every worker starts from the servers' weights.
            with torch.no_grad():
                share_weights(self.layouts, self.params, self.rank, self.group, lambda layout, bufs: layout.pack(self.params, bufs))

        # Step 3: the shard this rank serves, if any. A co-located async server keeps its own copy of
        # the weights (the worker on the same rank computes on pulled ones) and the optimizer is
        # re-pointed at that copy until flush().
        self._colocated_async = mode == "async" and self.is_worker and self.rank in self.server_ranks
        self.server: ShardServer | None = None
        if self.rank in self.server_ranks:
            layout = next(l for l in self.layouts if l.server == self.rank)
            masters = [p.detach().clone() for p in self.params] if self._colocated_async else self.params
            if self._colocated_async:
                repoint(optimizer, self.params, masters)
            self.server = ShardServer(layout, masters, optimizer, self.hyper, hyper_from_header=not self.is_worker)
        self._remote_workers = {w for w in self.worker_ranks if w != self.rank}

        # Step 4: worker state.
        self._step = 0
        self._closed = False
        self.last_stats: StepStats | None = None
        self.last_staleness: dict = {"staleness": None, "max_staleness": 0, "pushes_applied": 0, "server_version": 0}
        self._pulled_version = [0] * len(self.layouts)
        self._acc: list[torch.Tensor] | None = None  # async: gradient summed since the last push
        self._acc_version = [0] * len(self.layouts)  # async: version the oldest summed gradient saw
        self._n_acc = 0
        self._last_pushed_step: int | None = None
        self._pending: list = []  # async: in-flight push sends (works and the buffers they read)
        self._bufs: dict = {}
        self._thread: threading.Thread | None = None
        self._thread_error: BaseException | None = None
        if self._colocated_async and self._remote_workers:
            self._thread = threading.Thread(target=self._serve_thread, name="pipesgd-ps-server", daemon=True)
            self._thread.start()

    # -- the optimizer-wrapper seam (pipesgd.wrapper.OptimizerWrapper) ------------------------------
    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def step(self) -> StepStats:
        self._check_usable()
        with torch.profiler.record_function(f"pipesgd::ps_{self.mode}"), torch.no_grad():
            stats = self._step_sync() if self.mode == "sync" else self._step_async(self._step, flush=False)
        self.last_stats = stats
        self._step += 1
        return stats

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def flush(self) -> list[StepStats]:
        """End this worker's training; afterwards step() raises. Returns step 1's stats (async), else [].
        Step 1 (async): push what is summed but not pushed, wait for in-flight pushes, pull the latest weights.
        Step 2: tell the servers this worker is done; a co-located server keeps serving the others.
        Step 3: receive the final weights (every rank, dedicated servers in serve())."""
        if self._closed:
            return []
        if self.is_server_only:
            raise RuntimeError("this rank is a dedicated parameter server: call serve(), not flush()")
        self._check_usable()
        applied = []
        if self.mode == "async":
            with torch.no_grad():
                applied.append(self._step_async(self._step - 1, flush=True))
            self.last_stats = applied[-1]
        done = torch.zeros(HEADER_FIXED + self.hyper.length, dtype=torch.float64)
        done[0] = DONE
        remote = [l for l in self.layouts if l.server != self.rank]
        wait_all(
            [dist.isend(done, dst=l.server, group=self.group, tag=TAG_REQUEST) for l in remote],
            f"telling servers {[l.server for l in remote]} that worker rank {self.rank} is done",
        )
        if self.server is not None and self.mode == "sync":
            with torch.no_grad():
                while self._remote_workers:  # keep serving the workers that are still training
                    self.server.sync_round(self.group, self._remote_workers, None, self._step, self._bufs)
        if self._thread is not None:
            self._thread.join()
            self._raise_thread_error()
        self._end()
        return applied

    def finish(self) -> None:
        """``flush()`` under a second name."""
        self.flush()

    def close(self) -> None:
        """Nothing to release: the protocol ends in flush()/serve(), the group lives as long as the default one."""

    def serve(self) -> None:
        """Dedicated servers: answer workers until every one has called flush(); then share the weights."""
        if not self.is_server_only:
            raise RuntimeError("serve() is for dedicated server ranks (is_server_only); workers call step()/flush()")
        if self._closed:
            return
        with torch.no_grad():
            if self.mode == "sync":
                step = 0
                while self._remote_workers:
                    self.server.sync_round(self.group, self._remote_workers, None, step, self._bufs)
                    step += 1
            else:
                self.server.serve_async(self.group, self._remote_workers)
        self._end()

    # -- stats and state --------------------------------------------------------------------------
    @property
    def server_stats(self) -> dict | None:
        """On ranks that serve: updates, updates/s and the staleness histogram of this shard."""
        return self.server.stats() if self.server is not None else None

    @property
    def staleness_log(self) -> list[tuple[int, int, int]]:
        """On ranks that serve: (worker rank, worker step, staleness) of the most recent pushes."""
        return list(self.server.staleness_log) if self.server is not None else []

    def state_dict(self) -> dict:
        lock = self.server.lock if self.server is not None else NullLock()
        with lock:
            return {
                "mode": self.mode,
                "step": self._step,
                "optimizer": self.optimizer.state_dict(),
                "server_version": self.server.version if self.server is not None else None,
                "masters": [m.detach().clone() for m in self.server.masters] if self._colocated_async else None,
                "pulled_version": list(self._pulled_version),
                "acc": [a.detach().clone() for a in self._acc] if self._acc is not None else None,
                "acc_version": list(self._acc_version),
                "n_acc": self._n_acc,
                "last_pushed_step": self._last_pushed_step,
                "last_staleness": dict(self.last_staleness),
            }

    def load_state_dict(self, state: dict) -> None:
        if state.get("mode") != self.mode:
            raise ValueError(f"state is for parameter-server mode {state.get('mode')!r}, this wrapper runs {self.mode!r}")
        lock = self.server.lock if self.server is not None else NullLock()
        with lock, torch.no_grad():
            self.optimizer.load_state_dict(state["optimizer"])
            if self.server is not None and state["server_version"] is not None:
                self.server.version = int(state["server_version"])
            if self._colocated_async and state["masters"] is not None:
                for m, s in zip(self.server.masters, state["masters"]):
                    m.copy_(s)
            self._step = int(state["step"])
            self._pulled_version = list(state["pulled_version"])
            self._acc = [a.to(p.device) for a, p in zip(state["acc"], self.params)] if state["acc"] is not None else None
            self._acc_version = list(state["acc_version"])
            self._n_acc = int(state["n_acc"])
            self._last_pushed_step = state["last_pushed_step"]
            self.last_staleness = dict(state["last_staleness"])

    # -- the server thread and the end ------------------------------------------------------------
    def _serve_thread(self) -> None:
        try:
            with torch.no_grad():
                self.server.serve_async(self.group, self._remote_workers)
        except BaseException as exc:  # noqa: BLE001 - surfaced on the main thread by step()/flush()
            self._thread_error = exc

    def _raise_thread_error(self) -> None:
        if self._thread_error is not None:
            raise RuntimeError(f"the parameter-server thread on rank {self.rank} failed: {self._thread_error}") from self._thread_error

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("this ParameterServer has finished; build a new one to train again")
        if self.is_server_only:
            raise RuntimeError("this rank is a dedicated parameter server: call serve(), not step()/flush()")
        self._raise_thread_error()

    def _end(self) -> None:
        """Every run ends so: each server broadcasts its shard, and all ranks hold the final weights."""
        with torch.no_grad():
            share_weights(self.layouts, self.params, self.rank, self.group, lambda layout, bufs: self.server.read(bufs))
            if self._colocated_async:
                repoint(self.optimizer, self.server.masters, self.params)
        self._closed = True
