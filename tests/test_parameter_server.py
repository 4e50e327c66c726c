"""Parameter-server baselines: sync equals global-batch SGD, async (Downpour) semantics, staleness, ending."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pipesgd.baselines import ParameterServer
from pipesgd.wrapper import OptimizerWrapper
from tests.distributed import run_ranks

PER_WORKER = 4  # samples per worker per step
TIMEOUT_S = 90.0


# -- shared pieces (module level: spawned ranks import them) -------------------------------------
def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).double()


def _batch(step: int, n_workers: int, worker: int | None = None):
    """The global batch of ``step`` (all workers' samples); ``worker`` selects that worker's slice."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(n_workers * PER_WORKER, 4, generator=g, dtype=torch.float64)
    y = torch.randn(n_workers * PER_WORKER, 2, generator=g, dtype=torch.float64)
    if worker is None:
        return x, y
    sl = slice(worker * PER_WORKER, (worker + 1) * PER_WORKER)
    return x[sl], y[sl]


def _sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _reference(steps: int, n_workers: int, scheduler: bool = False) -> list[torch.Tensor]:
    """Single-process synchronous SGD on the concatenated batch."""
    model = _mlp()
    opt = _sgd(model)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5) if scheduler else None
    for t in range(steps):
        x, y = _batch(t, n_workers)
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        if sched:
            sched.step()
    return [p.detach().clone() for p in model.parameters()]


def _params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _numpy(tensors) -> list:
    """Results cross the process boundary as numpy: torch tensors in a torch.multiprocessing queue are
    shared through file descriptors that vanish when the rank process exits."""
    return [t.numpy() for t in tensors]


def _assert_close(a, b, rtol=1e-5, atol=1e-8):
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(torch.as_tensor(x), torch.as_tensor(y), rtol=rtol, atol=atol)


# -- synchronous -------------------------------------------------------------------------------
def _sync_rank(rank, world, servers, steps, scheduler, extra_steps):
    model = _mlp(0 if rank < max(servers, 1) else 100 + rank)  # workers start from the servers' weights
    opt = _sgd(model)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5) if scheduler else None
    ps = ParameterServer(opt, model, mode="sync", servers=servers)
    applied = []
    if ps.is_server_only:
        ps.serve()
    else:
        # ``extra_steps`` gives later workers more steps: finish() must not hang when workers end apart.
        for t in range(steps + extra_steps * ps.worker_rank):
            x, y = _batch(t, ps.num_workers, ps.worker_rank)
            F.mse_loss(model(x), y).backward()
            stats = ps.step()
            ps.zero_grad()
            applied.append(stats.applied_step)
            if sched:
                sched.step()
            if t == steps - 1:
                before_finish = _numpy(_params(model))
        ps.finish()
        return {"at_steps": before_finish, "final": _numpy(_params(model)), "applied": applied, "worker": ps.worker_rank}
    return {"final": _numpy(_params(model)), "server": True}


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_sync_colocated_equals_global_batch_sgd(world):
    steps = 4
    results = run_ranks(_sync_rank, world, 0, steps, False, 0, timeout_s=TIMEOUT_S)
    ref = _reference(steps, world)
    for r in results:
        _assert_close(r["at_steps"], ref)
        _assert_close(r["final"], ref)  # finish() broadcasts the server's weights
        assert r["applied"] == list(range(steps))


@pytest.mark.slow  # 3 ranks
def test_sync_dedicated_server_equals_global_batch_sgd_with_scheduler():
    steps = 5
    results = run_ranks(_sync_rank, 3, 1, steps, True, 0, timeout_s=TIMEOUT_S)
    ref = _reference(steps, 2, scheduler=True)  # LR comes from the workers' scheduler via the header
    for r in results:
        _assert_close(r["final"], ref)
    assert results[0].get("server") and results[1]["worker"] == 0 and results[2]["worker"] == 1


@pytest.mark.slow
def test_sync_two_sharded_servers_and_uneven_finish():
    steps = 3
    # 2 dedicated servers (the MLP's 4 tensors sharded over them) + 2 workers; worker 1 runs 1 more step.
    results = run_ranks(_sync_rank, 4, 2, steps, False, 1, timeout_s=TIMEOUT_S)
    _assert_close(results[2]["at_steps"], _reference(steps, 2))
    for r in results[1:]:  # every rank ends with the same final weights
        _assert_close(r["final"], results[0]["final"], rtol=0, atol=0)


