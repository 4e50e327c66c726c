"""The training variants the experiments compare, as ``pipesgd-train`` flags: one table, so a variant means the
same run in every experiment."""
from __future__ import annotations

__all__ = ["TRAINER_FLAGS", "SPEED_VARIANTS", "ACCURACY_VARIANTS", "FIDELITY_VARIANTS", "DEFAULT_FIDELITY_VARIANTS",
           "COMPARISON_VARIANTS", "PLAIN_VARIANTS", "COARSE_VARIANTS", "TIME_TO_ACCURACY_VARIANTS", "PIPE_VARIANTS",
           "CHARLM_TIME_VARIANTS", "CHARLM_SLOW_LINK_VARIANTS", "CHARLM_TUNED_VARIANTS", "PERIODIC_VARIANTS", "AUTO_CHOICE_VARIANTS", "SAME_CODEC_SYNC", "CONVENTIONAL_BASELINES", "DDP_BASELINES", "trainer_flags"]

# Look-ahead's stand-in: the own gradient, named. It is what "auto" (the default) picks under SGD, where every grid
# but the character GPT's runs; under AdamW "auto" picks coarse-lowrank ("pipe+q8+lowrank"), and the GPT's committed
# "pipe" rows are the own gradient's (experiments/results/charlm_time).
_OWN = ["--lookahead-standin", "local"]

