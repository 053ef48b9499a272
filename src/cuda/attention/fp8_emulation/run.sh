#!/usr/bin/env bash
# Builds and runs the FP8 attention kernels' host emulation (harness.cc).
# usage: run.sh [BUILD_DIR] [case-name filter | quick]
#   BUILD_DIR: a CPU (or CUDA) CMake build of flashgrad with libflashgrad.a (default build-fp8k/cpu)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../../.." && pwd)
build=${1:-$root/build-fp8k/cpu}
out=$build/fp8_emulation
lib=$(find "$build" -maxdepth 2 -name libflashgrad.a | head -1)
python3 "$here/rewrite_asm.py" "$root/src/cuda/attention" "$out/headers"
cuda_inc=$(dirname "$(command -v nvcc)")/../include
# -w: g++ warns about every CUDA attribute it ignores (__device__, __global__, ...).
g++ -std=c++20 -O2 -w -pthread -I"$out/headers" -I"$root/src" -I"$root/include" -I"$root/tests/cpp" \
  -I"$cuda_inc" "$here/harness.cc" "$lib" -o "$out/fp8_emulation"
"$out/fp8_emulation" "${2:-}"
