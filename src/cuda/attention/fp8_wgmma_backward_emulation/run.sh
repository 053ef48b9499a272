#!/usr/bin/env bash
# Builds and runs the FP8 wgmma backward's host emulation (harness.cc).
# usage: run.sh [BUILD_DIR] [case-name filter | quick]
#   BUILD_DIR: a CPU (or CUDA) CMake build of flashgrad with libflashgrad.a (default build-fp8b/cpu)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
fp8b=$here/../../../../build-fp8b
# Own output folder, whichever build the library comes from.
"$here/../emulation_common/build_and_run.sh" "$here" "$here/prepare_headers.py" "${1:-$fp8b/cpu}" \
  "$fp8b/fp8_wgmma_backward_emulation" "${2:-}"