# -- asynchronous (Downpour) ---------------------------------------------------------------------
def _downpour_reference(steps, push_every, pull_every):
    """One worker, simulated: gradients on the last pulled weights, summed, pushed, pulled."""
    worker, server = _mlp(), _mlp()
    opt = _sgd(server)
    acc, version, acc_version, pulled, staleness = None, 0, 0, 0, []
    for t in range(steps):
        x, y = _batch(t, 1)
        worker.zero_grad()
        F.mse_loss(worker(x), y).backward()
        grads = [p.grad.clone() for p in worker.parameters()]
        if acc is None:
            acc, acc_version = grads, pulled
        else:
            acc = [a + g for a, g in zip(acc, grads)]
        if (t + 1) % push_every == 0:
            for p, a in zip(server.parameters(), acc):
                p.grad = a
            opt.step()
            staleness.append(version - acc_version)
            version, acc = version + 1, None
        if (t + 1) % pull_every == 0:
            worker.load_state_dict(server.state_dict())
            pulled = version
    if acc is not None:  # flush
        for p, a in zip(server.parameters(), acc):
            p.grad = a
        opt.step()
        staleness.append(version - acc_version)
    return _params(server), staleness


@pytest.mark.parametrize("push_every,pull_every", [(1, 1), (1, 3), (2, 3)])
def test_async_single_worker_in_process_matches_downpour_reference(push_every, pull_every):
    steps = 7
    model = _mlp()
    ps = ParameterServer(_sgd(model), model, mode="async", push_every=push_every, pull_every=pull_every)
    applied = []
    for t in range(steps):
        x, y = _batch(t, 1)
        F.mse_loss(model(x), y).backward()
        applied.append(ps.step().applied_step)
        ps.zero_grad()
    ps.finish()
    ref, staleness = _downpour_reference(steps, push_every, pull_every)
    _assert_close(_params(model), ref)
    assert [s for _, _, s in ps.staleness_log] == staleness
    if (push_every, pull_every) == (1, 1):
        assert staleness == [0] * steps and applied == list(range(steps))  # plain SGD
        _assert_close(ref, _reference(steps, 1))
    if (push_every, pull_every) == (1, 3):
        assert staleness == [0, 1, 2, 0, 1, 2, 0] and applied == [None, None, 2, None, None, 5, None]
    assert ps.server_stats["updates"] == len(staleness)


def _async_one_worker_rank(rank, world, steps):
    model = _mlp()
    ps = ParameterServer(_sgd(model), model, mode="async", servers=1)
    if ps.is_server_only:
        ps.serve()
        return {"final": _numpy(_params(model)), "log": ps.staleness_log}
    for t in range(steps):
        x, y = _batch(t, 1)
        F.mse_loss(model(x), y).backward()
        assert ps.step().applied_step == t
        ps.zero_grad()
    ps.finish()
    return {"final": _numpy(_params(model)), "last": ps.last_staleness}


@pytest.mark.slow
def test_async_one_worker_dedicated_server_equals_plain_sgd():
    steps = 5
    server, worker = run_ranks(_async_one_worker_rank, 2, steps, timeout_s=TIMEOUT_S)
    ref = _reference(steps, 1)
    _assert_close(worker["final"], ref)
    _assert_close(server["final"], ref)
    assert [s for _, _, s in server["log"]] == [0] * steps
    assert worker["last"]["staleness"] == 0 and worker["last"]["pushes_applied"] == steps


def _lsq_rank(rank, world, servers, steps, push_every, pull_every):
    """Least squares y = X w*, each worker with its own data stream; async Downpour."""
    torch.manual_seed(rank)  # the constructor hands every worker the servers' weights
    model = nn.Linear(6, 1, bias=False).double()
    w_star = torch.arange(1.0, 7.0, dtype=torch.float64).unsqueeze(0) / 6
    ps = ParameterServer(torch.optim.SGD(model.parameters(), lr=0.05), model, mode="async",
                         servers=servers, push_every=push_every, pull_every=pull_every)
    if ps.is_server_only:
        ps.serve()
        return {"stats": ps.server_stats, "log": ps.staleness_log, "w": _params(model)[0].numpy()}
    g = torch.Generator().manual_seed(100 + ps.worker_rank)
    for _ in range(steps):
        x = torch.randn(8, 6, generator=g, dtype=torch.float64)
        F.mse_loss(model(x), x @ w_star.T).backward()
        ps.step()
        ps.zero_grad()
    ps.finish()
    return {"stats": ps.server_stats, "log": ps.staleness_log, "w": _params(model)[0].numpy(),
            "err": float((model.weight.detach() - w_star).norm() / w_star.norm())}


