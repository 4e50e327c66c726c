#!/bin/bash
# The sittings of summary.md (2026-11-29 08:48-08:55Z, the 2-core AMD EPYC host, nothing else running): the exchange
# and the ring alone on loopback gloo, from two worktrees (old: b436daa, before the batched copies; new: 1d0ee8d),
# the order turned each sitting. first/: p = 4 and 8, q8 and sign; second/: p = 4, q8 alone.
for s in 1 2 3 4 5 6; do
  if [ $((s % 2)) = 1 ]; then order="old new"; else order="new old"; fi
  for v in $order; do
    cd /tmp/wt_$v && PYTHONPATH=/tmp/wt_$v python experiments/bench_allreduce_choice.py --ranks 4,8 --sizes-mib 0.5 \
      --codecs q8,sign --rounds 5 --repeats 10 --out /tmp/ab/$v-s$s > /tmp/ab/$v-s$s.log 2>&1 || echo "$v-s$s failed"
  done
done
for s in 1 2 3 4 5 6; do
  if [ $((s % 2)) = 1 ]; then order="old new"; else order="new old"; fi
  for v in $order; do
    cd /tmp/wt_$v && PYTHONPATH=/tmp/wt_$v python experiments/bench_allreduce_choice.py --ranks 4 --sizes-mib 0.5 \
      --codecs q8 --rounds 5 --repeats 10 --out /tmp/ab/r$v-s$s > /dev/null 2>&1 || echo "r$v-s$s failed"
  done
done
