#!/usr/bin/env bash
# kdaprep2 (issue 6: chunked KDA stage 1, kda_prepare_compact_kernel, session 13, helper kdaprep2;
# docs/perf/delta_rule.md "KDA stage 1, session 13 (helper kdaprep2)"). Runs on the H200 from the repo
# root after tools/gpu-check's build into build-gpu and the package install (budget 138 s; logs in
# $OUT/extra/). Opt-in stage-1 variants (FLASHGRAD_CHUNKED_KDA_PREPARE): =v2 G scaled by log2 e and
# decays by ex2.approx.ftz, the in-half pairs two units per pass; =v3 v2 + the off-diagonal channel
# loop unrolled by 2 + two v pieces loaded ahead.
#   1. chunk KDA B4 T4096 H16 K=V=128 bf16 in one process: the default stage 1, =v2 and =v3, every
#      kda_* kernel's CUDA time per call, the variants' output / gradients against the default's;
#   2. the DeltaRuleChunkedKda* GPU tests with =v3;
#   3. ncu of one launch of the =v3 stage 1 with the source counters: stall samples and executed
#      instructions per phase (kdaprep_ncu_source.py; the csv comes back gzipped);
#   4. the DeltaRuleChunkedKda* GPU tests with =v2;
#   5. if time is left: ncu of =v3 and the default for the pipes (tensor / fma / alu / xu / lsu
#      instructions), the shared-memory bank conflicts and the DRAM bytes.
# Prints a compact summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh

echo "== kdaprep2 1/5: chunk KDA B4 T4096 H16 K=V=128 bf16, default vs =v2 vs =v3 stage 1 (one process)"
job_compare kdaprep2_compare 55 --kind kda --shape 4,4096,16,128 --env FLASHGRAD_CHUNKED_KDA_PREPARE \
  --variants default=-,v2=v2,v3=v3 --focus 'kda_prepare' --note "(stage 1 0.570 ms in run 7.4; fla KDA fwd 1.21 ms)"

echo "== kdaprep2 2/5: DeltaRuleChunkedKda* GPU tests with FLASHGRAD_CHUNKED_KDA_PREPARE=v3"
job_tests kdaprep2_tests_v3 25 'DeltaRuleChunkedKda*' FLASHGRAD_CHUNKED_KDA_PREPARE=v3

echo "== kdaprep2 3/5: ncu (source counters) of the =v3 stage 1"
job_ncu kdaprep2_ncu_v3 40 'kda_prepare_compact_kernel' 1 FLASHGRAD_CHUNKED_KDA_PREPARE=v3 -- \
  --kind kda --B 4 --T 4096 --H 16 --K 128

echo "== kdaprep2 4/5: DeltaRuleChunkedKda* GPU tests with FLASHGRAD_CHUNKED_KDA_PREPARE=v2"
job_tests kdaprep2_tests_v2 20 'DeltaRuleChunkedKda*' FLASHGRAD_CHUNKED_KDA_PREPARE=v2

echo "== kdaprep2 5/5: ncu pipes / bank conflicts / DRAM of =v3 and the default stage 1, if time is left"
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
m='smsp__inst_executed.sum,smsp__inst_executed_pipe_tensor.sum,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_xu.sum,smsp__inst_executed_pipe_lsu.sum,smsp__inst_executed_pipe_fp16.sum,smsp__inst_executed_op_shared_ld.sum,smsp__inst_executed_op_shared_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum,smsp__issue_active.avg.pct_of_peak_sustained_active'
for mode in v3 default; do
  if [ -z "$ncu_bin" ] || [ "$(left)" -lt 20 ]; then summary+=("ncu pipes $mode: skipped"); continue; fi
  envspec=FLASHGRAD_CHUNKED_KDA_PREPARE=$mode; [ $mode = default ] && envspec=JOB_NCU_NO_VARIABLE=1
  rep="$OUT/extra/kdaprep2_ncu_pipes_$mode.txt"
  env "$envspec" timeout -k 3 "$(cap 25)" "$ncu_bin" --clock-control none -k 'regex:kda_prepare_compact_kernel' \
    --launch-skip 1 --launch-count 1 --metrics "$m" python3 bench/profile_delta_rule.py --kind kda --B 4 --T 4096 \
    --H 16 --K 128 --reps 1 --no-profiler > "$rep" 2>&1
  echo "ncu pipes $mode rc=$?"
  grep -E "^ +(smsp|l1tex|dram|gpu)__" "$rep" | sed -E 's/ +/ /g' | cut -c1-140
  summary+=("pipes $mode: $(grep -E '^ +(smsp|l1tex|dram|gpu)__' "$rep" | awk '{ n = $1; sub(/\.sum$/, "", n); printf "%s %s; ", n, $NF }')")
done

job_summary kdaprep2
