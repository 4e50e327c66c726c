#!/bin/bash
# The four sittings of summary.md (2026-11-29, 2-core AMD EPYC, commit 3867cd3 with probe.patch applied in a worktree at
# /tmp/wt, run as root): sys.setswitchinterval in every node's process, set by the probe's hook when the
# communication worker starts: 5 ms (Python's default) against 0.5 ms; the order turns every sitting.
export PYTHONPATH=/tmp/wt
cd /tmp/wt
orders=("5 0.5" "0.5 5" "5 0.5" "0.5 5")
for s in 0 1 2 3; do
  for m in ${orders[$s]}; do
    lab=sw$m-s$s
    export PIPESGD_EXP_SWITCH=$(python3 -c "print($m/1000)")
    python3 experiments/bench_pipeline.py --bandwidth 200mbit --variants q8,q8+ef --baselines - --allreduce alltoall \
      --workloads mlp1.9m --label $lab --out /tmp/sw/out > /tmp/sw/$lab.log 2>&1 || echo "$lab failed"
  done
done
