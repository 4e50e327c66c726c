"""What error feedback adds to the trainer's lossy ring, timed at the model's gradient size: the ring of each codec
with and without feedback, call by call in turn, and the difference. The codec's in-ring factor, fitted to rings
without feedback, overstates the feedback's part, and calls in turn share the drift of shared cores
(docs/timing-model.md, "What the calibration probes measure"). Every rank must call ``measure_feedback_rings``."""
from __future__ import annotations

import torch
import torch.distributed as dist

from pipesgd.comm.worker import CommWorker
from pipesgd.compression import build
from pipesgd.compression.error_feedback import ErrorFeedback
from pipesgd.measure.compute import model_load
from pipesgd.measure.timing import calls_within, median_of_slowest, time_calls
from pipesgd.comm.ring import ring_allreduce_
from pipesgd.comm.topology import RingTopology

__all__ = ["FEEDBACK_BUDGET_S", "TrainerRing", "measure_feedback_rings"]

FEEDBACK_BUDGET_S = 10.0  # each codec's timed pairs are cut to about this long (slow links stay affordable)
FEEDBACK_MIN_CALLS = 5


class TrainerRing:
    """Our ring of one lossy codec as a PipeSGD step runs it (mean over ranks), with a persistent error-feedback
    residual when ``error_feedback``; the ring's topology is made on the first call, on the thread that calls it."""

    def __init__(self, compression: str, error_feedback: bool) -> None:
        self.compressor = build(compression)
        self.feedback = ErrorFeedback(self.compressor) if error_feedback else None
        self._topology: RingTopology | None = None

    def __call__(self, tensor: torch.Tensor) -> None:
        if self._topology is None:
            self._topology = RingTopology(dist.group.WORLD)
        flat = tensor.view(-1)
        residual = self.feedback.residual("probe", flat) if self.feedback is not None else None
        ring_allreduce_(flat, self.compressor, self._topology, "mean", residual)


def measure_feedback_rings(compute: dict, compressions: tuple[str, ...], repeats: int = 30, warmup: int = 2,
                           device: str = "cpu") -> dict:
    """Per lossy codec of ``compressions``: our ring at the model's gradient size without and with error feedback, in
    turn (at most ``repeats`` pairs, cut to about ``FEEDBACK_BUDGET_S``), each call after a barrier on the background
    thread. Returns {'feedback_rings': rows of {'compression', 'n_bytes', 'pairs', 'ring_alone_s', 'ring_feedback_s',
    'feedback_s' (median of with - without; may be < 0 within the noise)}}."""
    _, _, n_bytes = model_load(compute, device)
    # random gradients: a constant one has no compression error and would spare the residual its work
    gradient = torch.randn(max(1, n_bytes // 4), generator=torch.Generator().manual_seed(dist.get_rank())).to(device)
    rows = []
    worker = CommWorker(device)
    try:
        for compression in compressions:
            if build(compression).lossless:
                continue
            plain, with_feedback = TrainerRing(compression, False), TrainerRing(compression, True)

            def pairs(count: int) -> list[tuple[float, float]]:
                return [(time_calls(lambda: plain(gradient.clone()), 1, 0, device, before=dist.barrier)[0],
                         time_calls(lambda: with_feedback(gradient.clone()), 1, 0, device, before=dist.barrier)[0])
                        for _ in range(count)]

            first = worker.submit(pairs, max(1, warmup)).wait()
            count = calls_within(FEEDBACK_BUDGET_S, median_of_slowest([a + b for a, b in first], device=device),
                                 repeats, FEEDBACK_MIN_CALLS)
            timed = worker.submit(pairs, count).wait()
            rows.append({"compression": compression, "n_bytes": float(gradient.numel() * 4), "pairs": count,
                         "ring_alone_s": median_of_slowest([a for a, _ in timed], device=device),
                         "ring_feedback_s": median_of_slowest([b for _, b in timed], device=device),
                         "feedback_s": median_of_slowest([b - a for a, b in timed], device=device)})
    finally:
        worker.close()
    return {"feedback_rings": rows}
