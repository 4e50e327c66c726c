"""The server side of the parameter-server baselines: one shard's weights, its optimizer, its loops.

``sync_round`` serves one synchronous step of every live worker; ``serve_async`` applies pushes as they arrive
(Downpour SGD) until every worker is done. Traced: receive, apply and send spans (``serve_async`` on the "server"
row); the workers mark push, pull and wait."""
from __future__ import annotations

import collections
import threading
import time

import torch
import torch.distributed as dist

from pipesgd.runlog import trace

from pipesgd.baselines.ps_protocol import (
    DONE,
    HEADER_FIXED,
    PULL,
    PUSH,
    TAG_GRAD,
    TAG_REPLY,
    TAG_REQUEST,
    TAG_WEIGHTS,
    HyperSchema,
    ShardLayout,
    recv_any,
    wait_all,
)

STALENESS_LOG_LEN = 100_000  # most recent pushes kept in ``ShardServer.staleness_log``


class ShardServer:
    """Authoritative weights of one shard plus the optimizer that updates them; thread-safe."""

    def __init__(
        self,
        layout: ShardLayout,
        masters: list[torch.Tensor],
        optimizer: torch.optim.Optimizer,
        hyper: HyperSchema,
        hyper_from_header: bool,
    ) -> None:
        self.layout = layout
        self.masters = masters  # indexed like the wrapper's parameter list; only the shard's are used
        self.optimizer = optimizer
        self.hyper = hyper
        self.hyper_from_header = hyper_from_header  # dedicated servers: workers step the LR schedulers
        self.lock = threading.Lock()
        self.version = 0  # number of updates applied to this shard
        # Staleness records: (worker global rank, worker step, staleness) per applied push.
        self.staleness_log: collections.deque = collections.deque(maxlen=STALENESS_LOG_LEN)
        self.staleness_hist: collections.Counter = collections.Counter()
        self.last_for_worker: dict[int, tuple[int, int]] = {}  # rank -> (last staleness, pushes applied)
        self.t_first_update: float | None = None
        self.t_last_update: float | None = None

    # -- the two operations every mode is made of ------------------------------------------------
    def apply(self, grads: list[torch.Tensor], hyper: torch.Tensor | None, pulled_version: int, worker: int, step: int) -> float:
        """Apply one gradient (flat CPU buffers) with the optimizer; return the optimizer's seconds."""
        with self.lock:
            staleness = self.version - pulled_version
            shard = [self.masters[i] for i in self.layout.param_indices]
            for (_, indices), buf in zip(self.layout.dtype_groups, grads):
                offset = 0
                for i in indices:
                    p = self.masters[i]
                    p.grad = buf[offset : offset + p.numel()].view_as(p).to(p.device)
                    offset += p.numel()
            if hyper is not None:
                self.hyper.write(self.optimizer, hyper)
            t0 = time.perf_counter()
            with torch.profiler.record_function("pipesgd::ps_update"):
                self.optimizer.step()
            t_update = time.perf_counter() - t0
            for p in shard:
                p.grad = None
            self.version += 1
            self.staleness_log.append((worker, step, staleness))
            self.staleness_hist[staleness] += 1
            _, n = self.last_for_worker.get(worker, (0, 0))
            self.last_for_worker[worker] = (staleness, n + 1)
            now = time.perf_counter()
            self.t_first_update = self.t_first_update or now
            self.t_last_update = now
            return t_update

    def read(self, out: list[torch.Tensor]) -> int:
        """Pack the shard's weights into the CPU buffers ``out``; return the version they hold."""
        with self.lock:
            self.layout.pack(self.masters, out)
            return self.version

    def reply_for(self, worker: int, version: int) -> torch.Tensor:
        staleness, n = self.last_for_worker.get(worker, (-1, 0))
        return torch.tensor([version, staleness, n], dtype=torch.float64)

    def stats(self) -> dict:
        """Throughput and staleness of this shard's updates so far."""
        n = sum(self.staleness_hist.values())
        span = (self.t_last_update - self.t_first_update) if n > 1 else 0.0
        return {
            "server": self.layout.server,
            "updates": self.version,
            "updates_per_s": (n - 1) / span if span > 0 else None,
            "staleness_mean": sum(s * c for s, c in self.staleness_hist.items()) / n if n else None,
            "staleness_max": max(self.staleness_hist) if n else None,
            "staleness_hist": dict(sorted(self.staleness_hist.items())),
        }

    # -- synchronous mode --------------------------------------------------------------------------
    def sync_round(self, group, live: set[int], local: list[torch.Tensor] | None, step: int, bufs: dict) -> dict:
        """One synchronous step: gather every live worker's push, average, update, send weights back. ``local``: the
        co-located worker's gradient or None; workers that send DONE leave ``live``. Returns bytes sent and seconds spent."""
        t0 = time.perf_counter()
        trace.set_step(step)  # a dedicated server's trace window follows the workers' steps
        receive = trace.span("receive", "server")
        receive.__enter__()
        order = sorted(live)
        n_hdr = HEADER_FIXED + self.hyper.length
        headers = {w: bufs.setdefault(("hdr", w), torch.zeros(n_hdr, dtype=torch.float64)) for w in order}
        # Step 1: one header from every live worker (push or done).
        wait_all(
            [dist.irecv(headers[w], src=w, group=group, tag=TAG_REQUEST) for w in order],
            f"waiting for step {step}'s push from workers {order}",
        )
        flags = {w: int(headers[w][0]) for w in order}
        pushers = [w for w in order if flags[w] & PUSH]
        live.difference_update(w for w in order if flags[w] & DONE)
        # Step 2: the pushed gradients.
        grads = {w: bufs.setdefault(("grad", w), self.layout.empty_buffers()) for w in pushers}
        wait_all(
            [dist.irecv(b, src=w, group=group, tag=TAG_GRAD) for w in pushers for b in grads[w]],
            f"receiving step {step}'s gradients from workers {pushers}",
        )
        receive.__exit__(None, None, None)
        contributions = ([local] if local is not None else []) + [grads[w] for w in pushers]
        t_update, n_sent = 0.0, 0
        if contributions:
            apply = trace.span("apply", "server")
            apply.__enter__()
            # Step 3: average in a fixed order (co-located worker first, then by rank) and update.
            mean = bufs.setdefault("mean", self.layout.empty_buffers())
            for k, m in enumerate(mean):
                m.copy_(contributions[0][k])
                for c in contributions[1:]:
                    m.add_(c[k])
                m.div_(len(contributions))
            hyper = headers[pushers[0]][HEADER_FIXED:] if (self.hyper_from_header and pushers) else None
            t_update = self.apply(mean, hyper, self.version, self.layout.server, step)
            apply.__exit__(None, None, None)
            # Step 4: send the new weights to every worker that asked for them.
            pullers = [w for w in pushers if flags[w] & PULL]
            with trace.span("send", "server"):
                out = self.layout.pack(self.masters, bufs.setdefault("out", self.layout.empty_buffers()))
                wait_all(
                    [dist.isend(b, dst=w, group=group, tag=TAG_WEIGHTS) for w in pullers for b in out],
                    f"sending step {step}'s weights to workers {pullers}",
                )
            n_sent = len(pullers) * self.layout.n_bytes
        return {"bytes_sent": n_sent, "t_update_s": t_update, "t_wait_s": time.perf_counter() - t0 - t_update}

    # -- asynchronous mode (Downpour) -------------------------------------------------------------
    def serve_async(self, group, live: set[int]) -> None:
        """Answer requests from any worker, one at a time, until every worker in ``live`` is done."""
        trace.name_thread("server")  # its own row (a co-located server runs this on a thread of its own)
        header = torch.zeros(HEADER_FIXED + self.hyper.length, dtype=torch.float64)
        grads = self.layout.empty_buffers()
        out = self.layout.empty_buffers()
        while live:
            src = recv_any(header, group, TAG_REQUEST, f"server rank {self.layout.server} waiting for a request from workers {sorted(live)}")
            flags, step, pulled_version = int(header[0]), int(header[1]), int(header[2])
            # Each span names the request's step, which decides whether it is traced (``trace.record``). Not
            # ``set_step``: that is this rank's own loop's, and a co-located server serving another worker's step
            # moved it (closing the window while that worker lagged, so the server's row lost apply and send).
            args = {"worker": src, "step": step}
            if flags & PUSH:
                with trace.span("receive", "server", args):
                    wait_all(
                        [dist.irecv(b, src=src, group=group, tag=TAG_GRAD) for b in grads],
                        f"receiving the gradient pushed by worker rank {src} at its step {step}",
                    )
                hyper = header[HEADER_FIXED:].clone() if self.hyper_from_header else None
                with trace.span("apply", "server", args):
                    self.apply(grads, hyper, pulled_version, src, step)
            if flags & PULL:
                with trace.span("send", "server", args):
                    version = self.read(out)
                    reply = self.reply_for(src, version)
                    wait_all(
                        [dist.isend(reply, dst=src, group=group, tag=TAG_REPLY)]
                        + [dist.isend(b, dst=src, group=group, tag=TAG_WEIGHTS) for b in out],
                        f"sending weights to worker rank {src}",
                    )
            if flags & DONE:
                live.discard(src)
