#!/bin/bash
# The next GPU machine's call, prepared (issue 38 parts 3 and 4): one call of about 5-7 minutes.
#   run (device tool): command "bash experiments/gpu_next.sh 450", timeout_s 480, carry [".device/debs"] (iproute2's
#   Debian packages for the last step: `apt-get download iproute2 libbpf1 libbsd0 libmd0 libcap2 libdb5.3 libelf1
#   zlib1g libmnl0 libselinux1 libpcre2-8-0 libtirpc3 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libcom-err2
#   libkrb5support0 libkeyutils1 libxtables12` in .device/debs, bookworm's); the results come back packed in
#   $OUT/gpu13.tgz (one folder per step, each step's log, steps.txt with each step's time and exit code).
# New since the fifth session: the fifth session's lead, one Pipe-SGD step's host time thread by thread
# (experiments/gpu_thread_profile.py: LeNet and ResNet-18, q8 on the exchange, ring and gather, none; the training
# thread's and the communication thread's CPU time, operators, kernel launches, copies and syncs; rank 0's trace).
# Still never run there: the look-ahead stand-ins that wait for an exchange of the step just taken (coarse-lowrank as
# one all-reduce) and width and compression "auto" on CUDA tensors (issue 39), in the check and the speed table; the
# exchange one peer at a time is CPU-only (staged CUDA payloads keep gloo's collectives).
# One call: under MPS the gloo-CUDA check, the speed table of all three models and the thread profile; then, without
# MPS, the contention table time-sliced (issue 38 part 4 asks for both; gpu_contention.md is still the first
# session's, the ring alone), q8 and q4 with their kernels fused by torch.compile against the eager codec (part 3:
# same values? host and device time per call; experiments/bench_codec_compiled.py) and NCCL at world size 1. The fifth
# session's calls took 112-152 s for the check, speed, contention and NCCL steps together. A step that no longer fits
# the budget (first argument, seconds) is skipped and says so. After the codec: the BatchNorm buffers' per-step
# copies, the per-buffer loop against the flat group that replaced it (experiments/bench_buffer_copies.py).
# Last, with 100 s left: bench_pipeline's 200 Mbit/s target on the exchange, 4 emulated nodes with 4 cores of their
# own each.
# Afterwards, here: python experiments/gpu_import.py FILES_AT/gpu13.tgz --commit <the working tree's commit> --call
# "<session>, <call>" writes each finished step's table with its header into experiments/results.
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
(date -u +%Y-%m-%d; nvidia-smi -L; python3 -c "import torch,sys; print(torch.__version__, torch.version.cuda, sys.version)"; git log --oneline -1; nproc) > $R/env.txt 2>&1
pip install -q --no-deps --no-build-isolation -e . > $R/install.log 2>&1 || echo "install failed (PYTHONPATH used)" >> $R/install.log
nvidia-cuda-mps-control -d && echo "MPS on" >> $R/env.txt
step check-gloo 110 python3 experiments/gpu_check.py --device cuda --ranks 4 --out $R/check
step speed-mps 150 python3 experiments/gpu_speed.py --device cuda --ranks 4 --out $R/speed
step profile-mps 90 python3 experiments/gpu_thread_profile.py --device cuda --ranks 4 --out $R/profile
echo quit | nvidia-cuda-mps-control
step contention-ts 80 python3 experiments/gpu_contention.py --device cuda --ranks 4 --out $R/contention
step codec-compiled 120 python3 experiments/bench_codec_compiled.py --device cuda --out $R/codec
step buffer-copies 40 python3 experiments/bench_buffer_copies.py --device cuda --out $R/buffers
step check-nccl1 60 python3 experiments/gpu_check.py --device cuda --ranks 1 --backend nccl --out $R/check-nccl
# Last, and only with 100 s left: issue 38's CPU target on the exchange with 4 cores per node (the 2-core host reads
# 0.88 on the 1.9 M MLP; the ring read 0.97-1.00 here in the first session). iproute2 from the carried packages.
if [ "$(left)" -ge 100 ] && [ -d .device/debs ]; then
  step iproute2 40 python3 experiments/gpu_session.py --unpack-debs .device/debs --into /tmp/pipesgd-iproute2
  PATH=/tmp/pipesgd-iproute2/bin:$PATH step pipeline-16cores 120 python3 experiments/bench_pipeline.py \
    --bandwidth 200mbit --nodes 4 --cores-per-node 4 --variants q8,q8+ef --baselines - --allreduce alltoall \
    --label 200mbit-16cores --out $R/pipeline
else
  echo "skip pipeline-16cores ($(left)s left; .device/debs $([ -d .device/debs ] && echo present || echo absent))" | tee -a $R/steps.txt
fi
echo "done in $(( $(date +%s) - START ))s" | tee -a $R/steps.txt
