#!/bin/sh
# The in-image self-test on a GPU machine, with that machine's own torch: the GPU report that
# is committed beside this script as selftest-<date>-<gpu>[-pruned].json and .txt. One short run:
#   sh benchmarks/gpu-selftest.sh OUTDIR [--pruned]
# --pruned first deletes what data/layout.yaml removes from images (apply_layout_prunes.py),
# from this machine's own site-packages and root: only on a machine that is given back after.
# Needs python3 with torch (CUDA build) and nvidia-smi; the self-test stops after 6 minutes.
set -eu
out=${1:?usage: gpu-selftest.sh OUTDIR [--pruned]}
mode=${2:-}
mkdir -p "$out"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 | tr ' ' '-' | tr -cd 'A-Za-z0-9-')
name="selftest-$(date -u +%Y-%m-%d)-$gpu"
if [ "$mode" = "--pruned" ]; then
    name="$name-pruned"
    python3 benchmarks/apply_layout_prunes.py --yes-this-machine-is-disposable | tee "$out/$name.pruned.txt"
fi
# No spec.json outside an image: the environment check then reports versions without comparing.
# --profile: the profiler runs over every check, with triton's CUPTI archives gone.
status=0
PYTHONUNBUFFERED=1 timeout 360 python3 image/selftest.py --peaks image/gpu_peaks.json \
    --spec /nonexistent --profile /tmp/selftest-trace --json "$out/$name.json" > "$out/$name.txt" 2>&1 || status=$?
ls -l /tmp/selftest-trace >> "$out/$name.txt" 2>&1 || true
cat "$out/$name.txt"
exit "$status"
