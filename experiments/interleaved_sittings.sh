#!/bin/bash
# Two sittings of the comparison grid interleaved cell by cell: each cell is calibrated and run twice in a row
# (sitting a then b, the next cell b then a, so neither sitting always goes first), each time into its own result.
# The two results hold the same runs minutes apart, each with its own calibration; compare them with
#     python -m experiments.harness.repeatability experiments/results/NAME/sitting-a.json \
#         experiments/results/NAME/sitting-b.json --all
# Usage (root, from the repository root):
#     bash experiments/interleaved_sittings.sh NAME CELLS VARIANTS
#     e.g. bash experiments/interleaved_sittings.sh fidelity lenet-1gbit,alexnet-unshaped sync,pipe,ddp
# writes experiments/results/NAME/sitting-{a,b}.json and raw metrics under results/NAME-{a,b}/.
set -u
if [ $# -ne 3 ]; then
    echo "usage: bash experiments/interleaved_sittings.sh NAME CELLS VARIANTS (comma lists)" >&2
    exit 2
fi
name=$1 cells=$2 variants=$3
for sitting in a b; do
    if [ -e "experiments/results/$name/sitting-$sitting.json" ]; then
        echo "interleaved_sittings: experiments/results/$name/sitting-$sitting.json exists; pick a new NAME" >&2
        exit 2
    fi
done
failed=0 i=0
for cell in ${cells//,/ }; do
    if [ $((i % 2)) -eq 0 ]; then order="a b"; else order="b a"; fi
    for sitting in $order; do
        echo "=== $(date -u +%FT%TZ) cell $cell sitting $sitting"
        python experiments/comparison.py --cells "$cell" --variants "$variants" \
            --result "experiments/results/$name/sitting-$sitting.json" --out "results/$name-$sitting" || failed=1
    done
    i=$((i + 1))
done
echo "=== $(date -u +%FT%TZ) done"
exit $failed
