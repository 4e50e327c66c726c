#!/bin/bash
# The sittings of summary.md (2026-11-29 05:24-05:30Z, 2-core AMD EPYC): WT is a worktree at ffb80fd with probe.patch
# applied (git worktree add $WT ffb80fd && git -C $WT apply probe.patch); A the rounds as they are, B the send chain.
WT=${WT:-/tmp/wt}; cd $WT
export PYTHONPATH=$WT
orders=("A B" "B A" "A B" "B A")
for s in 0 1 2 3; do
  for m in ${orders[$s]}; do
    if [ $m = A ]; then unset PIPESGD_EXP_SENDER; lab=rounds-s$s; else export PIPESGD_EXP_SENDER=1; lab=chains-s$s; fi
    echo "== $lab $(date +%T)"
    python3 experiments/bench_pipeline.py --bandwidth 200mbit --variants q8,q8+ef --baselines - --allreduce alltoall --label $lab --out /tmp/sc/out > /tmp/sc/$lab.log 2>&1
    echo "rc=$?"
  done
done
