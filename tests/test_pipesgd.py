"""PipeSGD against hand-written single-process references, at world size 1 and on gloo processes."""
from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from pipesgd.options import PipeSGDOptions
import pipesgd
from pipesgd import NonFiniteGradientError, PipeSGD, ReplicaDivergenceError
from tests.wrap import wrap
from tests.distributed import run_ranks
from tests.single_process import process_group  # noqa: F401 - a fixture

pytestmark = pytest.mark.usefixtures("process_group")  # PipeSGD needs a process group: one rank

STEPS = 12
# The distributed parity tests also run on a GPU: PIPESGD_TEST_DEVICE=cuda puts every rank's model and data
# on it (gloo over CUDA tensors, four ranks may share one GPU); the references stay on the CPU.
DEVICE = torch.device(os.environ.get("PIPESGD_TEST_DEVICE", "cpu"))


def make_model(dtype=torch.float64) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)).to(dtype)


def batch(step: int, rank: int, dtype=torch.float64):
    """Rank- and step-dependent data, the same wherever it is drawn."""
    g = torch.Generator().manual_seed(10_000 * step + rank)
    x = torch.randn(4, 6, generator=g, dtype=torch.float64) * (1 + rank)
    y = torch.randn(4, 3, generator=g, dtype=torch.float64)
    return x.to(dtype), y.to(dtype)


def due(t: int, width: int, warmup: int) -> int | None:
    """The step whose averaged gradient step t applies in a reference: its own during warm-up, none while the
    pipeline fills, then step t-K+1's (what ``pipesgd.delay.pipeline`` decides, written out independently)."""
    if t < warmup:
        return t
    return t - width + 1 if t >= warmup + width - 1 else None


def make_optimizer(kind: str, model: nn.Module):
    if kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=0.01), None
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)


def snapshot(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def reference_trajectory(world: int, width: int, warmup: int, kind: str, steps: int = STEPS):
    """Single process: g_t = mean over ranks of each rank's gradient; the update at step t applies g_t
    during warm-up (t < W), nothing while the pipeline fills (W <= t < W+K-1), then g_{t-K+1};
    the end applies what is left. Weights are recorded after every step and after the end."""
    model = make_model()
    opt, sched = make_optimizer(kind, model)
    grads: dict[int, list[torch.Tensor]] = {}
    applied: set[int] = set()

    def apply(s: int) -> None:
        for p, g in zip(model.parameters(), grads[s]):
            p.grad = g.clone()
        opt.step()
        applied.add(s)

    trajectory = []
    for t in range(steps):
        per_rank = []
        for rank in range(world):
            model.zero_grad()
            x, y = batch(t, rank)
            nn.functional.mse_loss(model(x), y).backward()
            per_rank.append([p.grad.clone() for p in model.parameters()])
        grads[t] = [torch.stack(gs).mean(0) for gs in zip(*per_rank)]
        if (due_step := due(t, width, warmup)) is not None:
            apply(due_step)
        if sched is not None:
            sched.step()
        trajectory.append(snapshot(model))
    for s in range(steps):
        if s not in applied:
            apply(s)
    trajectory.append(snapshot(model))
    return trajectory


def train(rank: int, width: int, warmup: int, kind: str, steps: int = STEPS, **options):
    model = make_model().to(DEVICE)
    inner, sched = make_optimizer(kind, model)
    options.setdefault("staleness", "none")  # the reference is the paper's plain delayed update
    opt = wrap(inner, model, width=width, warmup_steps=warmup, **options)
    trajectory = []
    for t in range(steps):
        x, y = (v.to(DEVICE) for v in batch(t, rank))
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        if sched is not None:
            sched.step()
        trajectory.append([p.cpu() for p in snapshot(model)])
    opt.flush()
    trajectory.append([p.cpu() for p in snapshot(model)])
    opt.close()
    return trajectory


SCENARIOS = [  # (width, warmup_steps, optimizer, all-reduce implementation)
    (1, 0, "sgd", "ring"),
    (1, 0, "sgd", "backend"),
    (2, 0, "sgd", "ring"),
    (2, 0, "sgd", "auto"),
    (2, 3, "adam", "ring"),
    (3, 2, "sgd", "ring"),
    (1, 0, "sgd", "alltoall"),
    (3, 2, "sgd", "alltoall"),
]


def _scenarios(rank: int, world: int):
    return [train(rank, width, warmup, kind, allreduce=impl) for width, warmup, kind, impl in SCENARIOS]


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.slow
def test_matches_single_process_reference(world):
    """K = 1 is SGD on the concatenated batch; K >= 2 applies exactly the delayed averaged gradient."""
    per_rank = run_ranks(_scenarios, world)
    for index, (width, warmup, kind, _) in enumerate(SCENARIOS):
        expected = reference_trajectory(world, width, warmup, kind)
        for rank, trajectories in enumerate(per_rank):
            for t, (got, want) in enumerate(zip(trajectories[index], expected)):
                for g, w in zip(got, want):
                    torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12,
                                               msg=f"K={width} W={warmup} {kind} rank {rank} step {t}")


