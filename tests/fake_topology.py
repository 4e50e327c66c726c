"""A fake ring topology for logic tests without processes: two ranks holding the same data, so every piece
sent comes straight back as the one received. Subclasses record what happens around the wait."""
from __future__ import annotations

import torch


class LoopbackTopology:
    """A ring of two ranks holding the same data: every piece sent comes straight back as the one received."""

    size, rank, batched = 2, 0, False

    def scratch(self, numel, dtype, device):
        return torch.empty(numel, dtype=dtype, device=device)

    def forwards_on_host(self, device) -> bool:  # only where gloo carries CUDA tensors
        return False

    def exchange_pieces(self, n_send, make_payload, recv_bufs, on_receive, while_waiting=None):
        sent = [make_payload(k) for k in range(n_send)]
        self.sends_posted()
        if while_waiting is not None:
            while_waiting()
        self.waiting()
        for k, (payload, buf) in enumerate(zip(sent, recv_bufs)):
            buf.copy_(payload)
            on_receive(k, buf)
        return sent

    def sends_posted(self) -> None:
        """Called once a hop's sends are all posted (before ``while_waiting``)."""

    def waiting(self) -> None:
        """Called when the hop would start waiting on its receives (after ``while_waiting``)."""
