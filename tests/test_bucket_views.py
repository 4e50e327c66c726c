"""gradient_as_bucket_view: p.grad as views into K bucket sets (pipesgd.grads.bucket_sets), bitwise the same training as
the copying path, at world size 1 and on gloo processes, with the memory it holds."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from pipesgd import PipeSGD
from pipesgd.options import PipeSGDOptions
from tests.wrap import wrap
from tests.distributed import run_ranks
from tests.single_process import process_group  # noqa: F401 - a fixture

pytestmark = pytest.mark.usefixtures("process_group")  # PipeSGD needs a process group: one rank


def make_model(dtype=torch.float64) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3), nn.Linear(3, 2)).to(dtype)


def batch(step: int, rank: int, part: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(10_000 * step + 100 * part + rank)
    return torch.randn(4, 6, generator=g).to(dtype) * (1 + rank), torch.randn(4, 2, generator=g).to(dtype)


def loss_of(model, x, y, step: int):
    if step % 3 == 1:  # the last layer unused: its gradient is None (or stays zero) and is sent as zeros
        return nn.functional.mse_loss(model[:3](x)[:, :2], y)
    return nn.functional.mse_loss(model(x), y)


# run()'s steps that leave the last layer unused call the first layers directly, past the wrapped model's pre-hook;
# the look-ahead rightly warns of that, the same on both paths, and it is no news to the tests that compare them.
BYPASS_WARNED = pytest.mark.filterwarnings(
    "ignore:PipeSGD\\(staleness='lookahead'\\). the forward pass did not call:RuntimeWarning")


def run(views: bool, width: int = 2, warmup: int = 0, steps: int = 9, rank: int = 0, accumulate: int = 1,
        set_to_none: bool = True, dtype=torch.float64, replace_at: int | None = None, inf_at: int | None = None,
        adam: bool = False, freeze: bool = False, **options):
    """Weights and the p.grad the caller sees after every step and after flush()."""
    model = make_model(dtype)
    if freeze:  # a frozen parameter the optimizer still holds: not communicated, never a view
        model[2].bias.requires_grad_(False)
    inner = (torch.optim.Adam(model.parameters(), lr=0.01) if adam
             else torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4))
    opt = wrap(inner, model, width=width, warmup_steps=warmup, gradient_as_bucket_view=views, **options)
    seen = []
    for t in range(steps):
        for part in range(accumulate):  # several backward() before one step(): DDP's no_sync()
            x, y = batch(t, rank, part, dtype)
            loss_of(model, x, y, t).backward()
        if t == replace_at:  # the caller assigns its own gradient tensor: copied in, not lost
            model[0].weight.grad = torch.full_like(model[0].weight, 0.5)
        if t == inf_at:
            model[0].bias.grad[0] = float("inf")
        opt.step()
        seen.append(([p.detach().clone() for p in model.parameters()],
                     [None if p.grad is None else p.grad.clone() for p in model.parameters()]))
        opt.zero_grad(set_to_none=set_to_none)
    opt.flush()
    seen.append(([p.detach().clone() for p in model.parameters()], []))
    memory = opt.bucket_memory_bytes
    opt.close()
    return seen, memory


def assert_same(a, b, skipped: int | None = None):
    """Bitwise equal weights and p.grad; a gradient may be zeros on one side and None on the other only where
    zero_grad(set_to_none=True) kept a view and zeroed it (as DDP's views): the optimizer never sees either.
    After a ``skipped`` non-finite step p.grad holds the skipped average with views (as under a GradScaler),
    this step's local gradient without (the views must leave the set the ring still owns)."""
    for t, ((wa, ga), (wb, gb)) in enumerate(zip(a, b)):
        assert len(wa) == len(wb) and len(ga) == len(gb)
        for x, y in zip(wa, wb):
            assert torch.equal(x, y), f"weights differ after step {t}"
        for x, y in zip(ga, gb) if t != skipped else ():
            if x is None and y is None:  # a frozen parameter
                continue
            if x is None or y is None:
                assert torch.count_nonzero(x if y is None else y) == 0, f"p.grad differs after step {t}"
            else:
                assert torch.equal(x, y), f"p.grad differs after step {t}"


CASES = [
    dict(width=1), dict(width=2), dict(width=3, warmup=2), dict(width=2, accumulate=3),
    dict(width=2, set_to_none=False), dict(width=2, replace_at=4), dict(width=3, max_grad_norm=0.05),
    dict(width=2, warmup=1, adam=True), dict(width=2, nonfinite="skip", inf_at=5),
    dict(width=2, dtype=torch.float32, compression="q8", error_feedback=True), dict(width=2, freeze=True),
]


@BYPASS_WARNED
@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_views_train_bitwise_like_the_copying_path(case):
    """Weights and what the caller sees in p.grad after every step are the same with views as with copies."""
    views, _ = run(True, **case)
    copies, _ = run(False, **case)
    inf_at = case.get("inf_at")
    assert_same(views, copies, skipped=None if inf_at is None else inf_at + case["width"] - 1)


def test_backward_writes_into_the_bucket_the_ring_gets():
    """After the first applied step p.grad is a view into a bucket set: zero_grad() zeroes it in place, backward
    accumulates there, and step() hands exactly that memory to the ring (no copy)."""
    model = make_model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=2, warmup_steps=0)
    for t in range(4):
        x, y = batch(t, 0)
        nn.functional.mse_loss(model(x), y).backward()
        before = [p.grad.data_ptr() for p in model.parameters()]
        opt.step()
        if t >= 2:  # the gradients of step t are the set now in flight
            (handed,) = opt._pipeline.entries()[-1].handle.wait().buckets
            start, end = handed.data_ptr(), handed.data_ptr() + handed.numel() * handed.element_size()
            assert all(start <= ptr < end for ptr in before)
        if t >= 1:  # the averaged gradient applied is a view too, and zero_grad keeps it one
            ptrs = [p.grad.data_ptr() for p in model.parameters()]
            opt.zero_grad()
            assert [p.grad.data_ptr() for p in model.parameters()] == ptrs
            assert all(torch.count_nonzero(p.grad) == 0 for p in model.parameters())
        else:
            opt.zero_grad()
    opt.flush()
    opt.close()


