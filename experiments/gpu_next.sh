#!/bin/bash
# The next GPU machine's call, prepared (issue 38 part 4): one call of about 3 minutes.
#   run (device tool): command "bash experiments/gpu_next.sh 200", timeout_s 220; the results come back packed in
#   $OUT/gpu10.tgz (one folder per step, each step's log, steps.txt with each step's time and exit code).
# All under MPS (the 4 ranks' kernels run concurrently): the gloo-CUDA correctness check on a model small enough that
# every compressed ring runs on a host copy with the CPU codec (RingTopology.HOST_RING_ELEMENTS), then LeNet and
# ResNet-20 speed, A/B/A side by side: every ring on the GPU (A: --host-ring-elements 0), small rings on host (B, the
# default). A step that no longer fits the budget (first argument, seconds) is skipped and says so. Installs with
# --no-build-isolation (no network for build dependencies) and runs from the checkout either way (PYTHONPATH).
set -u
BUDGET=${1:-500}
START=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/gpu10; mkdir -p $R
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
pack() { tar czf $OUT/gpu10.tgz -C $OUT gpu10; }
trap pack EXIT
(nvidia-smi -L; python3 -c "import torch,sys; print(torch.__version__, torch.version.cuda, sys.version)"; git log --oneline -1; nproc) > $R/env.txt 2>&1
pip install -q --no-deps --no-build-isolation -e . > $R/install.log 2>&1 || echo "install failed (PYTHONPATH used)" >> $R/install.log
nvidia-cuda-mps-control -d && echo "MPS on" >> $R/env.txt
step check-host-ring 90 python3 experiments/gpu_check.py --device cuda --ranks 4 --hidden 512 --out $R/check
step speed-A-device 70 python3 experiments/gpu_speed.py --device cuda --ranks 4 --models lenet,resnet20 --out $R/speedA --host-ring-elements 0
step speed-B-host 70 python3 experiments/gpu_speed.py --device cuda --ranks 4 --models lenet,resnet20 --out $R/speedB
step speed-A2-device 70 python3 experiments/gpu_speed.py --device cuda --ranks 4 --models lenet,resnet20 --out $R/speedA2 --host-ring-elements 0
echo quit | nvidia-cuda-mps-control
echo "done in $(( $(date +%s) - START ))s" | tee -a $R/steps.txt
