#!/bin/sh
# Build CUDA_HOME ($2) as links into the CUDA wheels of a virtual environment ($1), so that
# nvcc, headers and libraries are found the way a CUDA toolkit install lays them out,
# without copying a single library. Works for the per-library nvidia-*-cu12 wheels and the
# cuda-toolkit (cu13) layout.
set -eu
venv=$1 home=$2
nvidia=$(find "$venv"/lib/python3*/site-packages/nvidia -maxdepth 0 -type d)
nvcc=$(find "$nvidia" -path '*/bin/nvcc' -type f | head -n 1)
[ -n "$nvcc" ] || { echo "link-cuda-home: no nvcc under $nvidia" >&2; exit 1; }
mkdir -p "$home/bin" "$home/include" "$home/lib64"
for tool in "$(dirname "$nvcc")"/*; do ln -sf "$tool" "$home/bin/"; done
for dir in "$nvidia"/*/include "$nvidia"/*/*/include; do
  [ -d "$dir" ] || continue
  for entry in "$dir"/*; do [ -e "$home/include/$(basename "$entry")" ] || ln -s "$entry" "$home/include/"; done
done
# Static archives too: nvcc links libcudart_static.a and libcudadevrt.a by default.
for dir in "$nvidia"/*/lib "$nvidia"/*/lib64; do
  [ -d "$dir" ] || continue
  for lib in "$dir"/*.so* "$dir"/*.a; do [ -e "$lib" ] && ln -sf "$lib" "$home/lib64/"; done
done
# The wheels' nvcc.profile searches $TOP/lib (cu13) or $TOP/lib64 (cu12), with TOP the
# directory above the nvcc it was started as: here $home. A toolkit install has both.
[ -e "$home/lib" ] || ln -s lib64 "$home/lib"
# Linkers look for the unversioned name (libcudart.so); the wheels ship only libcudart.so.N.
for lib in "$home"/lib64/*.so.*; do
  plain=${lib%%.so.*}.so
  [ -e "$plain" ] || ln -s "$(basename "$lib")" "$plain"
done
nvvm=$(dirname "$(dirname "$nvcc")")/nvvm
[ -d "$nvvm" ] || nvvm=$(find "$nvidia" -maxdepth 2 -name nvvm -type d | head -n 1)
[ -z "$nvvm" ] || ln -sfn "$nvvm" "$home/nvvm"
"$home/bin/nvcc" --version
