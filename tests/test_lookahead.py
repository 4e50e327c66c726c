"""Look-ahead staleness compensation (``staleness="lookahead"``, the default for width >= 2): at world size 1 it is
synchronous SGD bit for bit; on gloo ranks it follows an independent single-process reference (each rank's
weights advanced by deep copies of the model and optimizer); the master weights and the optimizer state stay
identical on every rank with every codec; the replay never writes the real optimizer's state; a checkpoint resumes
the same trajectory."""
from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch
from torch import nn

from pipesgd.options import PipeSGDOptions
from pipesgd import PipeSGD
from pipesgd.delay.lookahead import Lookahead
from pipesgd.delay.replay import OptimizerReplay
from tests.wrap import wrap
from tests.distributed import run_ranks
from tests.single_process import process_group  # noqa: F401 - a fixture
from tests.test_pipesgd import CODECS, batch, due, make_model, make_optimizer, snapshot

STEPS = 12


def _loss(model: nn.Module, t: int, rank: int) -> torch.Tensor:
    x, y = batch(t, rank, next(model.parameters()).dtype)
    return nn.functional.mse_loss(model(x), y)


def _optimizer(kind: str, model: nn.Module) -> torch.optim.Optimizer:
    params = model.parameters()
    return {"sgd": lambda: torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3),
            "nesterov": lambda: torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True),
            "adam": lambda: torch.optim.Adam(params, lr=0.01),
            "adamw": lambda: torch.optim.AdamW(params, lr=0.01, betas=(0.9, 0.95), weight_decay=0.1),
            "rmsprop": lambda: torch.optim.RMSprop(params, lr=0.01, momentum=0.5)}[kind]()


def _run(width: int, kind: str, dtype=torch.float32, steps: int = STEPS, accumulate: int = 1, **options):
    """World size 1: the losses of every step and the final weights."""
    model = make_model(dtype)
    opt = wrap(_optimizer(kind, model), model, width=width, **options)
    losses = []
    for t in range(steps):
        for micro in range(accumulate):
            loss = _loss(model, t * accumulate + micro, 0) / accumulate
            loss.backward()
            losses.append(float(loss.detach()))
        opt.step()
        opt.zero_grad()
    opt.flush()
    opt.close()
    return losses, snapshot(model)


# ------------------------------------------------------------------ world size 1: it is synchronous SGD
@pytest.mark.parametrize("kind", ["sgd", "nesterov", "adam", "adamw", "rmsprop"])
@pytest.mark.parametrize("width", [2, 3])
def test_at_world_size_one_every_width_is_synchronous_sgd_bit_for_bit(process_group, kind, width):
    want = _run(1, kind, warmup_steps=2)
    got = _run(width, kind, warmup_steps=2)
    assert got[0] == want[0]
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1]))
    plain = _run(width, kind, warmup_steps=2, staleness="none")
    assert plain[0] != want[0]  # the plain delayed update is not (so the comparison can fail)


@pytest.mark.parametrize("options", [dict(max_grad_norm=0.05), dict(accumulate=2), dict(gradient_as_bucket_view=False),
                                     dict(warmup_steps=0), dict(buffers="average", compression="bf16"),
                                     dict(dtype=torch.bfloat16)],
                         ids=["clip", "accumulate", "copies", "no-warmup", "codec", "bf16-params"])
def test_synchronous_equality_holds_with_clipping_accumulation_and_layouts(process_group, options):
    # World size 1 sends nothing, so even a lossy codec leaves the stand-in equal to the average.
    want = _run(1, "adamw", **options)
    got = _run(3, "adamw", **options)
    assert got[0] == want[0]
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1]))


