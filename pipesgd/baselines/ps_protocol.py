"""Wire format of the parameter-server baselines: tags, headers, shard layout and flat buffers.

Every message has a size both ends know in advance (gloo aborts the process on a size mismatch), so
a request is a fixed-size float64 header followed by flat buffers whose sizes follow from the shard.

Messages (all tensors on CPU; ``H`` = number of hyperparameter slots of the optimizer):

- worker → server, tag ``TAG_REQUEST``: header, float64 ``[flags, worker_step, pulled_version,
  n_accumulated, hyper_0 … hyper_{H-1}]``; ``flags`` is a bit set of ``PUSH``, ``PULL``, ``DONE``.
- worker → server, tag ``TAG_GRAD`` (only with ``PUSH``): one flat buffer per dtype of the shard,
  in ``ShardLayout.dtype_groups`` order: the gradient (sync) or the gradient summed over the
  ``n_accumulated`` local steps since the last push (async).
- server → worker, tag ``TAG_REPLY`` (async, only with ``PULL``): float64 ``[server_version,
  staleness_of_this_worker's_last_applied_push, pushes_applied_for_this_worker]``.
- server → worker, tag ``TAG_WEIGHTS`` (with ``PULL``): one flat buffer per dtype, the shard's weights.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pipesgd.runlog import trace

# Step 0: request flags (a bit set, carried as a float64 in the header).
PUSH = 1
PULL = 2
DONE = 4

TAG_REQUEST = 0x5051
TAG_GRAD = 0x5052
TAG_REPLY = 0x5053
TAG_WEIGHTS = 0x5054

HEADER_FIXED = 4  # flags, worker_step, pulled_version, n_accumulated
REPLY_LEN = 3  # server_version, last_staleness, n_applied


@dataclass(frozen=True, slots=True)
class ShardLayout:
    """Which parameters one server owns and how they are packed into flat buffers."""

    server: int  # global rank of the server that owns this shard
    param_indices: tuple[int, ...]  # indices into the wrapper's parameter list, in that list's order
    dtype_groups: tuple[tuple[torch.dtype, tuple[int, ...]], ...]  # one flat buffer per dtype
    numels: tuple[int, ...]  # numel of each flat buffer, same order as dtype_groups

    @property
    def n_bytes(self) -> int:
        return sum(n * torch.empty((), dtype=d).element_size() for (d, _), n in zip(self.dtype_groups, self.numels))

    def empty_buffers(self) -> list[torch.Tensor]:
        return [torch.zeros(n, dtype=d) for (d, _), n in zip(self.dtype_groups, self.numels)]

    def pack(self, tensors: list[torch.Tensor], out: list[torch.Tensor]) -> list[torch.Tensor]:
        """Copy ``tensors[i]`` (any device) for the shard's indices into the CPU buffers ``out``."""
        for (_, indices), buf in zip(self.dtype_groups, out):
            offset = 0
            for i in indices:
                t = tensors[i]
                n = t.numel()
                buf[offset : offset + n].copy_(t.detach().reshape(-1))
                offset += n
        return out

    def unpack(self, bufs: list[torch.Tensor], targets: list[torch.Tensor]) -> None:
        """Copy the CPU buffers back into ``targets[i]`` (any device) for the shard's indices."""
        for (_, indices), buf in zip(self.dtype_groups, bufs):
            offset = 0
            for i in indices:
                t = targets[i]
                n = t.numel()
                t.copy_(buf[offset : offset + n].view_as(t))
                offset += n


def assign_shards(params: list[torch.Tensor], server_ranks: list[int]) -> list[ShardLayout]:
    """Shard whole tensors over the servers, balanced by bytes (largest first to the least loaded)."""
    load = [0] * len(server_ranks)
    owned: list[list[int]] = [[] for _ in server_ranks]
    order = sorted(range(len(params)), key=lambda i: (-params[i].numel() * params[i].element_size(), i))
    for i in order:
        s = min(range(len(server_ranks)), key=lambda k: (load[k], k))
        owned[s].append(i)
        load[s] += params[i].numel() * params[i].element_size()
    layouts = []
    for s, indices in zip(server_ranks, owned):
        indices = sorted(indices)
        dtypes: dict[torch.dtype, list[int]] = {}
        for i in indices:
            dtypes.setdefault(params[i].dtype, []).append(i)
        groups = tuple((d, tuple(ix)) for d, ix in dtypes.items())
        numels = tuple(sum(params[i].numel() for i in ix) for _, ix in groups)
        layouts.append(ShardLayout(s, tuple(indices), groups, numels))
    return layouts


class HyperSchema:
    """The float hyperparameters of an optimizer's param groups (lr, momentum, betas, …) as a flat vector.

    Dedicated servers take these from each worker's header, because only workers step LR schedulers.
    The schema is fixed at construction: keys holding a float/int (not bool) or a tuple of floats.
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.slots: list[tuple[int, str, type, int]] = []  # (group, key, kind, length)
        for g, group in enumerate(optimizer.param_groups):
            for key in sorted(k for k in group if k != "params"):
                v = group[key]
                if isinstance(v, bool) or v is None:
                    continue
                if isinstance(v, (int, float)):
                    self.slots.append((g, key, type(v), 1))
                elif isinstance(v, tuple) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
                    self.slots.append((g, key, tuple, len(v)))
        self.length = sum(n for *_, n in self.slots)

    def read(self, optimizer: torch.optim.Optimizer) -> list[float]:
        out: list[float] = []
        for g, key, kind, _ in self.slots:
            v = optimizer.param_groups[g][key]
            out.extend(float(x) for x in v) if kind is tuple else out.append(float(v))
        return out

    def write(self, optimizer: torch.optim.Optimizer, values: torch.Tensor) -> None:
        k = 0
        for g, key, kind, n in self.slots:
            vals = values[k : k + n].tolist()
            k += n
            optimizer.param_groups[g][key] = tuple(vals) if kind is tuple else (int(vals[0]) if kind is int and vals[0].is_integer() else float(vals[0]))


def wait_all(works: list, what: str, traced: str = "") -> None:
    """Wait for gloo work handles; on failure say what was awaited (a dead or silent peer, a timeout).
    ``traced``: mark the wait as a span of that name (category "wait") while ``pipesgd.runlog.trace`` records."""
    with trace.span(traced, "wait") if traced else contextlib.nullcontext():
        _wait_each(works, what)


def _wait_each(works: list, what: str) -> None:
    for w in works:
        try:
            w.wait()
        except Exception as exc:  # gloo raises RuntimeError/DistBackendError on timeout or closed peer
            raise RuntimeError(
                f"parameter server: {what} failed ({type(exc).__name__}: {exc}); a peer died, or was "
                "silent for longer than the process-group timeout"
            ) from exc


def recv_any(buf: torch.Tensor, group, tag: int, what: str) -> int:
    """Receive ``buf`` from any rank of ``group``; return the sender's global rank."""
    try:
        return dist.recv(buf, src=None, group=group, tag=tag)
    except Exception as exc:
        raise RuntimeError(
            f"parameter server: {what} failed ({type(exc).__name__}: {exc}); a worker died, or was "
            "silent for longer than the process-group timeout"
        ) from exc
