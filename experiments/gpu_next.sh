#!/bin/bash
# The next GPU machine's call, prepared (issue 38 part 4, issue 36 item 5): one call of about 8 minutes.
#   run (device tool): command "bash experiments/gpu_next.sh 500", timeout_s 560; the results come back packed in
#   $OUT/gpu8.tgz (one folder per step, each step's log, steps.txt with each step's time and exit code).
# Under MPS (the 4 ranks' kernels run concurrently): the GIL switch interval A/B (gpu_contention.py and gpu_speed.py
# --models resnet18 at Python's 5 ms and at 0.1 ms, experiments/results/gil_switch/report.md), then the gloo-CUDA
# correctness check; without MPS: NCCL at world size 1 and the LeNet / ResNet-20 speed table. A step that no longer
# fits the budget (first argument, seconds) is skipped and says so. Installs with --no-build-isolation (the
# machine has no network for build dependencies) and runs from the checkout either way (PYTHONPATH).
set -u
BUDGET=${1:-500}
START=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/gpu8; mkdir -p $R
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
pack() { tar czf $OUT/gpu8.tgz -C $OUT gpu8; }
trap pack EXIT
(nvidia-smi -L; python3 -c "import torch,sys; print(torch.__version__, torch.version.cuda, sys.version)"; git log --oneline -1; nproc) > $R/env.txt 2>&1
pip install -q --no-deps --no-build-isolation -e . > $R/install.log 2>&1 || echo "install failed (PYTHONPATH used)" >> $R/install.log
nvidia-cuda-mps-control -d && echo "MPS on" >> $R/env.txt
step contention-5ms 150 python3 experiments/gpu_contention.py --device cuda --ranks 4 --out $R/cont5
step contention-0.1ms 150 python3 experiments/gpu_contention.py --device cuda --ranks 4 --out $R/cont01 --switch-interval-ms 0.1
step speed-r18-5ms 120 python3 experiments/gpu_speed.py --device cuda --ranks 4 --models resnet18 --out $R/speed5
step speed-r18-0.1ms 120 python3 experiments/gpu_speed.py --device cuda --ranks 4 --models resnet18 --out $R/speed01 --switch-interval-ms 0.1
step check-gloo 120 python3 experiments/gpu_check.py --device cuda --ranks 4 --out $R/check
echo quit | nvidia-cuda-mps-control
step check-nccl1 90 python3 experiments/gpu_check.py --device cuda --ranks 1 --backend nccl --out $R/check-nccl
step speed-lenet-r20 120 python3 experiments/gpu_speed.py --device cuda --ranks 4 --models lenet,resnet20 --out $R/speed-small
echo "done in $(( $(date +%s) - START ))s" | tee -a $R/steps.txt
