"""Local SGD (pipesgd.baselines.local_sgd: torch's post-local SGD) against a single-process reference written out by
hand: synchronous warm-up steps on the mean gradient, then each rank's own steps with the parameters averaged on
torch's schedule; identical data on every rank equals one process; state_dict resumes the trajectory bitwise."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pipesgd.baselines import LocalSGD
from pipesgd.wrapper import OptimizerWrapper
from tests.distributed import run_checks
from tests.single_process import process_group  # noqa: F401 - a fixture

TIMEOUT_S = 90.0
WORLD = 2
SYNC_EVERY, WARMUP = 3, 2
STEPS = WARMUP + 2 * SYNC_EVERY + 1  # warm-up, two periods, a step that flush() averages


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).double()


def _inner(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _batch(step: int, rank: int, same_data: bool):
    g = torch.Generator().manual_seed(2000 + 31 * step + (0 if same_data else rank))
    return torch.randn(6, 4, generator=g, dtype=torch.float64), torch.randn(6, 2, generator=g, dtype=torch.float64)


def _params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _averages_after(step: int) -> bool:
    """torch's PeriodicModelAverager: after steps WARMUP, WARMUP + SYNC_EVERY, ... (0-based)."""
    return step >= WARMUP and (step - WARMUP) % SYNC_EVERY == 0


def _reference(world: int, steps: int, same_data: bool) -> list[list[torch.Tensor]]:
    """Post-local SGD by hand in one process; the final weights of each replica."""
    models = [_model() for _ in range(world)]
    inners = [_inner(m) for m in models]

    def average():
        with torch.no_grad():
            for ps in zip(*(m.parameters() for m in models)):
                mean = sum(p.detach() for p in ps) / world
                for p in ps:
                    p.copy_(mean)

    for step in range(steps):
        for rank, m in enumerate(models):
            x, y = _batch(step, rank, same_data)
            F.mse_loss(m(x), y).backward()
        if step < WARMUP:  # synchronous: every replica applies the mean gradient
            for ps in zip(*(m.parameters() for m in models)):
                mean = sum(p.grad for p in ps) / world
                for p in ps:
                    p.grad = mean.clone()
        for opt in inners:
            opt.step()
            opt.zero_grad()
        if _averages_after(step):
            average()
    if not _averages_after(steps - 1):  # flush(): local steps since the last average
        average()
    return [_params(m) for m in models]


def _train(rank, same_data, steps=STEPS, opt=None, model=None, start=0):
    if opt is None:
        model = _model()
        opt = LocalSGD(_inner(model), model, SYNC_EVERY, warmup_steps=WARMUP)
    sent = []
    for step in range(start, steps):
        x, y = _batch(step, rank, same_data)
        F.mse_loss(opt.model(x), y).backward()
        sent.append(opt.step().bytes_sent)
        opt.zero_grad()
    return model, opt, sent


def _run(rank, world, same_data):
    model, opt, sent = _train(rank, same_data)
    opt.flush()
    return {"final": _params(model), "sent": sent}


def _resume(rank, world):
    """Stop inside the first local period, save, rebuild, continue."""
    stop = WARMUP + SYNC_EVERY - 1
    whole, whole_opt, _ = _train(rank, False)
    whole_opt.flush()
    part, part_opt, _ = _train(rank, False, steps=stop)
    saved = copy.deepcopy({"model": part.state_dict(), "opt": part_opt.state_dict()})
    model = _model()
    opt = LocalSGD(_inner(model), model, SYNC_EVERY, warmup_steps=WARMUP)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    _train(rank, False, opt=opt, model=model, start=stop)
    opt.flush()
    return {"whole": _params(whole), "resumed": _params(model)}


@pytest.fixture(scope="module")
def ranks():
    checks = {"same": (_run, True), "different": (_run, False), "resume": (_resume,)}
    return run_checks(checks, WORLD, timeout_s=TIMEOUT_S)


def test_identical_data_on_every_rank_equals_one_process(ranks):
    [alone] = _reference(1, STEPS, same_data=True)
    for result in ranks["same"]:
        for got, want in zip(result["final"], alone, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_warm_up_then_periodic_averages_of_local_steps(ranks):
    want = _reference(WORLD, STEPS, same_data=False)
    for rank, result in enumerate(ranks["different"]):
        for got, ref in zip(result["final"], want[rank], strict=True):
            torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    finals = [r["final"] for r in ranks["different"]]
    assert all(torch.equal(a, b) for a, b in zip(*finals))  # flush() left every rank on the same weights
    [alone] = _reference(1, STEPS, same_data=True)
    assert not all(torch.allclose(a, b) for a, b in zip(finals[0], alone))  # the ranks' data mattered


def test_bytes_are_the_warm_up_gradients_and_the_averages(ranks):
    sent = ranks["different"][0]["sent"]
    n_bytes = 8 * sum(p.numel() for p in _model().parameters())  # float64; ring-equivalent at 2 ranks = once
    assert sent == [n_bytes * ((step < WARMUP) + _averages_after(step)) for step in range(STEPS)]


def test_resume_continues_bitwise(ranks):
    for result in ranks["resume"]:
        assert all(torch.equal(a, b) for a, b in zip(result["whole"], result["resumed"], strict=True))


def test_world_size_one_is_the_inner_optimizer_and_refuses_bad_periods(process_group):
    plain, model = _model(), _model()
    plain_opt, opt = _inner(plain), LocalSGD(_inner(model), model, SYNC_EVERY, warmup_steps=WARMUP)
    assert isinstance(opt, OptimizerWrapper)
    for step in range(STEPS):
        for m, o, forward in ((plain, plain_opt, plain), (model, opt, opt.model)):
            x, y = _batch(step, 0, True)
            F.mse_loss(forward(x), y).backward()
            o.step()
            o.zero_grad()
    opt.flush()
    for a, b in zip(_params(plain), _params(model)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="sync_every must be at least 2"):
        LocalSGD(_inner(model), model, 1)
