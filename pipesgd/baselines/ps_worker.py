"""The worker's half of the parameter-server protocol (``pipesgd.baselines.parameter_server``), on its gloo group.

- sync: every step a worker sends its gradient to every server and waits for the new weights.
- async (Downpour SGD, Dean et al. 2012): a worker pushes its summed gradients every ``push_every`` steps (at most
  one request per server in flight) and pulls weights every ``pull_every`` steps (blocking; one combined request
  when a step does both), recording the staleness the servers report (``last_staleness``).
A co-located server (rank 0 with ``servers=0``) is called in-process."""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from pipesgd.runlog import trace
from pipesgd.accounting import StepStats
from pipesgd.baselines.ps_protocol import PULL, PUSH, REPLY_LEN, TAG_GRAD, TAG_REPLY, TAG_REQUEST, TAG_WEIGHTS, wait_all


class WorkerSteps:
    """A worker's step in either mode, as a base of ``ParameterServer``, whose constructor sets the state it reads:
    ``params``, ``optimizer``, ``layouts``, ``server`` (this rank's shard server or None), ``group``, ``rank``, the
    push and pull periods, the accumulator of unpushed gradients and the buffers reused between steps."""

    # -- sync ---------------------------------------------------------------------------------------
    def _step_sync(self) -> StepStats:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        if self.server is not None:  # co-located: this rank runs the round itself
            layout = self.server.layout
            local = layout.pack(grads, self._buf("local", layout))
            r = self.server.sync_round(self.group, self._remote_workers, local, self._step, self._bufs)
            return StepStats(self._step, self._step, t_wait_s=r["t_wait_s"], t_update_s=r["t_update_s"], bytes_sent=r["bytes_sent"])
        t0 = time.perf_counter()
        header = self._header(PUSH | PULL, self._step, 0, 1)
        sends, recvs, n_bytes = [], [], 0
        with trace.span("push", "comm"):
            for k, layout in enumerate(self.layouts):
                out = layout.pack(grads, self._buf(("grad", k), layout))
                sends += [dist.isend(header, dst=layout.server, group=self.group, tag=TAG_REQUEST)]
                sends += [dist.isend(b, dst=layout.server, group=self.group, tag=TAG_GRAD) for b in out]
                inb = self._buf(("weights", k), layout)
                recvs += [dist.irecv(b, src=layout.server, group=self.group, tag=TAG_WEIGHTS) for b in inb]
                n_bytes += header.numel() * 8 + layout.n_bytes
        wait_all(sends + recvs, f"step {self._step}: push to and pull from servers {self.server_ranks}", traced="pull")
        for k, layout in enumerate(self.layouts):
            layout.unpack(self._bufs[("weights", k)], self.params)
        return StepStats(self._step, self._step, t_wait_s=time.perf_counter() - t0, bytes_sent=n_bytes)

    # -- async (Downpour) ---------------------------------------------------------------------------
    def _step_async(self, step: int, flush: bool) -> StepStats:
        if not flush:
            # Step 1: sum the gradient into the push accumulator.
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
            if self._n_acc == 0:
                self._acc_version = list(self._pulled_version)
                self._acc = [g.detach().clone() for g in grads] if self.push_every > 1 else grads
            else:
                for a, g in zip(self._acc, grads):
                    a.add_(g)
            self._n_acc += 1
        push = self._n_acc > 0 and (flush or (step + 1) % self.push_every == 0)
        pull = flush or (step + 1) % self.pull_every == 0
        t_wait = t_update = 0.0
        n_bytes = 0
        flags = (PUSH if push else 0) | (PULL if pull else 0)
        if flags:
            # Step 2: one request per server; pushes may stay in flight, pulls are waited for.
            t0 = time.perf_counter()
            self._wait_pending()
            replies, recvs, posted_ns = {}, [], time.time_ns()
            for k, layout in enumerate(self.layouts):
                if layout.server == self.rank:
                    if push:
                        out = layout.pack(self._acc, self._buf(("grad", k), layout))
                        t_update += self.server.apply(out, None, self._acc_version[k], self.rank, step)
                    if pull:
                        version = self.server.read(self._buf(("weights", k), layout))
                        replies[k] = self.server.reply_for(self.rank, version)
                    continue
                header = self._header(flags, step, self._acc_version[k], self._n_acc)
                sends = [dist.isend(header, dst=layout.server, group=self.group, tag=TAG_REQUEST)]
                n_bytes += header.numel() * 8
                if push:
                    out = layout.pack(self._acc, self._buf(("grad", k), layout, fresh=True))
                    sends += [dist.isend(b, dst=layout.server, group=self.group, tag=TAG_GRAD) for b in out]
                    n_bytes += layout.n_bytes
                self._pending.append((sends, [header] + (out if push else [])))
                if pull:
                    replies[k] = torch.zeros(REPLY_LEN, dtype=torch.float64)
                    recvs += [dist.irecv(replies[k], src=layout.server, group=self.group, tag=TAG_REPLY)]
                    recvs += [dist.irecv(b, src=layout.server, group=self.group, tag=TAG_WEIGHTS) for b in self._buf(("weights", k), layout)]
            trace.record("push" if push else "request", posted_ns, time.time_ns(), "comm")
            if pull:
                wait_all(recvs, f"step {step}: pulling weights from servers {self.server_ranks}", traced="pull")
                self._wait_pending()
            if flush:
                self._wait_pending()
            t_wait = time.perf_counter() - t0 - t_update
        applied = None
        if push:
            self._last_pushed_step, self._n_acc, self._acc = step, 0, None
        if pull:
            # Step 3: the pulled weights replace the worker's; record what the servers reported.
            for k, layout in enumerate(self.layouts):
                layout.unpack(self._bufs[("weights", k)], self.params)
            applied = self._last_pushed_step
            self._record_replies(replies)
        return StepStats(step, applied, t_wait_s=t_wait, t_update_s=t_update, bytes_sent=n_bytes)

    def _record_replies(self, replies: dict) -> None:
        versions = {k: int(r[0]) for k, r in replies.items()}
        for k, v in versions.items():
            self._pulled_version[k] = v
        reported = [int(r[1]) for r in replies.values() if int(r[2]) > 0]
        s = self.last_staleness
        if reported:
            s["staleness"] = max(reported)
            s["max_staleness"] = max(s["max_staleness"], s["staleness"])
        s["pushes_applied"] = max(int(r[2]) for r in replies.values())
        s["server_version"] = max(versions.values())

    def _wait_pending(self) -> None:
        pending, self._pending = self._pending, []
        wait_all([w for works, _ in pending for w in works], "pushing gradients to the servers", traced="wait")

    # -- helpers -----------------------------------------------------------------------------------
    def _header(self, flags: int, step: int, version: int, n_acc: int) -> torch.Tensor:
        return torch.tensor([flags, step, version, n_acc] + self.hyper.read(self.optimizer), dtype=torch.float64)

    def _buf(self, key, layout, fresh: bool = False) -> list[torch.Tensor]:
        if fresh:  # a buffer an in-flight isend may still read
            return layout.empty_buffers()
        if key not in self._bufs:
            self._bufs[key] = layout.empty_buffers()
        return self._bufs[key]
