#!/usr/bin/env bash
# Builds and runs the FP8 wgmma backward's host emulation (harness.cc).
# usage: run.sh [BUILD_DIR] [case-name filter | quick]
#   BUILD_DIR: a CPU (or CUDA) CMake build of flashgrad with libflashgrad.a (default build-fp8b/cpu)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../../.." && pwd)
build=${1:-$root/build-fp8b/cpu}
out=$root/build-fp8b/fp8_wgmma_backward_emulation  # own output folder, whichever build the library comes from
lib=$(find "$build" -maxdepth 2 -name libflashgrad.a | head -1)
python3 "$here/prepare_headers.py" "$root/src/cuda/attention" "$out/headers"
cuda_inc=$(dirname "$(command -v nvcc)")/../include
# -w: g++ warns about every CUDA attribute it ignores (__device__, __global__, ...).
g++ -std=c++20 -O2 -w -Wno-psabi -pthread -I"$out/headers" -I"$root/src" -I"$root/include" -I"$root/tests/cpp" \
  -I"$cuda_inc" "$here/harness.cc" "$lib" -o "$out/fp8_wgmma_backward_emulation"
"$out/fp8_wgmma_backward_emulation" "${2:-}"
