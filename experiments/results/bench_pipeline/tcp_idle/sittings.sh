#!/bin/bash
# The four sittings of summary.md (2026-11-29, 2-core AMD EPYC, commit 3867cd3 with probe.patch applied in a worktree at
# /tmp/wt, run as root): tcp_slow_start_after_idle 1 (the default) against 0 in every node's network namespace, set
# by the probe's hook when the communication worker starts; the order turns every sitting.
export PYTHONPATH=/tmp/wt
cd /tmp/wt
orders=("1 0" "0 1" "1 0" "0 1")
for s in 0 1 2 3; do
  for m in ${orders[$s]}; do
    lab=ssai$m-s$s
    export PIPESGD_EXP_SSAI=$m
    python3 experiments/bench_pipeline.py --bandwidth 200mbit --variants q8,q8+ef --baselines - --allreduce alltoall --workloads mlp1.9m \
      --label $lab --out /tmp/ssai/out > /tmp/ssai/$lab.log 2>&1 || echo "$lab failed"
  done
done
