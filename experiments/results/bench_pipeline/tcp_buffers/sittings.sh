#!/bin/bash
# The sockets' initial buffers in every node's namespace, set by the probe's hook when the cluster is made (before
# any socket): tcp_rmem and tcp_wmem "4096 1048576 33554432" (1 MiB to start, more than one round's 466 KB) against
# the namespace defaults (rmem 131072, wmem 16384 to start); the order turns every sitting.
# Run from a worktree at commit 3867cd3 with probe.patch applied (/tmp/wt), as root, 2026-11-29, 2-core AMD EPYC.
export PYTHONPATH=/tmp/wt
cd /tmp/wt
orders=("default 1m" "1m default" "default 1m" "1m default")
for s in 0 1 2 3; do
  for m in ${orders[$s]}; do
    if [ "$m" = default ]; then unset PIPESGD_EXP_TCPMEM; else export PIPESGD_EXP_TCPMEM="4096 1048576 33554432"; fi
    lab=$m-s$s
    python3 experiments/bench_pipeline.py --bandwidth 200mbit --variants q8,q8+ef --baselines - --allreduce alltoall \
      --workloads mlp1.9m --label $lab --out /tmp/tm/out > /tmp/tm/$lab.log 2>&1 || echo "$lab failed"
  done
done
