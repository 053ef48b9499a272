#!/usr/bin/env bash
# Builds and runs the FP8 wgmma forward's host emulation (harness.cc).
# usage: run.sh [BUILD_DIR] [case-name filter | quick | early_test | int_max (the kEarlyTest / kIntMax cases)]
#   (the spec and exp_turn modes went with kSpecMax and kExpTurn, retired in session 20)
#   BUILD_DIR: a CPU (or CUDA) CMake build of flashgrad with libflashgrad.a (default build-fp8w/cpu)
# prepare_headers.py copies the kernel's headers with the PTX of the 16-bit / mma.sync headers
# replaced and the two Hopper primitive headers emptied (../emulation_common/ defines their functions).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../../../build-fp8w/cpu}
"$here/../emulation_common/build_and_run.sh" "$here" "$here/prepare_headers.py" "$build" "$build/fp8_wgmma_emulation" "${2:-}"