def test_world_size_one_matches_reference_for_every_scenario():
    for width, warmup, kind, impl in SCENARIOS:
        got = train(0, width, warmup, kind, allreduce=impl)
        want = reference_trajectory(1, width, warmup, kind)
        for a, b in zip(got, want):
            for g, w in zip(a, b):
                assert torch.equal(g, w)


CODECS = [  # (compression, error_feedback, options)
    ("fp16", False, {}),
    ("bf16", True, {}),
    ("q8", False, {}),
    ("q4", True, {"block_size": 64}),
    ("q8", True, {"stochastic": True}),
    ("sign", True, {}),
]


def _replicas_stay_identical(rank: int, world: int, allreduce: str):
    checksums = []
    for compression, feedback, options in CODECS:
        trajectory = train(rank, 2, 1, "sgd", steps=8, compression=compression, error_feedback=feedback,
                           compression_options=options, check_replicas_every=1, allreduce=allreduce)
        final = torch.cat([p.reshape(-1) for p in trajectory[-1]])
        assert torch.isfinite(final).all()
        checksums.append(final)
    return checksums


@pytest.mark.parametrize("allreduce", ["ring", "alltoall"])
@pytest.mark.slow
def test_replicas_stay_bitwise_identical_for_every_codec(allreduce):
    per_rank = run_ranks(_replicas_stay_identical, 3, allreduce)
    for codec_index in range(len(CODECS)):
        for rank in range(1, 3):
            assert torch.equal(per_rank[rank][codec_index], per_rank[0][codec_index]), CODECS[codec_index]


RESUME_AT = 6
RESUME_OPTIONS = dict(width=2, warmup=1, kind="sgd")


def _resumable(rank: int, world: int, directory: str, resume: bool, allreduce: str):
    """Train STEPS steps with q8 + stochastic rounding + error feedback; save at RESUME_AT, or start there."""
    model = make_model()
    inner, sched = make_optimizer("sgd", model)
    opt = PipeSGD(inner, model, width=2, warmup_steps=1, compression="q8", error_feedback=True,
                  options=PipeSGDOptions(compression_options={"stochastic": True}, allreduce=allreduce))
    path = os.path.join(directory, f"rank{rank}.pt")
    start = 0
    if resume:
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        start = RESUME_AT
    for t in range(start, STEPS):
        if t == RESUME_AT and not resume:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}, path)
        x, y = batch(t, rank)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    opt.flush()
    return snapshot(model), opt.in_flight


@pytest.mark.parametrize("allreduce", ["ring", "alltoall"])
@pytest.mark.slow
def test_state_dict_resumes_the_identical_trajectory(tmp_path, allreduce):
    uninterrupted = run_ranks(_resumable, 2, str(tmp_path), False, allreduce)
    resumed = run_ranks(_resumable, 2, str(tmp_path), True, allreduce)
    for (want, _), (got, in_flight) in zip(uninterrupted, resumed):
        assert in_flight == 0
        for g, w in zip(got, want):
            assert torch.equal(g, w)


