#!/usr/bin/env bash
# Builds and runs the CPU emulation of the chunked stages (harness.cc says what it checks).
# Needs: g++ with C++20, the CUDA headers (no GPU), and a built libflashgrad.a for the CPU
# reference. Usage: run.sh BUILD_DIR [quick|all]   e.g. run.sh build-chunked all
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../../.." && pwd)"
build="$(cd "${1:?usage: run.sh BUILD_DIR [quick|all]}" && pwd)"
cuda_home="${CUDA_HOME:-/usr/local/cuda}"
out="$build/chunked_emulation_harness"
libs=(-lpthread)
# A CUDA-enabled libflashgrad.a also needs the CUDA runtime to link (no GPU is touched).
if [ -d "$build/CMakeFiles/flashgrad.dir/src/cuda" ]; then libs=(-L"$cuda_home/lib64" -lcudart "${libs[@]}"); fi
# -w: g++ warns about every CUDA attribute it ignores (__device__, __global__, ...).
g++ -std=c++20 -O1 -w -DFLASHGRAD_CHUNKED_HOST_EMULATION -I"$cuda_home/include" -I"$root/src" -I"$root/include" \
  "$here/harness.cc" "$build/libflashgrad.a" "${libs[@]}" -o "$out"
"$out" "${2:-quick}"