def test_with_a_grad_scaler_the_stand_in_is_unscaled_with_its_own_scale(process_group):
    def scaled(width):
        model = make_model(torch.float32)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)  # the scale changes often
        opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model, width=width, warmup_steps=1,
                      options=PipeSGDOptions(grad_scaler=scaler))
        losses = []
        for t in range(STEPS):
            loss = _loss(model, t, 0)
            scaler.scale(loss).backward()
            losses.append(float(loss.detach()))
            opt.step()
            opt.zero_grad()
        opt.flush()
        return losses

    # The scale grows every 3 applied steps, and the applied steps lag by one: the scaled gradients differ,
    # the unscaled ones do not (powers of two).
    assert scaled(2) == scaled(1)


# ------------------------------------------------------------------ what the replay may and may not touch
@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_the_replay_moves_the_parameters_as_a_copy_of_the_optimizer_would_and_leaves_its_state(kind):
    model = make_model(torch.float32)
    inner = _optimizer(kind, model)
    for t in range(3):  # some state to copy
        _loss(model, t, 0).backward()
        inner.step()
        inner.zero_grad()
    oracle_model, oracle = copy.deepcopy((model, inner))
    state_before = copy.deepcopy(inner.state_dict())
    grads = [[torch.randn_like(p) for p in model.parameters()] for _ in range(2)]
    for g in grads:
        for p, gp in zip(oracle_model.parameters(), g):
            p.grad = gp.clone()
        oracle.step()
    replay = OptimizerReplay(inner, list(model.parameters()))
    with torch.no_grad():
        assert replay.replay_([(g, None, False) for g in grads], skip_nonfinite=False) == 2
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), oracle_model.parameters()))
    after = inner.state_dict()
    for key, state in state_before["state"].items():
        for name, value in state.items():
            assert torch.equal(torch.as_tensor(after["state"][key][name]), torch.as_tensor(value)), (key, name)
    assert all(p.grad is None for p in model.parameters())


def test_eval_sees_the_master_weights_and_training_forwards_the_look_ahead_ones(process_group):
    model = make_model(torch.float32)
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model, width=2, warmup_steps=0)
    _loss(model, 0, 0).backward()
    opt.step()
    opt.zero_grad()
    master = snapshot(model)
    with torch.no_grad():
        model(batch(1, 0, torch.float32)[0])  # evaluation: nothing moves
    assert all(torch.equal(a, b) for a, b in zip(snapshot(model), master))
    opt.check_replicas()
    _loss(model, 1, 0).backward()  # a training forward: the parameters look ahead until step()
    assert not all(torch.equal(a, b) for a, b in zip(snapshot(model), master))
    assert all(torch.equal(a, b) for a, b in zip(opt._lookahead.master_params(), master))
    stats = opt.step()
    assert stats.t_lookahead_s is not None and stats.t_lookahead_s > 0
    assert "t_lookahead" in stats.as_metrics()
    opt.flush()
    assert not opt._lookahead.active and opt._lookahead.pending_steps == []


def test_a_parameter_list_looks_ahead_from_the_end_of_step(process_group):
    want = _run(1, "sgd", warmup_steps=0)
    model = make_model(torch.float32)
    opt = PipeSGD(_optimizer("sgd", model), list(model.parameters()), width=2, warmup_steps=0)
    losses = []
    for t in range(STEPS):
        loss = _loss(model, t, 0)
        loss.backward()
        losses.append(float(loss.detach()))
        opt.step()
        opt.zero_grad()
    opt.flush()
    assert losses == want[0]


def test_a_forward_that_bypasses_the_wrapped_model_is_warned_about_once(process_group):
    model = make_model(torch.float32)
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=2, warmup_steps=0)
    x, y = batch(0, 0, torch.float32)
    with pytest.warns(RuntimeWarning, match="did not call the wrapped model"):
        for _ in range(3):
            nn.functional.mse_loss(model[2](model[1](model[0](x))), y).backward()  # the layers, not the model
            opt.step()
            opt.zero_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nn.functional.mse_loss(model[2](model[1](model[0](x))), y).backward()
        opt.step()  # once only
    opt.flush()