def _check_lsq(results, steps, push_every, n_workers):
    server = results[0]
    pushes_per_worker = -(-steps // push_every)
    stats, log = server["stats"], server["log"]
    assert stats["updates"] == n_workers * pushes_per_worker == len(log)
    stale = [s for _, _, s in log]
    # Bound: with pull_every == push_every a worker's own pushes add no staleness, and between its pull
    # and its next push at most every push of the other workers can be applied.
    assert 0 <= min(stale) and max(stale) <= (n_workers - 1) * pushes_per_worker
    assert stats["staleness_max"] == max(stale)
    for r in results:  # finish() leaves every rank with the server's final weights
        torch.testing.assert_close(torch.as_tensor(r["w"]), torch.as_tensor(server["w"]), rtol=0, atol=0)
    for r in results:
        if "err" in r:
            assert r["err"] < 0.05, r["err"]


@pytest.mark.slow  # 3 ranks
def test_async_two_workers_dedicated_server_converges_with_bounded_staleness():
    steps = 60
    results = run_ranks(_lsq_rank, 3, 1, steps, 1, 1, timeout_s=TIMEOUT_S)
    _check_lsq(results, steps, 1, 2)


@pytest.mark.slow
def test_async_colocated_server_thread_converges():
    steps = 60
    results = run_ranks(_lsq_rank, 2, 0, steps, 2, 2, timeout_s=TIMEOUT_S)  # rank 0 serves in a thread
    _check_lsq(results, steps, 2, 2)
    assert results[1]["stats"] is None  # rank 1 is a plain worker


# -- a dead peer ---------------------------------------------------------------------------------
def _dead_worker_rank(rank, world):
    model = _mlp()
    ps = ParameterServer(_sgd(model), model, mode="async", servers=1, timeout_s=3.0)
    if ps.is_server_only:
        try:
            ps.serve()
        except RuntimeError as exc:
            return str(exc)
        return "serve() returned although the worker never finished"
    x, y = _batch(0, 1)
    F.mse_loss(model(x), y).backward()
    ps.step()
    return "worker left without finish()"  # the process group is torn down: the server must not hang


@pytest.mark.slow
def test_dead_worker_makes_server_raise_a_clear_error():
    server_msg, _ = run_ranks(_dead_worker_rank, 2, timeout_s=TIMEOUT_S)
    assert "parameter server" in server_msg and "waiting for a request" in server_msg, server_msg


# -- state, arguments ----------------------------------------------------------------------------
@pytest.mark.parametrize("mode,push_every,pull_every", [("sync", 1, 1), ("async", 2, 3)])
def test_state_dict_round_trip(mode, push_every, pull_every):
    def build():
        model = _mlp()
        return model, ParameterServer(_sgd(model), model, mode=mode, push_every=push_every, pull_every=pull_every)

    def run(model, ps, steps):
        for t in steps:
            x, y = _batch(t, 1)
            F.mse_loss(model(x), y).backward()
            ps.step()
            ps.zero_grad()

    model, ps = build()
    run(model, ps, range(4))  # stops mid-accumulation and between pulls in async
    saved = copy.deepcopy((model.state_dict(), ps.state_dict()))
    run(model, ps, range(4, 9))
    ps.finish()
    model2, ps2 = build()
    model2.load_state_dict(saved[0])
    ps2.load_state_dict(saved[1])
    run(model2, ps2, range(4, 9))
    ps2.finish()
    _assert_close(_params(model2), _params(model), rtol=0, atol=0)
    with pytest.raises(ValueError, match="mode"):
        build()[1].load_state_dict({**saved[1], "mode": "other"})


def test_argument_errors():
    model = _mlp()
    opt = _sgd(model)
    with pytest.raises(ValueError, match="unknown parameter-server mode"):
        ParameterServer(opt, model, mode="bogus")
    with pytest.raises(ValueError, match="at least one rank must be a worker"):
        ParameterServer(opt, model, servers=1)
    with pytest.raises(ValueError, match=">= 1"):
        ParameterServer(opt, model, mode="async", push_every=0)
    with pytest.raises(ValueError, match="async' only"):
        ParameterServer(opt, model, mode="sync", pull_every=2)
    with pytest.raises(ValueError, match="not parameters of the model"):
        ParameterServer(_sgd(_mlp()), model)
    with pytest.raises(ValueError, match="missing from the optimizer"):
        ParameterServer(torch.optim.SGD(list(model.parameters())[:2], lr=0.1), model)
    ps = ParameterServer(opt, model, mode="async")
    ps.finish()
    with pytest.raises(RuntimeError, match="finished"):
        ps.step()
    assert ps.worker_rank == 0 and ps.num_workers == 1 and not ps.is_server_only


@pytest.mark.parametrize("mode,push_every", [("sync", 1), ("async", 2)])
def test_flush_ends_a_worker_through_the_wrapper_seam(mode, push_every):
    """The trainer ends every wrapper with flush(): here it pushes what async summed but did not push yet."""
    model = _mlp()
    ps = ParameterServer(_sgd(model), model, mode=mode, push_every=push_every)
    assert isinstance(ps, OptimizerWrapper) and ps.param_groups is ps.optimizer.param_groups
    for t in range(3):  # async: steps 0+1 pushed together, step 2 summed and waiting
        x, y = _batch(t, 1)
        F.mse_loss(model(x), y).backward()
        ps.step()
        ps.zero_grad()
    applied = ps.flush()
    assert [s.applied_step for s in applied] == ([2] if mode == "async" else [])
    assert ps.flush() == []  # the end is reached once
    with pytest.raises(RuntimeError, match="finished"):
        ps.step()
    ps.close()
