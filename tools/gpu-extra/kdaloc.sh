#!/usr/bin/env bash
# kdaloc (issue 6: the chunked KDA backward's B2 local kernel, session 12, helper kdaloc:
# kda_grads_local_kernel, chunked_kda_grads_local.cuh; docs/perf/delta_rule.md "KDA B2 local kernel,
# session 12 (helper kdaloc)"). Runs on the H200 from the repo root after tools/gpu-check's build into
# build-gpu and the package install (cap 150 s, budget 138 s; logs in $OUT/extra/):
#   1. ncu of one launch of the current (default) local kernel at B4 T4096 H16 K=V=128 bf16, with the
#      source counters: stall samples per phase (kdaprep_ncu_source.py; the csv comes back gzipped);
#   2. ncu of the same launch with the memory tables and the shared / global wavefront counters
#      (bank conflicts per load and store kind), while time is left.
# Prints a compact summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh

echo "== kdaloc 1/2: ncu (source counters) of the default local kernel"
job_ncu kdaloc_ncu_local 50 'kda_grads_local_kernel' 1 - -- \
  --kind kda --B 4 --T 4096 --H 16 --K 128

echo "== kdaloc 2/2: ncu memory tables / wavefronts of the default local kernel"
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [ -n "$ncu_bin" ] && [ "$(left)" -gt 20 ]; then
  m='l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum'
  m="$m,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"
  m="$m,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_atom.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"
  m="$m,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__t_requests_pipe_lsu_mem_global_op_red.sum"
  m="$m,l1tex__t_sectors_pipe_lsu_mem_global_op_red.sum,l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"
  m="$m,smsp__inst_executed_op_shared_ld.sum,smsp__inst_executed_op_shared_st.sum,smsp__inst_executed_op_global_ld.sum"
  m="$m,l1tex__throughput.avg.pct_of_peak_sustained_active,lts__t_bytes.sum,dram__bytes.sum"
  env JOB_NCU_NO_VARIABLE=1 timeout -k 3 "$(cap 40)" "$ncu_bin" --clock-control none -k regex:kda_grads_local_kernel \
    --launch-skip 1 --launch-count 1 --section MemoryWorkloadAnalysis_Tables --metrics "$m" \
    python3 bench/profile_delta_rule.py --kind kda --B 4 --T 4096 --H 16 --K 128 --reps 1 --no-profiler \
    > "$OUT/extra/kdaloc_ncu_mem.txt" 2>&1
  echo "ncu mem rc=$?"
  grep -E "l1tex__|lts__|dram__|smsp__inst|Excessive|Wavefronts|Bank" "$OUT/extra/kdaloc_ncu_mem.txt" | cut -c1-170 | head -40
  summary+=("ncu mem: $(grep -cE 'l1tex__' "$OUT/extra/kdaloc_ncu_mem.txt") l1tex lines (kdaloc_ncu_mem.txt)")
else
  summary+=("ncu mem: skipped (no ncu or < 20 s left)")
fi

job_summary kdaloc
