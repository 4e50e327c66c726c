#!/bin/bash
# The five sittings of summary.md (2026-11-29 04:44-04:55Z, 2-core AMD EPYC, commit 314f04c with probe.patch applied:
# `git worktree add /tmp/wt 314f04c && cd /tmp/wt && git apply .../probe.patch`, run from /tmp/wt as root).
# PIPESGD_EXP_NICE (the probe's hook, not in the library): others:-10 renices every thread of a node's process but
# the training thread (the communication worker and gloo's) to -10 when the worker starts; train:10 renices the
# training thread to +10; none leaves both at 0. The order turns every sitting.
export PYTHONPATH=$PWD
orders=("none others:-10 train:10" "train:10 none others:-10" "others:-10 train:10 none"
        "train:10 others:-10 none" "others:-10 none train:10")
for s in 0 1 2 3 4; do
  for m in ${orders[$s]}; do
    lab=$(echo $m | tr ':' '_')-s$s
    if [ "$m" = none ]; then unset PIPESGD_EXP_NICE; else export PIPESGD_EXP_NICE=$m; fi
    python3 experiments/bench_pipeline.py --bandwidth 200mbit --variants q8,q8+ef --baselines - --allreduce alltoall \
      --label $lab --out /tmp/nice/out > /tmp/nice/$lab.log 2>&1 || echo "$lab failed"
  done
done
