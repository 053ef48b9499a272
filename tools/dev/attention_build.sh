#!/usr/bin/env bash
# Builds the CUDA attention test and benchmark binaries into build-cuda-attn/ without CMake, so they
# can be carried to the GPU machine and only executed there. Objects are rebuilt when their source
# (or any attention header) is newer. Usage: tools/dev/attention_build.sh [test|bench|all]
set -euo pipefail
cd "$(dirname "$0")/../.."
B=build-cuda-attn
mkdir -p $B/obj
NVCC_FLAGS="-std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo -Iinclude -Isrc -Itests/cpp"
CXX_FLAGS="-std=c++20 -O2 -Iinclude -Isrc -I/usr/local/cuda/include"
what=${1:-all}

# The delta-rule CUDA functions belong to another helper; link stubs so this build never depends
# on their work in progress.
cat > $B/delta_rule_stub.cpp <<'STUB'
#include "core/backends.h"
#include "flashgrad/status.h"
namespace flashgrad::cuda {
void delta_rule_forward(const DeltaRuleParams&, const DeltaRuleProblem&, const DeltaRuleForwardOutputs&, Workspace) { throw_unsupported("delta_rule_forward", "", "stub"); }
void delta_rule_backward(const DeltaRuleParams&, const DeltaRuleProblem&, const DeltaRuleBackwardInputs&, const DeltaRuleGrads&, Workspace) { throw_unsupported("delta_rule_backward", "", "stub"); }
std::size_t delta_rule_workspace_bytes(const DeltaRuleParams&, const DeltaRuleProblem&, Pass) { return 0; }
}
STUB

headers_newest=$(ls -t src/cuda/attention/*.cuh src/cuda/attention/*.h | head -1)
jobs=()
compile() {  # src obj compiler
  local src=$1 obj=$2
  if [[ ! -f $obj || $src -nt $obj || ( $src == *.cu && $headers_newest -nt $obj ) ]]; then
    jobs+=("$src $obj")
  fi
}
objs=()
for f in src/core/*.cpp src/reference/attention/*.cpp $B/delta_rule_stub.cpp src/cuda/attention/*.cpp; do
  [[ $f == src/core/cuda_absent.cpp ]] && continue
  o=$B/obj/$(echo "$f" | tr / _).o; compile "$f" "$o"; objs+=("$o")
done
for f in src/cuda/common/*.cu src/cuda/attention/*.cu; do
  o=$B/obj/$(echo "$f" | tr / _).o; compile "$f" "$o"; objs+=("$o")
done
printf '%s\n' "${jobs[@]:-}" | grep . | xargs -P2 -L1 bash -c '
  if [[ $0 == *.cu ]]; then nvcc '"$NVCC_FLAGS"' -Xptxas -warn-spills -c $0 -o $1; else g++ '"$CXX_FLAGS"' -c $0 -o $1; fi && echo "built $0"' || exit 1
ar rcs $B/libflashgrad_attn.a "${objs[@]}"

if [[ $what == test || $what == all ]]; then
  nvcc $NVCC_FLAGS tests/cpp/attention_gpu_test.cu $B/libflashgrad_attn.a -lgtest_main -lgtest -lpthread -o $B/attention_gpu_test
  echo "built $B/attention_gpu_test"
fi
if [[ $what == bench || $what == all ]] && [[ -f bench/attention/attention_bench.cu ]]; then
  nvcc $NVCC_FLAGS bench/attention/attention_bench.cu $B/libflashgrad_attn.a -lpthread -o $B/attention_bench
  echo "built $B/attention_bench"
fi
