"""Other stand-ins for look-ahead, as diagnostics of the charlm gap at widths 2-3 (issue 36); not in the library.

The library's stand-in for an average still in flight is the worker's own gradient. Averaged over the workers the
stand-ins are then exactly the average, so for an update rule linear in the gradient (SGD, or Adam with its second
moment held fixed) the workers' look-ahead errors cancel to first order in what the master applies. What is left is
each error's second-order effect, and on charlm at width 3 that costs +4.2 % in validation loss, where the true
average standing in (``standin="oracle"``) costs +0.4 %. These variants test the two obvious ways to shrink it with
what a worker holds:

- ``ShrunkLookahead`` ("shrunk"): the stand-in is pulled toward an estimate of the average that every worker shares,
  ``mu + rho * (own - mu)``, where ``mu`` is an exponential average (0.9) of the averages applied so far and ``rho``
  the worker's own least-squares coefficient of the arriving average on its gradient, both measured relative to
  ``mu`` (exponential sums, 0.9; clamped to [0, 1]). Less noise per worker, but the stand-ins no longer average to
  the average unless ``rho`` is 1.
- ``FrozenMomentLookahead`` ("frozen-v"): the worker's own gradient, replayed through Adam/AdamW with the second
  moment held at the master's bias-corrected value, so that the replay is linear in the stand-in and the workers'
  errors cancel to first order even through Adam's normalisation. (No loss scaling or clipping: the simulation
  has neither.)
- "coarse" (``coarse_average``): every worker's stand-in is the mean of all workers' gradients after a q4 round trip
  (encode, decode), what an all-gather of q4 payloads beside the exact all-reduce would give each worker at an
  eighth of its bytes: the average's direction without the own error's reaction, with q4's rounding error
  ("coarse-sign": 1-bit sign with a scale per block, a 32nd of the bytes; "coarse-exchange": q4 with the mean
  encoded once more, as the library's two-collective exchange would deliver it).
- "overshoot": the library's look-ahead moved ``OVERSHOOT`` times the replayed displacement (past the weights the
  steps in flight will produce; ``OvershootLookahead``, the library's option until it lost its measurement). Not a
  stand-in but a probe of the look-ahead's reach.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from pipesgd.compression import build
from pipesgd.delay.lookahead import Lookahead

SHRINK_DECAY = 0.9  # the exponential averages of the applied averages and of the least-squares sums
OVERSHOOT = 1.2  # the "overshoot" look-ahead's reach, in replayed displacements


class OvershootLookahead(Lookahead):
    """Look-ahead whose parameters move ``reach`` times the replayed displacement: master + reach (look-ahead -
    master)."""

    def __init__(self, *args, reach: float = OVERSHOOT, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.reach = reach

    def advance(self) -> None:
        moving = not self.active and bool(self._pending)
        super().advance()
        if moving:
            with torch.no_grad():
                torch._foreach_lerp_(self.params, self._master, 1.0 - self.reach)


class ShrunkLookahead(Lookahead):
    """Look-ahead whose stand-in is ``mu + rho * (own - mu)`` (module doc); ``observe`` every applied average."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.mean_estimate: list[torch.Tensor] | None = None  # mu
        self._own: dict[int, list[torch.Tensor]] = {}  # the unshrunk gradients of the steps in flight
        self._covariance = 0.0  # <own - mu, average - mu>, exponentially summed
        self._variance = 0.0  # |own - mu|^2, exponentially summed

    @property
    def rho(self) -> float:
        """The worker's current shrinkage coefficient: 1 (its own gradient) until an average has been compared."""
        return 1.0 if self._variance == 0.0 else min(max(self._covariance / self._variance, 0.0), 1.0)

    def record(self, step: int, grads: Sequence[torch.Tensor], scale: float | None = None,
               uses: int | None = None) -> None:
        self._own[step] = [g.detach().clone() for g in grads]
        if self.mean_estimate is not None:
            grads = [m + self.rho * (g - m) for g, m in zip(grads, self.mean_estimate)]
        super().record(step, grads, scale, uses)

    def observe(self, step: int, average: Sequence[torch.Tensor]) -> None:
        """``step``'s average is applied: compare it with this worker's gradient of that step, then fold it into mu."""
        own = self._own.pop(step, None)
        if own is not None and self.mean_estimate is not None:
            mine = [o - m for o, m in zip(own, self.mean_estimate)]
            theirs = [a - m for a, m in zip(average, self.mean_estimate)]
            self._covariance = SHRINK_DECAY * self._covariance + (1 - SHRINK_DECAY) * sum(
                float(torch.dot(x.flatten(), y.flatten())) for x, y in zip(mine, theirs))
            self._variance = SHRINK_DECAY * self._variance + (1 - SHRINK_DECAY) * sum(
                float(torch.dot(x.flatten(), x.flatten())) for x in mine)
        if self.mean_estimate is None:
            self.mean_estimate = [a.detach().clone() for a in average]
        else:
            torch._foreach_lerp_(self.mean_estimate, list(average), 1 - SHRINK_DECAY)


