#!/usr/bin/env bash
# Builds and runs the FP8 wgmma forward's host emulation (harness.cc).
# usage: run.sh [BUILD_DIR] [case-name filter | quick]
#   BUILD_DIR: a CPU (or CUDA) CMake build of flashgrad with libflashgrad.a (default build-fp8w/cpu)
# The 16-bit and mma.sync FP8 headers are copied by the mma.sync FP8 emulation's rewrite_asm.py
# (inline PTX replaced, namespace renamed to cuda_attn_emulated); the fp8_wgmma_* headers are copied
# with the same rename, and the two Hopper primitive headers replaced by empty ones (harness.cc
# defines their functions).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../../.." && pwd)
build=${1:-$root/build-fp8w/cpu}
out=$build/fp8_wgmma_emulation
lib=$(find "$build" -maxdepth 2 -name libflashgrad.a | head -1)
python3 "$root/src/cuda/attention/fp8_emulation/rewrite_asm.py" "$root/src/cuda/attention" "$out/headers"
for f in fp8_wgmma_forward_kernel.cuh fp8_wgmma_vt.cuh fp8_wgmma_maps.h; do
  if grep -q '\basm\b' "$root/src/cuda/attention/$f"; then
    echo "$f has inline PTX: move it into fp8_wgmma_primitives.cuh (emulated in harness.cc)" >&2
    exit 1
  fi
  sed 's/flashgrad::cuda_attn/flashgrad::cuda_attn_emulated/g' "$root/src/cuda/attention/$f" > "$out/headers/$f"
done
for f in wgmma_primitives.cuh fp8_wgmma_primitives.cuh; do
  printf '// Emulated: harness.cc defines these functions.\n#pragma once\n' > "$out/headers/$f"
done
cuda_inc=$(dirname "$(command -v nvcc)")/../include
# -w: g++ warns about every CUDA attribute it ignores (__device__, __global__, ...).
g++ -std=c++20 -O2 -w -Wno-psabi -pthread -I"$out/headers" -I"$root/src" -I"$root/include" -I"$root/tests/cpp" \
  -I"$cuda_inc" "$here/harness.cc" "$lib" -o "$out/fp8_wgmma_emulation"
"$out/fp8_wgmma_emulation" "${2:-}"
