#!/bin/bash
# A short EEVDF slice (sched_setattr's sched_runtime, no root) for every thread of each node's process but the
# training thread, set by the probe's hook when the communication worker starts: 0.1 ms against the kernel's default
# (1.4 ms here); the order turns every sitting.
# Run from a worktree at commit 3867cd3 with probe.patch applied (/tmp/wt), as root, 2026-11-29, 2-core AMD EPYC.
export PYTHONPATH=/tmp/wt
cd /tmp/wt
orders=("default 100000" "100000 default" "default 100000" "100000 default")
for s in 0 1 2 3; do
  for m in ${orders[$s]}; do
    if [ "$m" = default ]; then unset PIPESGD_EXP_SLICE; lab=default-s$s; else export PIPESGD_EXP_SLICE=$m; lab=slice0.1ms-s$s; fi
    python3 experiments/bench_pipeline.py --bandwidth 200mbit --variants q8,q8+ef --baselines - --allreduce alltoall \
      --workloads mlp1.9m --label $lab --out /tmp/sl/out > /tmp/sl/$lab.log 2>&1 || echo "$lab failed"
  done
done