def test_none_and_width_one_do_no_look_ahead_and_memory_is_reported(process_group):
    for width, staleness in ((1, "lookahead"), (2, "none")):
        model = make_model(torch.float32)
        opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=width, staleness=staleness)
        assert opt._lookahead is None and opt.lookahead_memory_bytes == 0
        _loss(model, 0, 0).backward()
        assert opt.step().t_lookahead_s is None
    model = make_model(torch.float32)
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model, width=3, warmup_steps=0)
    for t in range(4):
        _loss(model, t, 0).backward()
        opt.step()
        opt.zero_grad()
    weight_bytes = sum(p.numel() * 4 for p in model.parameters())
    # a copy of the weights + the stand-ins of the K-1 = 2 steps in flight + the momentum buffers' copy
    assert opt.lookahead_memory_bytes == weight_bytes * (1 + 2 + 1)
    opt.flush()
    with pytest.raises(ValueError, match="staleness must be one of"):
        PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, staleness="predict")


# ------------------------------------------------------------------ gloo ranks: an independent reference
def lookahead_reference(world: int, width: int, warmup: int, kind: str, steps: int = STEPS):
    """Single process: each rank computes its gradient at the master weights advanced, by deep copies of the
    model and optimizer, through its own gradients of the steps in flight; the master applies the delayed mean."""
    model = make_model()
    opt, sched = make_optimizer(kind, model)
    local: dict[tuple[int, int], list[torch.Tensor]] = {}
    mean: dict[int, list[torch.Tensor]] = {}
    pending: list[int] = []
    trajectory = []

    def apply(s: int) -> None:
        for p, g in zip(model.parameters(), mean[s]):
            p.grad = g.clone()
        opt.step()
        pending.remove(s)

    for t in range(steps):
        per_rank = []
        for rank in range(world):
            ahead, ahead_opt = copy.deepcopy((model, opt))
            for s in pending:
                for p, g in zip(ahead.parameters(), local[(rank, s)]):
                    p.grad = g.clone()
                ahead_opt.step()
            ahead.zero_grad()
            _loss(ahead, t, rank).backward()
            local[(rank, t)] = [p.grad.clone() for p in ahead.parameters()]
            per_rank.append(local[(rank, t)])
        mean[t] = [torch.stack(gs).mean(0) for gs in zip(*per_rank)]
        pending.append(t)
        if (due_step := due(t, width, warmup)) is not None:
            apply(due_step)
        if sched is not None:
            sched.step()
        trajectory.append(snapshot(model))
    for s in list(pending):
        apply(s)
    trajectory.append(snapshot(model))
    return trajectory


SCENARIOS = [(2, 0, "sgd"), (2, 3, "adam"), (3, 2, "sgd")]  # (width, warmup_steps, optimizer)


def _lookahead_ranks(rank: int, world: int):
    runs = []
    for width, warmup, kind in SCENARIOS:
        model = make_model()
        inner, sched = make_optimizer(kind, model)
        opt = PipeSGD(inner, model, width=width, warmup_steps=warmup,
                      options=PipeSGDOptions(check_replicas_every=1, lookahead_standin="local"))  # the reference's stand-in (under Adam "auto" picks another)
        trajectory = []
        for t in range(STEPS):
            _loss(model, t, rank).backward()
            opt.step()
            opt.zero_grad()
            if sched is not None:
                sched.step()
            trajectory.append(snapshot(model))
        opt.flush()
        trajectory.append(snapshot(model))
        opt.close()
        runs.append(trajectory)
    return runs


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.slow
def test_ranks_follow_the_single_process_look_ahead_reference(world):
    per_rank = run_ranks(_lookahead_ranks, world)
    for index, (width, warmup, kind) in enumerate(SCENARIOS):
        expected = lookahead_reference(world, width, warmup, kind)
        for rank, runs in enumerate(per_rank):
            for t, (got, want) in enumerate(zip(runs[index], expected)):
                for g, w in zip(got, want):
                    torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12,
                                               msg=f"K={width} W={warmup} {kind} rank {rank} step {t}")