def _failures(rank: int, world: int):
    messages = {}
    # A NaN gradient on one rank reaches every rank's averaged gradient; the error names its step.
    for policy in ("raise", "skip"):
        model = make_model()
        opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=2, warmup_steps=0, compression="q8",
                      options=PipeSGDOptions(nonfinite=policy))
        skipped = []
        try:
            for t in range(5):
                x, y = batch(t, rank)
                if t == 2 and rank == 1:
                    x[0, 0] = float("nan")
                nn.functional.mse_loss(model(x), y).backward()
                skipped.append(opt.step().skipped_nonfinite)
                opt.zero_grad()
            messages[policy] = (skipped, bool(all(torch.isfinite(p).all() for p in model.parameters())))
        except NonFiniteGradientError as error:
            messages[policy] = str(error)
    # A replica that drifts is caught and named.
    model = make_model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=1)
    if rank == 1:
        with torch.no_grad():
            model[2].bias[0] += 1e-12
    try:
        opt.check_replicas()
        messages["replicas"] = "not caught"
    except ReplicaDivergenceError as error:
        messages["replicas"] = str(error)
    return messages


@pytest.mark.slow
def test_nonfinite_gradients_and_diverged_replicas_are_reported():
    for messages in run_ranks(_failures, 2):
        assert "from step 2" in messages["raise"]
        skipped, finite = messages["skip"]
        assert skipped == [False, False, False, True, False] and finite
        assert "'2.bias'" in messages["replicas"]


# ------------------------------------------------------------------ world size 1: usage and arguments
def one_step(model, opt):
    x, y = batch(0, 0)
    nn.functional.mse_loss(model(x), y).backward()
    return opt.step()


def test_misuse_raises():
    model = make_model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model)
    one_step(model, opt)
    with pytest.raises(RuntimeError, match="without a backward"):
        opt.step()
    x, y = batch(1, 0)
    nn.functional.mse_loss(model(x), y).backward()
    with pytest.raises(RuntimeError, match="discard this step's gradients"):
        opt.zero_grad()
    opt.step()
    opt.optimizer.add_param_group({"params": [nn.Parameter(torch.zeros(2, dtype=torch.float64))]})
    one_step_error = pytest.raises(RuntimeError, match="parameter groups changed")
    with one_step_error:
        one_step(model, opt)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"width": 0}, "width"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"compression": "zip"}, "valid names"),
        ({"compression": "sign"}, "error_feedback"),
        ({"nonfinite": "ignore"}, "nonfinite"),
        ({"bucket_mb": 0}, "bucket_mb"),
        ({"allreduce": "mpi"}, "allreduce"),
        ({"allreduce": "backend", "compression": "q8"}, "cannot compress"),
    ],
)
def test_bad_arguments(kwargs, match):
    model = make_model()
    with pytest.raises(ValueError, match=match):
        wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, **kwargs)


def test_foreign_parameters_and_wrong_types_are_refused():
    model = make_model()
    other = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="not in the model"):
        PipeSGD(torch.optim.SGD(other.parameters(), lr=0.1), model)
    with pytest.raises(TypeError):
        PipeSGD(model, model)


def test_flush_applies_every_gradient_and_load_refuses_another_model():
    model = make_model()
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=3, warmup_steps=0)
    stats = [one_step(model, opt) for _ in range(1)]
    opt.zero_grad()
    x, y = batch(1, 0)
    nn.functional.mse_loss(model(x), y).backward()
    stats.append(opt.step())
    assert [s.applied_step for s in stats] == [None, None] and opt.in_flight == 2
    state = opt.state_dict()
    assert [s.applied_step for s in opt.flush()] == [0, 1] and opt.in_flight == 0
    small = nn.Linear(2, 2).double()
    with pytest.raises(ValueError, match="layout"):
        PipeSGD(torch.optim.SGD(small.parameters(), lr=0.1), small, width=3).load_state_dict(state)


def test_parameters_without_gradients_get_zeros_and_bf16_models_train():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)).to(torch.bfloat16)
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=0.1), model, width=1)
    model[1](torch.randn(3, 4, dtype=torch.bfloat16)).sum().backward()  # model[0] gets no gradient
    opt.step()
    assert torch.equal(model[0].weight.grad, torch.zeros_like(model[0].weight))
    assert model[1].weight.grad.dtype == torch.bfloat16


def test_public_api():
    assert set(pipesgd.__all__) >= {"PipeSGD", "ring_allreduce", "alltoall_allreduce",
                                    "compression"}
    assert pipesgd.compression.available() == ["bf16", "fp16", "none", "q4", "q8", "sign"]
