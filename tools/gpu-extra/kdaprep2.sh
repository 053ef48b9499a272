#!/usr/bin/env bash
# kdaprep2 (issue 6: chunked KDA stage 1, kda_prepare_compact_kernel, session 13, helper kdaprep2;
# docs/perf/delta_rule.md "KDA stage 1, session 13 (helper kdaprep2)"). Runs on the H200 from the repo
# root after tools/gpu-check's build into build-gpu and the package install (budget 138 s; logs in
# $OUT/extra/). Run 13.1: the baseline profile of the default stage 1:
#   1. ncu of one launch of kda_prepare_compact_kernel at B4 T4096 H16 K=V=128 bf16 with the source
#      counters: stall samples and executed instructions per phase (kdaprep_ncu_source.py; the csv
#      comes back gzipped);
#   2. a second ncu of that launch for the pipes (tensor / fma / alu / xu / lsu instructions), the
#      shared-memory bank conflicts and the DRAM bytes (is any of them a bound?);
#   3. chunk KDA B4 T4096 H16 K=V=128 bf16 in one process: every kda_* kernel's CUDA time per call.
# Prints a compact summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh

echo "== kdaprep2 1/3: ncu (source counters) of the default stage 1"
job_ncu kdaprep2_ncu_default 55 'kda_prepare_compact_kernel' 1 - -- --kind kda --B 4 --T 4096 --H 16 --K 128

echo "== kdaprep2 2/3: ncu pipes / bank conflicts / DRAM of the default stage 1"
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [ -n "$ncu_bin" ] && [ "$(left)" -gt 40 ]; then
  m='smsp__inst_executed.sum,smsp__inst_executed_pipe_tensor.sum,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_xu.sum,smsp__inst_executed_pipe_lsu.sum,smsp__inst_executed_pipe_fp16.sum,smsp__inst_executed_pipe_uniform.sum,smsp__inst_executed_op_shared_ld.sum,smsp__inst_executed_op_shared_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed'
  timeout -k 3 "$(cap 35)" "$ncu_bin" --clock-control none -k 'regex:kda_prepare_compact_kernel' --launch-skip 1 \
    --launch-count 1 --metrics "$m" python3 bench/profile_delta_rule.py --kind kda --B 4 --T 4096 --H 16 --K 128 \
    --reps 1 --no-profiler > "$OUT/extra/kdaprep2_ncu_pipes.txt" 2>&1
  echo "ncu pipes rc=$?"
  grep -E "^ +(smsp|l1tex|dram|gpu|sm)__" "$OUT/extra/kdaprep2_ncu_pipes.txt" | sed -E 's/ +/ /g' | cut -c1-140
  summary+=("pipes: $(grep -E '^ +(smsp|l1tex|dram|gpu)__' "$OUT/extra/kdaprep2_ncu_pipes.txt" | awk '{ n = $1; sub(/\.sum$/, "", n); printf "%s %s; ", n, $NF }')")
else
  summary+=("ncu pipes: skipped")
fi

echo "== kdaprep2 3/3: chunk KDA B4 T4096 H16 K=V=128 bf16, per-kernel times (one process)"
job_compare kdaprep2_compare 40 --kind kda --shape 4,4096,16,128 --env FLASHGRAD_CHUNKED_KDA_PREPARE \
  --variants default=- --focus 'kda_prepare' --note "(stage 1 0.570 ms in run 7.4; fla KDA fwd 1.21 ms)"

job_summary kdaprep2
