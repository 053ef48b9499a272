#!/usr/bin/env bash
# fvstage (issue 6, lead, session 13): the states from v_new with h_c's stores staged per warp and
# written as whole 32-byte sectors (store_state_tiles_staged, chunked_stage_store.cuh): run 13.3's ncu
# put the kernel at 65% of L2 throughput with its 2-byte scattered stores (0.35 ms per pass at B1
# T32768, 0.41 at B8 T4096).
#   1. GPU tests of the kept path (C++ ChunkedKeptVNew* + past 2^31, pytest keep_v_new) and the chunked
#      GDN tests with the experiment switch (B1 / B2 reading the rebuilt states);
#   2. keepab.py (deltabench's configuration, kept off vs on, one process) and keep 0 / 1 with l2 norm
#      (variant_compare: per-kernel times);
#   3. compute-sanitizer of a small kept case.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
job_tests fvstage_tests 45 'DeltaRuleGpu.ChunkedKeptVNew*:DeltaRuleGpu.PastTwoToThe31Elements'
job_tests fvstage_tests_exp 30 'DeltaRuleChunked*:DeltaRuleGpu.Chunked*:-*Kda*:*KDA*' FLASHGRAD_CHUNKED_STATES_FROM_VNEW=1
timeout -k 3 "$(cap 30)" python3 -m pytest -q -m gpu tests/python/test_torch_delta_rule.py -k keep_v_new \
  -p no:cacheprovider > "$OUT/extra/fvstage_pytest.log" 2>&1
l="pytest -k keep_v_new rc=$?: $(tail -1 "$OUT/extra/fvstage_pytest.log")"; echo "$l"; summary+=("$l")
timeout -k 3 "$(cap 60)" python3 tools/gpu-extra/keepab.py > "$OUT/extra/fvstage_keepab.log" 2>&1
grep "^ROW" "$OUT/extra/fvstage_keepab.log"
while IFS= read -r l; do summary+=("${l#ROW }"); done < <(grep "^ROW" "$OUT/extra/fvstage_keepab.log")
job_compare fvstage_t32k 35 --kind gdn --shape 1,32768,16,128 --env FLASHGRAD_KEEP_V_NEW --variants recompute=0,kept=1 \
  --focus 'chunk_state' --reps 3,3,1 --note "(run 13.2: kept 4.388, recompute 4.579; states 0.347 x 2)"
job_compare fvstage_b8 30 --kind gdn --shape 8,4096,16,128 --env FLASHGRAD_KEEP_V_NEW --variants recompute=0,kept=1 \
  --focus 'chunk_state' --reps 3,3,1 --note "(run 13.2: kept 2.796, recompute 2.857; states 0.409)"
job_sanitize fvstage 25 'DeltaRuleGpu.ChunkedKeptVNewMatches' 'DeltaRuleGpu.ChunkedKeptVNewMatches'
job_summary fvstage
