#!/bin/bash
# The first trial (2026-11-29 08:09-08:14Z, 2-core AMD EPYC, commit c09a738 with first_trial/probe.patch in a worktree
# at /tmp/wt, run as root; the json files here, summary.md by pipeline_sittings.py). This probe kept the pin until
# the process ended, so in a setting with one the q8+ef row's all-reduce alone (timed on the training thread after
# q8's pipeline) ran pinned too: compare iterations, not that row's efficiency. ../probe.patch gives the pin back
# at close(); ../sittings.sh is the second trial, with it.
# PIPESGD_EXP_SPLIT (the probe's hook): "T/C" = each node's training thread on cores T, its other threads on C.
export PYTHONPATH=/tmp/wt
cd /tmp/wt
orders=("none 0/1 0/0,1" "0/0,1 none 0/1" "0/1 0/0,1 none" "none 0/0,1 0/1" "0/1 none 0/0,1" "0/0,1 0/1 none")
for s in 0 1 2 3 4 5; do
  for m in ${orders[$s]}; do
    lab=$(echo $m | tr '/,' '_-')-s$s
    if [ "$m" = none ]; then unset PIPESGD_EXP_SPLIT; else export PIPESGD_EXP_SPLIT=$m; fi
    python3 experiments/bench_pipeline.py --bandwidth 200mbit --variants q8,q8+ef --baselines - --allreduce alltoall --workloads mlp1.9m \
      --label $lab --out /tmp/split/out > /tmp/split/$lab.log 2>&1 || echo "$lab failed"
  done
done
