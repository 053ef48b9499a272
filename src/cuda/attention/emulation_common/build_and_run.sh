#!/usr/bin/env bash
# Builds and runs one FP8 attention emulation harness (what each harness folder's run.sh does):
# the kernel headers rewritten for the host by PREPARE (rewrite_asm.py / prepare_headers.py) into
# OUT_DIR/headers, HARNESS_DIR/harness.cc compiled against BUILD_DIR's libflashgrad.a into
# OUT_DIR/<harness folder name>, then run with FILTER (a case-name filter, "quick", or empty: all).
# usage: build_and_run.sh HARNESS_DIR PREPARE BUILD_DIR OUT_DIR [FILTER]
set -euo pipefail
harness_dir=$1 prepare=$2 build=$3 out=$4 filter=${5:-}
root=$(cd "$(dirname "$0")/../../../.." && pwd)
name=$(basename "$harness_dir")
lib=$(find "$build" -maxdepth 2 -name libflashgrad.a | head -1)
python3 "$prepare" "$root/src/cuda/attention" "$out/headers"
cuda_inc=$(dirname "$(command -v nvcc)")/../include
# -w: g++ warns about every CUDA attribute it ignores (__device__, __global__, ...).
g++ -std=c++20 -O2 -w -Wno-psabi -pthread -I"$out/headers" -I"$root/src" -I"$root/include" -I"$root/tests/cpp" \
  -I"$cuda_inc" "$harness_dir/harness.cc" "$lib" -o "$out/$name"
"$out/$name" "$filter"