def _codecs_with_lookahead(rank: int, world: int):
    finals = []
    for compression, feedback, options in CODECS:
        model = make_model()
        scaler = None
        opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model, width=2, warmup_steps=1,
                      compression=compression, error_feedback=feedback,
                      options=PipeSGDOptions(compression_options=options, check_replicas_every=1, max_grad_norm=1.0, grad_scaler=scaler))
        for t in range(8):
            _loss(model, t, rank).backward()
            opt.step()
            opt.zero_grad()
        opt.flush()
        opt.check_replicas()
        finals.append(torch.cat([p.reshape(-1) for p in snapshot(model)]))
        opt.close()
    return finals


@pytest.mark.slow
def test_master_weights_stay_identical_across_ranks_with_every_codec():
    per_rank = run_ranks(_codecs_with_lookahead, 3)
    for index, codec in enumerate(CODECS):
        assert torch.isfinite(per_rank[0][index]).all(), codec
        for rank in (1, 2):
            assert torch.equal(per_rank[rank][index], per_rank[0][index]), codec


# ------------------------------------------------------------------ checkpoints: per rank, on one rank
RESUME_AT = 6


def _resumable(rank: int, world: int, directory: str, mode: str, resume: bool):
    """q8 + stochastic rounding + error feedback + look-ahead; saved at RESUME_AT per rank ("per-rank"), on rank 0
    after consolidating ("consolidated"), or on rank 0 alone ("rank0")."""
    model = make_model()
    inner, sched = make_optimizer("sgd", model)
    opt = PipeSGD(inner, model, width=2, warmup_steps=1, compression="q8", error_feedback=True,
                  options=PipeSGDOptions(compression_options={"stochastic": True}))
    path = os.path.join(directory, f"rank{rank}.pt" if mode == "per-rank" else "rank0.pt")
    start, caught = 0, []
    if resume:
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        start = RESUME_AT
    for t in range(start, STEPS):
        if t == RESUME_AT and not resume:
            if mode == "consolidated":
                opt.consolidate_state_dict(to=0)
            if mode == "per-rank" or rank == 0:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}, path)
        _loss(model, t, rank).backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        opt.check_replicas()
    opt.flush()
    return snapshot(model), [str(w.message) for w in caught]


@pytest.mark.parametrize("mode", ["per-rank", "consolidated", "rank0"])
@pytest.mark.slow
def test_a_resumed_run_repeats_the_uninterrupted_one(tmp_path, mode):
    uninterrupted = run_ranks(_resumable, 2, str(tmp_path), mode, False)
    resumed = run_ranks(_resumable, 2, str(tmp_path), mode, True)
    exact = all(torch.equal(g, w) for (want, _), (got, _) in zip(uninterrupted, resumed) for g, w in zip(got, want))
    warned = [messages for _, messages in resumed]
    if mode == "rank0":  # rank 1's own state was never saved: it starts afresh, says so, and replicas stay equal
        assert not exact and warned[0] == [] and len(warned[1]) == 1
        assert "consolidate_state_dict" in warned[1][0] and "error-feedback residuals" in warned[1][0]
        assert all(torch.equal(a, b) for a, b in zip(resumed[0][0], resumed[1][0]))
    else:
        assert exact and warned == [[], []]


def test_the_look_ahead_state_round_trips(process_group):
    model = make_model(torch.float32)
    lookahead = Lookahead(torch.optim.SGD(model.parameters(), lr=0.1), list(model.parameters()))
    grads = [torch.randn_like(p) for p in model.parameters()]
    lookahead.record(4, grads, scale=8.0)
    other = Lookahead(torch.optim.SGD(model.parameters(), lr=0.1), list(model.parameters()))
    other.load_state_dict(lookahead.state_dict())
    (entry,) = other.state_dict()
    assert entry["step"] == 4 and entry["scale"] == 8.0
    assert all(torch.equal(a, b) for a, b in zip(entry["grads"], grads))
