#!/bin/sh
# The in-image self-test on a GPU machine, with that machine's own torch: the GPU report that
# is committed beside this script as selftest-<date>-<gpu>.json and .txt. One short run:
#   sh benchmarks/gpu-selftest.sh OUTDIR
# needs python3 with torch (CUDA build) and nvidia-smi; stops after 5 minutes.
set -eu
out=${1:?usage: gpu-selftest.sh OUTDIR}
mkdir -p "$out"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 | tr ' ' '-' | tr -cd 'A-Za-z0-9-')
name="selftest-$(date -u +%Y-%m-%d)-$gpu"
# No spec.json outside an image: the environment check then reports versions without comparing.
status=0
PYTHONUNBUFFERED=1 timeout 300 python3 image/selftest.py --peaks image/gpu_peaks.json \
    --spec /nonexistent --json "$out/$name.json" > "$out/$name.txt" 2>&1 || status=$?
cat "$out/$name.txt"
exit "$status"
