#!/usr/bin/env bash
# Builds the CUDA delta-rule GPU test and benchmark as standalone binaries into build-cuda-delta/
# (development loop: compile here, run on the GPU machine with carry=["build-cuda-delta"]).
# Compiles only the delta-rule CUDA sources plus the core files the public API needs; links the
# CPU delta-rule reference when it compiles, else a stub that throws (the GPU test has its own
# float64 reference and does not need it).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=build-cuda-delta
mkdir -p "$OUT/obj"
NVCC_FLAGS=(-std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo
            -Xptxas=-warn-spills -Iinclude -Isrc -Itests/cpp)
CXX_FLAGS=(-std=c++20 -O2 -Iinclude -Isrc -I/usr/local/cuda/include)
objs=()
build_cu() { local o="$OUT/obj/$(echo "$1" | tr / _).o"; nvcc "${NVCC_FLAGS[@]}" -c "$1" -o "$o"; objs+=("$o"); }
build_cpp() { local o="$OUT/obj/$(echo "$1" | tr / _).o"; g++ "${CXX_FLAGS[@]}" -c "$1" -o "$o"; objs+=("$o"); }

pids=()
for f in src/cuda/delta_rule/*.cu src/cuda/common/device_memory.cu; do
  o="$OUT/obj/$(echo "$f" | tr / _).o"; objs+=("$o")
  if [[ ! -f "$o" || "$f" -nt "$o" || -n "$(find src/cuda/delta_rule -name '*.cuh' -newer "$o")" ]]; then
    nvcc "${NVCC_FLAGS[@]}" -c "$f" -o "$o" & pids+=($!)
    if (( ${#pids[@]} >= 2 )); then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
  fi
done
for p in "${pids[@]}"; do wait "$p"; done
for f in src/core/delta_rule_api.cpp src/core/delta_rule_validation.cpp src/core/checks.cpp \
         src/core/tensor.cpp src/core/status.cpp src/core/parallel.cpp; do build_cpp "$f"; done
ref_ok=1
refobjs=()
for f in src/reference/delta_rule/*.cpp; do
  o="$OUT/obj/$(echo "$f" | tr / _).o"
  if g++ "${CXX_FLAGS[@]}" -c "$f" -o "$o" 2>/dev/null; then refobjs+=("$o"); else ref_ok=0; fi
done
if (( ref_ok == 0 || ${#refobjs[@]} == 0 )); then
  echo "note: CPU delta-rule reference does not build yet; linking the stub"
  build_cpp tools/dev/delta_rule_reference_stub.cpp
else
  objs+=("${refobjs[@]}")
fi
build_cu tests/cpp/delta_rule_gpu_test.cu
test_obj="${objs[-1]}"; unset 'objs[-1]'
nvcc -gencode=arch=compute_90a,code=sm_90a -o "$OUT/delta_rule_gpu_test" "$test_obj" "${objs[@]}" \
  /usr/lib/x86_64-linux-gnu/libgtest.a /usr/lib/x86_64-linux-gnu/libgtest_main.a -lpthread
if [[ -f bench/delta_rule/delta_rule_bench.cu ]]; then
  build_cu bench/delta_rule/delta_rule_bench.cu
  bench_obj="${objs[-1]}"; unset 'objs[-1]'
  nvcc -gencode=arch=compute_90a,code=sm_90a -o "$OUT/delta_rule_bench" "$bench_obj" "${objs[@]}" -lpthread
fi
echo "built: $(ls "$OUT" | grep -v obj | tr '\n' ' ')"
