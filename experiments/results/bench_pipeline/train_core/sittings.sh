#!/bin/bash
# The second trial (2026-11-29 08:15-08:22Z, 2-core AMD EPYC, commit c09a738 with probe.patch in a worktree at
# /tmp/wt, run as root; summary.md by pipeline_sittings.py).
# PIPESGD_EXP_SPLIT (the probe's hook, not in the library): "0/0,1" confines each node's training thread to core 0
# from PipeSGD's construction to its close() (the communication worker and gloo's threads keep both cores); none
# leaves every thread on both. The order turns every sitting. Run from a worktree with probe.patch applied.
export PYTHONPATH=/tmp/wt
cd /tmp/wt
orders=("none 0/0,1" "0/0,1 none" "none 0/0,1" "0/0,1 none" "none 0/0,1")
for s in 0 1 2 3 4; do
  for m in ${orders[$s]}; do
    if [ "$m" = none ]; then lab=shared-s$s; unset PIPESGD_EXP_SPLIT; else lab=train_core0-s$s; export PIPESGD_EXP_SPLIT=$m; fi
    python3 experiments/bench_pipeline.py --bandwidth 200mbit --variants q8,q8+ef --baselines - --allreduce alltoall \
      --label $lab --out /tmp/split2/out > /tmp/split2/$lab.log 2>&1 || echo "$lab failed"
  done
done
