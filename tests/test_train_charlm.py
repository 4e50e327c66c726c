"""The language-model task in the trainer: per-token loss and evaluation, AdamW's and Muon's parameter groups, the
config's pairing of token models with token data, and a world-size-1 run of gpt on pysrc that resumes on its
schedule (under AdamW and under Muon)."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pipesgd.muon_adamw import MuonAdamW
from pipesgd.train import cli, faults
from pipesgd.train.config import ConfigError, TrainConfig
from pipesgd.train.flags import resolve
from pipesgd.train.data import Dataset, build_dataset
from pipesgd.train.loop import cross_entropy, evaluate, forward_backward
from pipesgd.train.models import build_model
from pipesgd.train.optimizers import ADAMW_BETAS, build_inner_optimizer
from tests.single_process import process_group  # noqa: F401 - a fixture


def test_the_loss_is_the_mean_over_every_position():
    torch.manual_seed(0)
    logits, y = torch.randn(2, 3, 5), torch.randint(0, 5, (2, 3))
    by_hand = sum(F.cross_entropy(logits[b, t][None], y[b, t][None]) for b in range(2) for t in range(3)) / 6
    assert torch.allclose(cross_entropy(logits, y), by_hand)
    assert torch.allclose(cross_entropy(logits, y, reduction="sum"), 6 * by_hand)
    images, labels = torch.randn(4, 5), torch.randint(0, 5, (4,))
    assert torch.equal(cross_entropy(images, labels), F.cross_entropy(images, labels))  # the image path as before


def test_forward_backward_on_a_tiny_lm_batch_with_micro_batches():
    torch.manual_seed(0)
    model = build_model("gpt", (8,), 13)
    x = torch.randint(0, 13, (4, 8))
    y = torch.roll(x, -1, dims=1)
    whole = forward_backward(model, x, y)
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    halves = forward_backward(model, x, y, micro_batches=2)
    assert torch.allclose(whole, cross_entropy(model(x), y)) and torch.allclose(halves, whole)
    assert all(torch.allclose(p.grad, g, atol=1e-6) for p, g in zip(model.parameters(), grads))


class NextIsPlusOne(nn.Module):
    """Predicts token (x + 1) mod V at every position, with a fixed confidence."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 3.0 * F.one_hot((x + 1) % 5, 5).float()


def test_evaluate_counts_every_position():
    x = torch.tensor([[0, 1, 2], [3, 4, 0], [1, 1, 1]])
    y = torch.tensor([[1, 2, 0], [4, 0, 1], [2, 2, 2]])  # right at 8 of the 9 positions
    ds = Dataset("toy", x, y, x, y, 5)
    accuracy, loss = evaluate(NextIsPlusOne(), ds, torch.device("cpu"), batch_size=2)
    assert accuracy == pytest.approx(8 / 9)
    assert loss == pytest.approx(float(F.cross_entropy(NextIsPlusOne()(x).flatten(0, 1), y.flatten())))


def test_adamw_decays_matrices_only_with_nanogpt_betas():
    model = build_model("gpt", (8,), 13)
    cfg = resolve(["--optimizer", "adamw", "--weight-decay", "0.1"])
    opt = build_inner_optimizer(cfg.optimizer, model, cfg.lr, cfg.momentum, cfg.weight_decay)
    assert isinstance(opt, torch.optim.AdamW) and ADAMW_BETAS == (0.9, 0.99)
    decayed, kept = opt.param_groups
    assert decayed["weight_decay"] == 0.1 and kept["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decayed["params"]) and all(p.dim() == 1 for p in kept["params"])
    assert len(decayed["params"]) + len(kept["params"]) == len(list(model.parameters()))
    assert {g["betas"] for g in opt.param_groups} == {ADAMW_BETAS} and {g["lr"] for g in opt.param_groups} == {0.02}
    no_vectors = build_inner_optimizer("adamw", nn.Linear(3, 2, bias=False), 0.02, 0.9, 0.0)
    assert len(no_vectors.param_groups) == 1  # no empty group


def test_muon_takes_the_blocks_matrices_and_adamw_the_embeddings_head_and_vectors():
    model = build_model("gpt", (8,), 13)
    cfg = resolve(["--optimizer", "muon", "--lr", "1e-3", "--weight-decay", "0.1"])
    opt = build_inner_optimizer(cfg.optimizer, model, cfg.lr, cfg.momentum, cfg.weight_decay)
    assert isinstance(opt, MuonAdamW)
    muon, decayed, kept = opt.param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert muon["use_muon"] and len(muon["params"]) == 8
    assert all(names[id(p)].startswith("blocks.") for p in muon["params"])
    assert (muon["momentum"], muon["nesterov"], muon["adjust_lr_fn"]) == (0.95, True, "match_rms_adamw")
    assert sorted(names[id(p)] for p in decayed["params"]) == ["head.weight", "pos.weight", "tok.weight"]
    assert all(p.dim() == 1 for p in kept["params"]) and not decayed["use_muon"] and not kept["use_muon"]
    assert (muon["weight_decay"], decayed["weight_decay"], kept["weight_decay"]) == (0.1, 0.1, 0.0)
    assert decayed["betas"] == ADAMW_BETAS and {g["lr"] for g in opt.param_groups} == {1e-3}
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))