class FrozenMomentLookahead(Lookahead):
    """Look-ahead through Adam/AdamW with the second moment held at the master's bias-corrected value (module doc)."""

    def __init__(self, optimizer: torch.optim.Optimizer, *args, **kwargs) -> None:
        if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
            raise ValueError(f"the frozen-v stand-in replays Adam or AdamW, not {type(optimizer).__name__}")
        super().__init__(optimizer, *args, **kwargs)
        self._replay = FrozenMomentReplay(optimizer, self.params)


class FrozenMomentReplay:
    """``OptimizerReplay.replay_``'s contract for ``FrozenMomentLookahead``: Adam's steps with ``v`` held."""

    state_bytes = 0  # nothing kept between replays

    def __init__(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> None:
        self.optimizer, self.params = optimizer, list(params)

    def replay_(self, steps: Sequence[tuple], skip_nonfinite: bool) -> int:
        """Move ``params`` by one step per (gradients, loss scale, writable) entry, oldest first."""
        del skip_nonfinite  # the simulation's gradients are finite and unscaled
        index = {id(p): i for i, p in enumerate(self.params)}
        decoupled = isinstance(self.optimizer, torch.optim.AdamW)
        for group in self.optimizer.param_groups:
            lr, (beta1, beta2), eps, decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                state = self.optimizer.state.get(p)
                if not state or id(p) not in index:
                    continue
                first, start = state["exp_avg"].clone(), int(state["step"])
                denominator = (state["exp_avg_sq"] / (1 - beta2 ** start)).sqrt_().add_(eps)
                for count, (grads, _scale, _writable) in enumerate(steps, start + 1):
                    grad = grads[index[id(p)]]
                    if decoupled:
                        p.mul_(1 - lr * decay)
                    elif decay:
                        grad = grad + decay * p
                    first.mul_(beta1).add_(grad, alpha=1 - beta1)
                    p.addcdiv_(first, denominator, value=-lr / (1 - beta1 ** count))
        return len(steps)


class CorrectedLookahead(Lookahead):
    """Look-ahead whose own-gradient stand-in has its predicted reaction to the worker's own look-ahead error taken
    out: ``own - c * e`` per parameter tensor, ``e`` the worker's look-ahead point less the master weights it aimed
    at (known exactly once the step in flight before it is applied) and ``c`` the worker's least-squares slope of its
    gradient's deviation from the average on ``e`` (exponential sums, ``SHRINK_DECAY``; at least 0): a scalar
    curvature per tensor standing in for the Hessian in ``g(own point) ~ g(aimed point) + H e``. Width 2 (the
    newest stand-in is the one corrected); ``observe`` every applied average."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._point: list[torch.Tensor] | None = None  # where the gradient being computed now is taken
        self._points: dict[int, list[torch.Tensor]] = {}  # step -> its gradient's look-ahead point, until corrected
        self._errors: dict[int, list[torch.Tensor]] = {}  # step -> that point less the master weights it aimed at
        self._own: dict[int, list[torch.Tensor]] = {}  # step -> the uncorrected gradient
        self._cov: list[float] | None = None  # per tensor: <own - average, e>, exponentially summed
        self._var: list[float] | None = None  # per tensor: |e|^2, exponentially summed

    def slopes(self) -> list[float]:
        if self._cov is None:
            return [0.0] * len(self.params)
        return [max(c / v, 0.0) if v > 0 else 0.0 for c, v in zip(self._cov, self._var)]

    def record(self, step: int, grads: Sequence[torch.Tensor], scale: float | None = None,
               uses: int | None = None) -> None:
        self._own[step] = [g.detach().clone() for g in grads]
        if self._point is not None:
            self._points[step], self._point = self._point, None
        super().record(step, grads, scale, uses)

    def advance(self) -> None:
        if self.active or not self._pending:
            return
        with torch.no_grad():
            for step in [s for s in self._points if s in self._pending]:  # the master now is where it aimed
                error = [q - p for q, p in zip(self._points.pop(step), self.params)]
                self._errors[step] = error
                entry = self._pending[step]
                entry.grads = [g - c * e for g, c, e in zip(entry.grads, self.slopes(), error)]
        super().advance()
        self._point = [p.detach().clone() for p in self.params]

    def observe(self, step: int, average: Sequence[torch.Tensor]) -> None:
        """``step``'s average is applied: fold its deviation against the error of its point into the slopes."""
        own, error = self._own.pop(step, None), self._errors.pop(step, None)
        self._points.pop(step, None)
        if own is None or error is None:
            return
        cov = [float(torch.dot((o - a).flatten(), e.flatten())) for o, a, e in zip(own, average, error)]
        var = [float(torch.dot(e.flatten(), e.flatten())) for e in error]
        if self._cov is None:
            self._cov, self._var = [0.0] * len(cov), [0.0] * len(var)
        self._cov = [SHRINK_DECAY * x + (1 - SHRINK_DECAY) * y for x, y in zip(self._cov, cov)]
        self._var = [SHRINK_DECAY * x + (1 - SHRINK_DECAY) * y for x, y in zip(self._var, var)]


def coarse_average(grads: Sequence[Sequence[torch.Tensor]], codec: str = "q4",
                   requantize: bool = False) -> list[torch.Tensor]:
    """The mean over workers (``grads``: per worker, per parameter) of each gradient after an encode and decode with
    ``codec`` (round to nearest), parameter by parameter; with ``requantize`` that mean once more through the codec,
    as the two-collective exchange's owners encode the sum they hand on (``pipesgd.comm.alltoall``)."""
    coder = build(codec)

    def round_trip(g: torch.Tensor) -> torch.Tensor:
        payload, ctx = coder.compress(g.reshape(-1))
        return coder.decompress(payload, ctx).reshape(g.shape)

    means = [torch.stack([round_trip(g) for g in per_param]).mean(0) for per_param in zip(*grads)]
    return [round_trip(m) for m in means] if requantize else means


class LowRankAverage:
    """Every worker's stand-in with the average's part in a shared low-rank subspace (``lowrank``): for each matrix
    gradient (first dimension by the rest), ``own - U U^T own + U U^T average``, ``U`` the ``rank`` orthonormal
    columns of one warm-started power iteration on the average (PowerSGD's: ``P = average Q``, orthonormalized; ``Q``
    for the next step ``average^T U``). What a rank would get from PowerSGD's two small all-reduces (P, then Q) of the
    step's gradient beside the exact exchange: ``rank (rows + cols)`` numbers per matrix. Vectors (biases, norms) are
    averaged exactly (their bytes are few). The stand-ins still average to the average: the projection is shared."""

    def __init__(self, rank: int = 4, seed: int = 0) -> None:
        self.rank = rank
        self._generator = torch.Generator().manual_seed(seed)
        self._state: dict[int, torch.Tensor] = {}  # parameter index -> the warm start (or the basis, when lagged)

    def standins(self, grads: Sequence[Sequence[torch.Tensor]], average: Sequence[torch.Tensor]) -> list:
        out = [list(own) for own in grads]
        for index, mean in enumerate(average):
            if mean.dim() < 2:
                for own in out:
                    own[index] = mean.clone()
                continue
            matrix = mean.reshape(mean.shape[0], -1)
            u = self._basis(index, matrix, min(self.rank, *matrix.shape))
            for own in out:
                own[index] = self._standin(own[index].reshape(matrix.shape), u, matrix).reshape(mean.shape)
        return out

    def _basis(self, index: int, matrix: torch.Tensor, rank: int) -> torch.Tensor:
        q = self._state.get(index)
        if q is None or q.shape[1] != rank:
            q = torch.randn(matrix.shape[1], rank, generator=self._generator)
        u, _ = torch.linalg.qr(matrix @ q)
        self._state[index] = matrix.T @ u
        return u

    @staticmethod
    def _standin(own: torch.Tensor, u: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
        return own - u @ (u.T @ own) + u @ (u.T @ matrix)


class LaggedLowRankAverage(LowRankAverage):
    """``LowRankAverage`` with one all-reduce on the critical path (``lowrank-lag``): the subspace ``U`` is last step's,
    so a rank needs only the average's coordinates in it, ``average^T U`` (one all-reduce), before its next forward
    pass; the next ``U`` comes from one power iteration on this step's average, ``orth(average average^T U)``, whose
    all-reduce may run after the stand-in is known. Vectors averaged whole (in the first all-reduce)."""

    def _basis(self, index: int, matrix: torch.Tensor, rank: int) -> torch.Tensor:
        u = self._state.get(index)
        if u is None:
            u, _ = torch.linalg.qr(torch.randn(matrix.shape[0], rank, generator=self._generator))
        self._state[index], _ = torch.linalg.qr(matrix @ (matrix.T @ u))  # off the critical path
        return u

    @staticmethod
    def _standin(own: torch.Tensor, u: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
        return own + u @ (matrix.T @ u - own.T @ u).T  # the one all-reduce on the critical path: matrix^T u
