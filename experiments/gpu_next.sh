#!/bin/bash
# The next GPU machine's call, prepared (issue 38 part 4): one call of about 4 minutes.
#   run (device tool): command "bash experiments/gpu_next.sh 300", timeout_s 330; the results come back packed in
#   $OUT/gpu13.tgz (one folder per step, each step's log, steps.txt with each step's time and exit code).
# The look-ahead stand-ins that wait for an exchange of the step just taken (coarse-q8, coarse-lowrank) beside the
# own gradient, in training and in the check; the gather rows again. Not yet run since coarse-lowrank became the
# one-all-reduce form (2026-11-27; its check row is the first CUDA run of it), and width and compression "auto"
# (issue 39: the early look's timed broadcasts, the agreed measurements and rank 0's broadcast decision on CUDA
# tensors, never yet run there). One call:
# under MPS the gloo-CUDA check (stand-in rows added) and the speed table of all three models; then, without MPS,
# NCCL at world size 1. A step that no longer fits the budget (first argument, seconds) is skipped and says so.
# Installs with --no-build-isolation (no network for build dependencies) and runs from the checkout either way
# (PYTHONPATH).
set -u
BUDGET=${1:-500}
START=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/gpu13; mkdir -p $R
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
step() {  # name timeout cmd...
  local name=$1 t=$2; shift 2
  local l=$(left); if [ "$l" -lt 40 ]; then echo "skip $name (${l}s left)" | tee -a $R/steps.txt; return; fi
  [ "$t" -gt "$l" ] && t=$l
  local s=$(date +%s); echo "== $name (timeout ${t}s) $(date -u +%H:%M:%SZ)" | tee -a $R/steps.txt
  timeout $t "$@" > $R/$name.log 2>&1; local rc=$?
  echo "   rc=$rc in $(( $(date +%s) - s ))s" | tee -a $R/steps.txt
  tail -3 $R/$name.log
}
pack() { tar czf $OUT/gpu13.tgz -C $OUT gpu13; }
trap pack EXIT
(nvidia-smi -L; python3 -c "import torch,sys; print(torch.__version__, torch.version.cuda, sys.version)"; git log --oneline -1; nproc) > $R/env.txt 2>&1
pip install -q --no-deps --no-build-isolation -e . > $R/install.log 2>&1 || echo "install failed (PYTHONPATH used)" >> $R/install.log
nvidia-cuda-mps-control -d && echo "MPS on" >> $R/env.txt
step check-gloo 110 python3 experiments/gpu_check.py --device cuda --ranks 4 --out $R/check
step speed-mps 150 python3 experiments/gpu_speed.py --device cuda --ranks 4 --out $R/speed
echo quit | nvidia-cuda-mps-control
step check-nccl1 60 python3 experiments/gpu_check.py --device cuda --ranks 1 --backend nccl --out $R/check-nccl
echo "done in $(( $(date +%s) - START ))s" | tee -a $R/steps.txt