@pytest.mark.parametrize("width", [1, 2, 3])
class CountingSGD(torch.optim.SGD):
    zero_grads = 0

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.zero_grads += 1
        super().zero_grad(set_to_none)


@pytest.mark.parametrize("freeze", [False, True])
def test_zero_grad_skips_the_optimizers_loop_only_when_every_gradient_is_a_view(freeze):
    """Once every parameter the optimizer holds views its slot, zero_grad() is one fill per bucket (the
    per-parameter loop is skipped); a frozen parameter in the optimizer, or a gradient the caller replaced, takes
    the optimizer's own zero_grad again, and that gradient follows its semantics (None)."""
    model = make_model()
    if freeze:
        model[2].bias.requires_grad_(False)
    inner = CountingSGD(model.parameters(), lr=0.1)
    opt = PipeSGD(inner, model, width=2, warmup_steps=0)
    calls = []
    for t in range(6):
        x, y = batch(t, 0)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        replaced = t == 4 and not freeze
        if replaced:  # the caller puts its own tensor in p.grad after step(): zero_grad must treat it as torch does
            model[0].weight.grad = torch.ones_like(model[0].weight)
        before = inner.zero_grads
        opt.zero_grad()
        calls.append(inner.zero_grads - before)
        if replaced:
            assert model[0].weight.grad is None
    assert calls == ([1] * 6 if freeze else [0, 0, 0, 0, 1, 0])
    assert all(torch.count_nonzero(p.grad) == 0 for p in model.parameters() if p.requires_grad)
    opt.flush()
    opt.close()


@BYPASS_WARNED
@pytest.mark.parametrize("width", [1, 2, 3])
def test_memory_is_k_gradient_sets_and_the_views_hold_p_grad(width):
    """Width K holds K bucket sets (DDP: 1); with views they are p.grad, without them p.grad comes on top."""
    grad_bytes = sum(p.numel() * 8 for p in make_model().parameters())
    _, with_views = run(True, width=width, warmup=1, steps=8)
    _, with_copies = run(False, width=width, warmup=1, steps=8)
    assert with_views == with_copies == width * grad_bytes


def test_mixed_dtypes_keep_the_copy_for_low_precision_parameters():
    """bf16 parameters travel in fp32 buckets: their p.grad stays their own bf16 tensor; fp32 ones are views."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4).to(torch.bfloat16), nn.Linear(4, 2))
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=1)
    for _ in range(2):
        h = model[0](torch.randn(3, 4, dtype=torch.bfloat16)).float()
        model[1](h).sum().backward()
        opt.step()
    assert model[0].weight.grad.dtype == torch.bfloat16 and model[0].weight.grad._base is None
    assert model[1].weight.grad._base is not None and model[1].weight.grad._base.dtype == torch.float32
    opt.zero_grad()
    assert model[0].weight.grad is None and torch.count_nonzero(model[1].weight.grad) == 0
    opt.close()


def test_zero_grad_before_any_step_follows_the_optimizer():
    model = make_model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=2)
    model(torch.randn(2, 6, dtype=torch.float64)).sum().backward()
    opt.optimizer.zero_grad()  # nothing bound yet: the optimizer's own semantics
    assert all(p.grad is None for p in model.parameters())
    opt.close()


def test_the_option_is_validated():
    with pytest.raises(ValueError, match="gradient_as_bucket_view must be True or False"):
        PipeSGDOptions(gradient_as_bucket_view="yes")


def _both(rank: int, world: int):
    return [run(views, width=2, steps=7, rank=rank, dtype=torch.float32, compression="q8", error_feedback=True,
                accumulate=2)[0] for views in (True, False)]


def test_two_ranks_with_views_match_copies_bitwise():
    for views, copies in run_ranks(_both, 2):
        assert_same(views, copies)