def test_muon_is_refused_in_one_line_by_a_torch_without_it(monkeypatch):
    cfg = resolve(["--optimizer", "muon", "--dataset", "pysrc", "--model", "gpt"])
    cli.check_shapes(cfg, 1000, 2)
    monkeypatch.delattr(torch.optim, "Muon")
    with pytest.raises(ConfigError, match=r"^--optimizer muon needs torch.optim.Muon, which this torch \("):
        cli.check_shapes(cfg, 1000, 2)


@pytest.mark.parametrize("argv", [["--model", "gpt"], ["--dataset", "pysrc"], ["--dataset", "pysrc", "--model", "mlp"]])
def test_token_models_and_token_data_only_go_together(argv):
    with pytest.raises(ConfigError, match=r"cannot train on --dataset .*models \(gpt\).*data sets \(pysrc\)"):
        resolve(argv)


LM_ARGS = dict(dataset="pysrc", model="gpt", optimizer="adamw", lr=1e-3, lr_schedule="cosine", lr_warmup_steps=2,
               batch_size=8, steps=8, eval_every=0, timeout=30.0)


def _step_losses(path) -> dict[int, float]:
    with open(path) as handle:
        return {r["step"]: r["loss"] for r in map(json.loads, handle) if r["type"] == "step"}


@pytest.fixture
def one_thread():
    """One intra-op thread, as the trainer runs each rank (two threads on two cores run this model slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class StopAt:
    """Stands in for the fault hook: raises before ``step``, as a crash would stop the run there."""

    def __init__(self, step: int) -> None:
        self.step = step

    def __call__(self, rank: int, step: int) -> None:
        if step == self.step:
            raise RuntimeError(f"stopped before step {step}")


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_world_size_1_run_learns_and_resumes_on_its_schedule(tmp_path, monkeypatch, capsys, one_thread, optimizer,
                                                               process_group):  # noqa: F811
    """The real wrapper (PipeSGD width 2) at world size 1: the loss falls from ln(97) within 8 steps, the startup
    line names the corpus, and a run stopped after its step-4 checkpoint resumes to the uninterrupted losses (under
    Muon too: ``MuonAdamW``'s state dict restores both optimizers)."""
    args = dict(LM_ARGS, optimizer=optimizer)
    ds = build_dataset(TrainConfig(**args))
    reference = TrainConfig(**args, metrics=str(tmp_path / "ref.jsonl"))
    cli.run(reference, ds, rank=0, world_size=1, local_rank=0)
    out = capsys.readouterr().out
    assert f"on pysrc ({len(ds.x_train)} train" in out and f"sha256 {ds.source['sha256']}" in out
    want = _step_losses(reference.metrics)
    assert want[0] == pytest.approx(4.57, abs=0.05) and want[7] < want[0] - 0.5  # ln(97) = 4.575

    resumable = dict(args, metrics=str(tmp_path / "run.jsonl"), checkpoint=str(tmp_path / "ck"), checkpoint_every=4,
                     resume=True)
    monkeypatch.setattr(faults, "inject", StopAt(6))
    with pytest.raises(RuntimeError, match="stopped before step 6"):
        cli.run(TrainConfig(**resumable), ds, rank=0, world_size=1, local_rank=0)
    monkeypatch.undo()
    cli.run(TrainConfig(**resumable), ds, rank=0, world_size=1, local_rank=0)
    assert "resumed from" in capsys.readouterr().out
    assert _step_losses(resumable["metrics"]) == want  # steps 4 and 5 run twice; the resumed records come last
