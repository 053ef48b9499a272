#!/usr/bin/env bash
# Builds and runs the FP8 attention kernels' host emulation (harness.cc).
# usage: run.sh [BUILD_DIR] [case-name filter | quick]
#   BUILD_DIR: a CPU (or CUDA) CMake build of flashgrad with libflashgrad.a (default build-fp8k/cpu)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../../../build-fp8k/cpu}
"$here/../emulation_common/build_and_run.sh" "$here" "$here/rewrite_asm.py" "$build" "$build/fp8_emulation" "${2:-}"