TRAINER_FLAGS: dict[str, list[str]] = {  # variant name: pipesgd-train flags
    "sync": ["--mode", "sync"],
    "pipe": ["--mode", "pipe", "--width", "2", *_OWN],
    "pipe+bf16": ["--mode", "pipe", "--width", "2", "--compression", "bf16"],
    "pipe+q8": ["--mode", "pipe", "--width", "2", "--compression", "q8", "--error-feedback", *_OWN],
    "pipe+sign": ["--mode", "pipe", "--width", "2", "--compression", "sign", "--error-feedback"],
    "pipe+q4": ["--mode", "pipe", "--width", "2", "--compression", "q4", "--error-feedback"],
    # The codec chosen at the end of the warm-up from what it measured (issue 39)
    "pipe+auto": ["--mode", "pipe", "--width", "2", "--compression", "auto"],
    "pipe-wauto+auto": ["--mode", "pipe", "--width", "auto", "--compression", "auto"],  # the width chosen too
    # the width chosen at a fixed codec: does auto pick width 2 where it wins (the overlap issue's cell)?
    "pipe-wauto+q8": ["--mode", "pipe", "--width", "auto", "--compression", "q8", "--error-feedback", *_OWN],
    # ... and chosen again every 20 steps from what the running configuration measured
    "pipe-wauto+auto+recheck": ["--mode", "pipe", "--width", "auto", "--compression", "auto",
                                "--auto-recheck-every", "20"],
    "pipe+auto+recheck": ["--mode", "pipe", "--width", "2", "--compression", "auto", "--auto-recheck-every", "20"],
    "pipe-w3": ["--mode", "pipe", "--width", "3"],  # more width: more staleness, no more overlap to win
    # The paper's plain delayed update, beside the look-ahead default above (issue 36)
    "pipe-plain": ["--mode", "pipe", "--width", "2", "--staleness", "none"],
    "pipe+q8-plain": ["--mode", "pipe", "--width", "2", "--compression", "q8", "--error-feedback",
                      "--staleness", "none"],
    # every rank's average in a shared low-rank subspace of each weight matrix, the own gradient outside it (issue 36;
    # the "auto" stand-in under AdamW)
    "pipe+q8+lowrank": ["--mode", "pipe", "--width", "2", "--compression", "q8", "--error-feedback",
                        "--lookahead-standin", "coarse-lowrank"],
    # ... with q8 and no error feedback, which is what compression="auto" pairs with AdamW (pipesgd.defaults)
    "pipe+q8-noef+lowrank": ["--mode", "pipe", "--width", "2", "--compression", "q8",
                             "--lookahead-standin", "coarse-lowrank"],
    "sync+bf16": ["--mode", "sync", "--compression", "bf16"],
    "sync+q8": ["--mode", "sync", "--compression", "q8", "--error-feedback"],
    "sync+q4": ["--mode", "sync", "--compression", "q4", "--error-feedback"],
    "sync+sign": ["--mode", "sync", "--compression", "sign", "--error-feedback"],
    "ddp": ["--mode", "ddp"],
    "ddp+fp16": ["--mode", "ddp", "--ddp-hook", "fp16"],
    "ddp+powersgd": ["--mode", "ddp", "--ddp-hook", "powersgd"],  # PyTorch's powerSGD_hook (its error feedback)
    "ps-sync": ["--mode", "ps-sync"],
    "ps-async": ["--mode", "ps-async"],
    # Muon (torch.optim.Muon on the hidden matrices, AdamW on the rest): the q8 rows' flags with --optimizer muon
    # last, so that it wins over a workload's --optimizer adamw (the comparison grid puts a variant's flags after the
    # workload's: GridConfig.run_flags). No --lr: docs/training.md says AdamW's rate carries over (Muon's update is
    # scaled to AdamW's RMS), and the accuracy study's Muon rows ran at the charlm task's AdamW 1e-3
    # (results/accuracy/muon.json); untuned, they end about 0.19 above AdamW in loss there.
    "sync+q8+muon": ["--mode", "sync", "--compression", "q8", "--error-feedback", "--optimizer", "muon"],
    "pipe+q8+muon": ["--mode", "pipe", "--width", "2", "--compression", "q8", "--error-feedback", *_OWN,
                     "--optimizer", "muon"],
    # Muon at its own rate on this GPT (results/accuracy/report.md, "The learning rate under Muon and AdamW": 1e-2,
    # where AdamW's best measured is 3e-3), for configs/charlm_tuned.toml
    "sync+q8+muon-lr1e-2": ["--mode", "sync", "--compression", "q8", "--error-feedback", "--optimizer", "muon",
                            "--lr", "1e-2"],
    "pipe+q8+muon-lr1e-2": ["--mode", "pipe", "--width", "2", "--compression", "q8", "--error-feedback", *_OWN,
                            "--optimizer", "muon", "--lr", "1e-2"],
    "pipe+q8-noef+lowrank+muon-lr1e-2": ["--mode", "pipe", "--width", "2", "--compression", "q8",
                                         "--lookahead-standin", "coarse-lowrank", "--optimizer", "muon", "--lr", "1e-2"],
    # ... with q4 and error feedback, what `pipesgd-timing recommend --optimizer muon` names where q8 cannot hide
    # (Muon keeps SGD's codecs), beside its synchronous twin
    "sync+q4+muon-lr1e-2": ["--mode", "sync", "--compression", "q4", "--error-feedback", "--optimizer", "muon",
                            "--lr", "1e-2"],
    "pipe+q4+muon-lr1e-2": ["--mode", "pipe", "--width", "2", "--compression", "q4", "--error-feedback", *_OWN,
                            "--optimizer", "muon", "--lr", "1e-2"],
    # Periodic averaging (issue 75), the trainer's H (--sync-every default). localsgd's 15 synchronous steps put its
    # averages after steps 16, 32, ... (torch averages after 0-based steps W, W + H, ...), where diloco syncs: with
    # evaluation points every 16 steps (configs/charlm_slow_links.toml) each point sees averaged weights, not rank
    # 0's local ones
    "localsgd": ["--mode", "localsgd", "--warmup-steps", "15"],
    "diloco": ["--mode", "diloco"],  # blocking outer sync (tau 0), the paper's
    # tau = 1: the one-step-delayed outer sync of the issue (eager updates / Streaming DiLoCo with one fragment). The
    # model's all-reduce (1.7 MB fp32 for the GPT: about 0.2 s at 100 Mbit/s on 4 nodes, about a step's compute on
    # the 2-core host) mostly hides behind one step, and the tau overlapped steps' progress is dropped at the merge
    # (fragment_update_alpha 0), so the smallest tau that hides the sync costs the least; H/2 would drop half of
    # every period
    "diloco+delay": ["--mode", "diloco", "--sync-delay", "1"],
}

# issue 4 (bench_cluster.py): Pipe-SGD against sync AllReduce and DDP, in table order
SPEED_VARIANTS = ("sync", "pipe", "pipe+bf16", "pipe+q8", "ddp", "ddp+fp16")
ACCURACY_VARIANTS = ("sync", "pipe", "pipe+bf16", "pipe+q8", "ddp", "ddp+fp16")
# issue 5 (fidelity.py): every mode the timing model predicts
FIDELITY_VARIANTS = ("sync", "pipe", "pipe+bf16", "pipe+q8", "sync+bf16", "sync+q8", "ddp", "ps-sync", "ps-async")
DEFAULT_FIDELITY_VARIANTS = ("sync", "pipe", "pipe+bf16", "pipe+q8", "ddp", "ps-sync")
# issue 12 (comparison.py): the 4-node grid, baselines first; sync runs before ddp so the timing model can lend
# the sync run's compute to the ddp runs of the same cell
COMPARISON_VARIANTS = ("ps-sync", "ps-async", "sync", "sync+bf16", "sync+q8", "sync+sign", "ddp", "ddp+fp16",
                       "ddp+powersgd", "pipe", "pipe+bf16", "pipe+q8", "pipe+sign", "pipe-w3")
