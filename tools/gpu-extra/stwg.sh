#!/usr/bin/env bash
# stwg (issue 6, lead, session 16): the serial chains without k's row norms (stage 1 writes the state
# update's row scales, ChunkedArgs::colscale; FLASHGRAD_CHUNKED_COLSCALE=0 turns it off) and chunked
# stage 2 on wgmma (chunked_state_wgmma.cuh; opt-in, FLASHGRAD_CHUNKED_STATE_WGMMA=64 / 32 value columns
# per block), where the forward runs the unfused stage 2: few long sequences (B1 T32768 H16, the
# channel-split shape) and K = V = 64 (B8 T4096). ChunkedStateWgmma runs in gpu-check's suite.
#   1. per-kernel times and outputs / gradients against the first variant: colscale on / off, then
#      the wgmma stage 2 (with colscale);
#   2. compute-sanitizer racecheck / memcheck of the small kept cases with the wgmma stage 2;
#   3. stwg.py: the same in deltabench's configuration, one process;
#   4. ncu of the wgmma kernel at B1 T32768 (32 columns), if time is left.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
E=FLASHGRAD_CHUNKED_STATE_WGMMA
job_compare stwg_cs_t32k 30 --kind gdn --shape 1,32768,16,128 --env FLASHGRAD_CHUNKED_COLSCALE --variants on=-,off=0 \
  --focus 'chunk_state|prepare' --reps 5,3,1 --note "(run 16.3: stage 2 1.048, B1 1.534 ms)"
job_compare stwg_cs_k64 25 --kind gdn --shape 8,4096,16,64 --env FLASHGRAD_CHUNKED_COLSCALE --variants on=-,off=0 \
  --focus 'chunk_state|prepare' --reps 5,3,1 --note "(run 16.3: stage 2 0.161, B1 0.349 ms)"
job_compare stwg_t32k 30 --kind gdn --shape 1,32768,16,128 --env $E --variants default=-,wg32=32,wg64=64 \
  --focus 'chunk_state' --reps 5,3,1 --note "(run 16.3: default 1.048, wg32 1.010, wg64 1.628 ms)"
job_sanitize stwg 30 'DeltaRuleGpu.ChunkedKeptVNewMatches' 'DeltaRuleGpu.ChunkedKeptVNewMatches' $E=32
timeout -k 3 "$(cap 45)" python3 tools/gpu-extra/stwg.py > "$OUT/extra/stwg_ab.log" 2>&1
grep "^ROW" "$OUT/extra/stwg_ab.log"
while IFS= read -r l; do summary+=("${l#ROW }"); done < <(grep "^ROW" "$OUT/extra/stwg_ab.log")
JOB_NCU_SKIP=0 job_ncu stwg_ncu_t32k 40 'chunk_state_wgmma_kernel' 0 $E=32 -- --kind gdn --B 1 --T 32768 --H 16 --K 128
job_summary stwg
