#!/bin/bash
# The eight sittings of summary.md (2026-11-29 04:58-05:03Z, 2-core AMD EPYC, nothing else running): the exchange on
# 4 loopback ranks sent as rounds of one peer (A: commit dc0070b, checked out in /tmp/wt) and as gloo's collectives
# (B: commit a42d46f, in /tmp/wt2, where a loopback MASTER_ADDR makes it the default), the order turned each sitting.
orders=("A B" "B A" "A B" "B A" "B A" "A B" "B A" "A B")
for s in 0 1 2 3 4 5 6 7; do
  for m in ${orders[$s]}; do
    if [ $m = A ]; then d=/tmp/wt; lab=rounds-s$s; else d=/tmp/wt2; lab=collectives-s$s; fi
    (cd $d && PYTHONPATH=$d python3 experiments/bench_pipeline.py --loopback --variants q8,q8+ef,sign+ef \
      --baselines - --allreduce alltoall --label $lab --out /tmp/lb/out > /tmp/lb/$lab.log 2>&1) || echo "$lab failed"
  done
done
