#!/bin/bash
# A GPU machine's call (issue 38 part 4), run 2026-11-27 14:07 UTC (experiments/results/gpu/forwarding_ab-mps.md); kept
# as the pattern for the next one: one call of about 5 minutes.
#   run (device tool): command "bash experiments/gpu_next.sh 420", timeout_s 460; the results come back packed in
#   $OUT/gpu9.tgz (one folder per step, each step's log, steps.txt with each step's time and exit code).
# All under MPS (the 4 ranks' kernels run concurrently): the gloo-CUDA correctness check first (the compressed ring's
# all-gather now forwards payloads from host memory), then LeNet and ResNet-18 speed, A/B/C/A side by side: the
# all-gather through the device as before (A), forwarded from host memory (B, the default now), and B with the
# communication side stream at high CUDA priority (C); A once more for the sitting's own spread; then the ring beside
# loads (gpu_contention.py) for B and C. A step that no longer fits the budget (first argument, seconds) is skipped
# and says so. Installs with --no-build-isolation (no network for build dependencies) and runs from the checkout
# either way (PYTHONPATH).
set -u
BUDGET=${1:-500}
START=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/gpu9; mkdir -p $R
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
pack() { tar czf $OUT/gpu9.tgz -C $OUT gpu9; }
trap pack EXIT
(nvidia-smi -L; python3 -c "import torch,sys; print(torch.__version__, torch.version.cuda, sys.version)"; git log --oneline -1; nproc) > $R/env.txt 2>&1
pip install -q --no-deps --no-build-isolation -e . > $R/install.log 2>&1 || echo "install failed (PYTHONPATH used)" >> $R/install.log
nvidia-cuda-mps-control -d && echo "MPS on" >> $R/env.txt
step check-gloo 120 python3 experiments/gpu_check.py --device cuda --ranks 4 --out $R/check
step speed-A-device 120 python3 experiments/gpu_speed.py --device cuda --ranks 4 --models lenet,resnet18 --out $R/speedA --gather-through-device
step speed-B-host 120 python3 experiments/gpu_speed.py --device cuda --ranks 4 --models lenet,resnet18 --out $R/speedB
step speed-C-priority 120 python3 experiments/gpu_speed.py --device cuda --ranks 4 --models lenet,resnet18 --out $R/speedC --side-stream-priority -1
step speed-A2-device 120 python3 experiments/gpu_speed.py --device cuda --ranks 4 --models lenet,resnet18 --out $R/speedA2 --gather-through-device
step contention-B 90 python3 experiments/gpu_contention.py --device cuda --ranks 4 --out $R/contB
step contention-C 90 python3 experiments/gpu_contention.py --device cuda --ranks 4 --out $R/contC --side-stream-priority -1
echo quit | nvidia-cuda-mps-control
echo "done in $(( $(date +%s) - START ))s" | tee -a $R/steps.txt