# issue 36 (configs/time_to_accuracy.toml): the grid's variants and the plain update beside the look-ahead default
PLAIN_VARIANTS = ("pipe-plain", "pipe+q8-plain")
TIME_TO_ACCURACY_VARIANTS = COMPARISON_VARIANTS + PLAIN_VARIANTS
# AdamW's time to a target loss on the character GPT (experiments/configs/charlm_time.toml, issue 36)
CHARLM_TIME_VARIANTS = ("ddp", "sync+q8", "pipe", "pipe+q8", "pipe+q8+lowrank", "pipe+q8-noef+lowrank", "pipe+auto", "pipe+auto+recheck")
# Time to a target loss on the GPT at 100 Mbit/s and 1 Gbit/s (experiments/configs/charlm_slow_links.toml, issue 75):
# per-step averaging (DDP, sync + q8, pipe + q8: AdamW's best pipelined form beside the plain one, then Muon) against
# periodic averaging (local SGD, DiLoCo blocking and overlapped)
PERIODIC_VARIANTS = ("localsgd", "diloco", "diloco+delay")  # no same-codec twin: they send the model, not gradients
CHARLM_SLOW_LINK_VARIANTS = ("ddp", "sync+q8", "pipe+q8", "pipe+q8-noef+lowrank", "sync+q8+muon", "pipe+q8+muon",
                             *PERIODIC_VARIANTS)
# The cells at each optimizer's rate (experiments/configs/charlm_tuned.toml; its 1 Gbit/s and 10 Mbit/s cells run some)
CHARLM_TUNED_VARIANTS = ("ddp", "sync+q8", "pipe+q8-noef+lowrank", "sync+q8+muon-lr1e-2", "pipe+q8+muon-lr1e-2",
                         "pipe+q8-noef+lowrank+muon-lr1e-2", "sync+q4+muon-lr1e-2", "pipe+q4+muon-lr1e-2",
                         "localsgd", "diloco")
PIPE_VARIANTS = ("pipe", "pipe+bf16", "pipe+q8", "pipe+sign", "pipe-w3")  # the Pipe-SGD side of the speedup tables
# issue 39 (configs/auto_choice.toml): --compression auto against every codec it chooses among, at width 1 and 2
AUTO_CHOICE_VARIANTS = ("sync", "sync+bf16", "sync+q8", "sync+q4", "pipe", "pipe+bf16", "pipe+q8", "pipe+q4",
                        "pipe+auto", "pipe-wauto+auto", "pipe-wauto+auto+recheck", "pipe-wauto+q8")
# Every Pipe-SGD variant's synchronous twin: width 1 with the same codec (and error feedback), so a speedup over it
# is what pipelining buys alone, apart from what the codec buys (DDP -> + codec -> + pipelining)
SAME_CODEC_SYNC = {"pipe": "sync", "pipe+bf16": "sync+bf16", "pipe+q8": "sync+q8", "pipe+sign": "sync+sign",
                   "pipe+q4": "sync+q4", "pipe-w3": "sync", "pipe-plain": "sync", "pipe+q8-plain": "sync+q8",
                   "pipe+q8+lowrank": "sync+q8", "pipe+q8+muon": "sync+q8+muon",
                   "pipe-wauto+q8": "sync+q8", "pipe+q8+muon-lr1e-2": "sync+q8+muon-lr1e-2",
                   "pipe+q4+muon-lr1e-2": "sync+q4+muon-lr1e-2"}
CONVENTIONAL_BASELINES = ("ps-sync", "ps-async", "sync")  # the paper's "conventional approaches"
DDP_BASELINES = ("ddp", "ddp+fp16", "ddp+powersgd")  # the peers users would pick today


def trainer_flags(variant: str) -> list[str]:
    """The ``pipesgd-train`` flags of ``variant``; an unknown name raises with the valid list."""
    if variant not in TRAINER_FLAGS:
        raise ValueError(f"unknown variant {variant!r}; valid: {', '.join(TRAINER_FLAGS)}")
    return list(TRAINER_FLAGS[variant])
