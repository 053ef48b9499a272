#!/usr/bin/env bash
# Builds the benchmark with a different register-prefetch depth (an experiment, not a product
# setting): tools/dev/delta_rule_build_variant.sh 8  ->  build-cuda-delta/bench_prefetch8
set -euo pipefail
cd "$(dirname "$0")/../.."
D=$1
OUT=build-cuda-delta/variant$D
mkdir -p "$OUT"
F=(-std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Iinclude -Isrc
   -DFLASHGRAD_DELTA_RULE_PREFETCH="$D")
objs=()
for f in src/cuda/delta_rule/delta_rule_cuda.cu src/cuda/delta_rule/recurrent_instances_bf16.cu; do
  o="$OUT/$(basename "$f").o"; nvcc "${F[@]}" -c "$f" -o "$o" & objs+=("$o")
done
wait
# The other dtypes are not benchmarked: link stub-free by reusing the default objects for them.
for f in build-cuda-delta/obj/*.o; do
  case "$f" in *delta_rule_cuda.cu.o|*recurrent_instances_bf16.cu.o|*delta_rule_gpu_test*) ;; *) objs+=("$f");; esac
done
nvcc -gencode=arch=compute_90a,code=sm_90a -o build-cuda-delta/bench_prefetch$D "${objs[@]}" -lpthread
echo "built build-cuda-delta/bench_prefetch$D"
